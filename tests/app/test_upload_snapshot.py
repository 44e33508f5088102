"""AppTest: a CUDA memory snapshot on the Upload page (through the bounded child, as every
upload), and two of one job compared. Snapshots are built as plain dicts in the schema
torch/cuda/memory.py documents (diagnostics.snapshot.examples): a real one needs CUDA."""

from __future__ import annotations

import pickle

import pytest

from app_ui.safe_text import shown
from diagnostics.snapshot.examples import MIB, training_snapshot
from tests.app.test_pages import open_page, texts


@pytest.fixture
def empty_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


def _upload(at, *files):
    at.file_uploader[0].set_value(
        [(name, pickle.dumps(raw, protocol=4), "application/octet-stream") for name, raw in files]
    )
    return at.run()


def test_a_snapshot_shows_its_memory_views(empty_env):
    at = _upload(open_page("pages/4_Upload_trace.py"), ("step_10.pickle", training_snapshot()))
    assert not at.exception, at.exception
    assert not at.error, [shown(e.value) for e in at.error]
    page = texts(at)
    assert "Memory snapshot" in page
    assert "Allocation sites at the peak" in page
    # the scenario's peak: 64 MiB parameters + 64 gradients + 128 Adam state + 32 saved
    # activations + one 8 MiB temporary = 296 MiB
    assert "296.0 MiB" in page
    sites = at.dataframe[0].value
    assert sites["site"].to_list()[0] == "train.py:44 in train_step"
    assert [t.label for t in at.tabs][:3] == ["Timeline", "Categories", "Segment map"]
    assert any(
        "Optimizer state is 43% of peak GPU memory (128.0 MiB)" in e.label for e in at.expander
    )


def test_two_snapshots_are_compared_by_site(empty_env):
    leak = 8 * MIB
    at = _upload(
        open_page("pages/4_Upload_trace.py"),
        ("step_2.pickle", training_snapshot(steps=2, leak_bytes_per_step=leak)),
        ("step_5.pickle", training_snapshot(steps=5, leak_bytes_per_step=leak)),
    )
    assert not at.exception, at.exception
    page = texts(at)
    assert "Growth by site" in page
    assert "train.py:52 in train_step" in page
    assert any(
        "Leak suspect" in e.label and "train.py:52" in e.label and "24.0 MiB" in e.label
        for e in at.expander
    )


def test_a_hostile_pickle_is_one_line_and_runs_nothing(empty_env, tmp_path):
    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('x')",))

    at = open_page("pages/4_Upload_trace.py")
    at.file_uploader[0].set_value(
        [("evil.pickle", pickle.dumps({"segments": [Hostile()]}, protocol=4), "x")]
    )
    at.run()
    assert not at.exception
    errors = [shown(e.value) for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("evil.pickle: refused: the pickle refers to")
    assert not marker.exists()


def test_run_detail_shows_a_run_folders_memory_snapshots(empty_env):
    from diagnostics.runs import RunFolder, RunWriter
    from diagnostics.snapshot.writer import write_snapshot

    writer = RunWriter.create(empty_env, {"scenario": "healthy"}, {"device": "cuda"}, run_id="mem")
    writer.finalise("completed")
    folder = RunFolder(empty_env / "mem")
    for step, steps in ((100, 2), (200, 5)):
        write_snapshot(
            training_snapshot(steps=steps, leak_bytes_per_step=8 * MIB), folder.snapshot_path(step)
        )
    at = open_page("pages/3_Run_detail.py", {"run": "mem"})
    assert not at.exception, at.exception
    page = texts(at)
    assert "Memory snapshot" in page and "Growth by site" in page
    assert "step_00000200.pickle" in page
    assert any("Leak suspect" in e.label and "train.py:52" in e.label for e in at.expander)
