"""Snapshots through the CLI (in process and in the bounded child), the report, a run
folder's memory/ and the writer a recorder calls: exit codes, one-line errors, and the
same figures the analysis gives."""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from diagnostics.__main__ import main
from diagnostics.analyze import analyze
from diagnostics.runs import RunFolder
from diagnostics.snapshot.examples import MIB, training_snapshot
from diagnostics.snapshot.reader import read_snapshot
from diagnostics.snapshot.writer import write_snapshot

REPO_ROOT = Path(__file__).resolve().parents[3]


def _write(path: Path, raw, protocol=4) -> Path:
    path.write_bytes(pickle.dumps(raw, protocol=protocol))
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diagnostics", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_analyze_json_holds_the_snapshot_summary(tmp_path, capsys):
    raw = training_snapshot()
    path = _write(tmp_path / "snap.pickle", raw)
    assert main(["analyze", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["kind"] == "snapshot"
    memory = doc["summary"]["memory_snapshot"]
    assert memory["dump"]["reserved_bytes"] == sum(s["total_size"] for s in raw["segments"])
    assert memory["peak"]["allocated_bytes"] == doc["summary"]["peak_memory_bytes"] == 296 * MIB
    assert memory["growth"] is None
    assert {f["rule"] for f in doc["findings"]} == {"optimizer-state-dominates"}


def test_a_gzip_snapshot_in_the_bounded_child(tmp_path):
    raw = training_snapshot()
    path = tmp_path / "snap.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(raw, protocol=5)))
    done = _cli("analyze", str(path), "--timeout-s", "60")
    assert done.returncode == 0, done.stderr
    memory = json.loads(done.stdout)["summary"]["memory_snapshot"]
    assert memory["pickle_protocol"] == 5
    assert memory["peak"]["allocated_bytes"] == 296 * MIB


class _Marker:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('ran')",))


@pytest.mark.parametrize("isolated", [False, True])
def test_a_hostile_snapshot_is_exit_2_and_one_line(tmp_path, isolated):
    marker = tmp_path / "marker"
    path = _write(tmp_path / "evil.pickle", {"segments": [], "x": _Marker(marker)})
    done = _cli("analyze", str(path), *(["--timeout-s", "60"] if isolated else []))
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: refused")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"\x80\x04\x95", "truncated"), (pickle.dumps([1, 2], protocol=4), "blocks|segments")],
)
def test_bad_snapshots_are_one_line(tmp_path, capsys, content, problem):
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {path}: ")


def test_decompressed_cap_from_the_cli(tmp_path, capsys):
    raw = training_snapshot(steps=6)
    path = tmp_path / "snap.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(raw, protocol=4) + b"\x00" * (2 * MIB)))
    assert main(["analyze", str(path), "--max-decompressed-mb", "1"]) == 2
    assert "larger than the 1.0 MiB limit (decompressed)" in capsys.readouterr().err


def test_compare_two_snapshots_names_the_leaking_line(tmp_path, capsys):
    a = _write(tmp_path / "a.pickle", training_snapshot(steps=2, leak_bytes_per_step=8 * MIB))
    b = _write(tmp_path / "b.pickle", training_snapshot(steps=5, leak_bytes_per_step=8 * MIB))
    assert main(["analyze", str(a), "--compare", str(b)]) == 0
    doc = json.loads(capsys.readouterr().out)
    growth = doc["summary"]["memory_snapshot"]["growth"]
    assert growth["same_phase"] and growth["growth_bytes"] == 24 * MIB  # 3 steps x 8 MiB
    assert growth["sites"][0]["label"] == "train.py:52 in train_step"
    (leak,) = [f for f in doc["findings"] if f["rule"] == "memory-leak-by-site"]
    assert leak["evidence"]["path"] == "/job/train.py:52 in train_step"


def test_compare_refuses_a_trace(tmp_path, capsys):
    a = _write(tmp_path / "a.pickle", training_snapshot())
    (tmp_path / "t.json").write_text("{}")
    assert main(["analyze", str(a), "--compare", str(tmp_path / "t.json")]) == 2
    assert "takes two CUDA memory snapshots" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["html", "md", "json"])
def test_report_carries_the_memory_sections(tmp_path, fmt):
    a = _write(tmp_path / "a.pickle", training_snapshot(steps=2, leak_bytes_per_step=8 * MIB))
    b = _write(tmp_path / "b.pickle", training_snapshot(steps=5, leak_bytes_per_step=8 * MIB))
    out = tmp_path / f"report.{fmt}"
    assert main(["report", str(a), "--compare", str(b), "--format", fmt, "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    for needle in ("Allocation sites at the peak", "What held the peak", "Growth by site"):
        assert needle in text
    if fmt == "html":
        assert "Memory over the recorded window" in text and "Segments at dump time" in text


def _run_folder(tmp_path: Path) -> Path:
    """The smallest run folder the reader takes, with two snapshots in memory/."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_text(
        json.dumps({"version": 1, "run_id": "r", "config": {}, "environment": {"device": "cuda"}})
    )
    (folder / "status.json").write_text(json.dumps({"status": "completed"}))
    (folder / "steps.jsonl").write_text("")
    run = RunFolder(folder)
    for step, steps in ((100, 2), (200, 5)):
        write_snapshot(
            training_snapshot(steps=steps, leak_bytes_per_step=8 * MIB), run.snapshot_path(step)
        )
    return folder


def test_a_run_folder_with_memory_snapshots(tmp_path):
    folder = _run_folder(tmp_path)
    run = RunFolder(folder)
    assert [p.name for p in run.snapshot_files()] == [
        "step_00000100.pickle",
        "step_00000200.pickle",
    ]
    result = analyze(folder)
    assert result.snapshot is not None and result.snapshot_growth is not None
    assert result.snapshot.source.endswith("step_00000200.pickle")
    assert "memory-leak-by-site" in {f.rule for f in result.findings}


def test_the_writer_writes_protocol_4_the_reader_takes(tmp_path):
    raw = training_snapshot()
    path = write_snapshot(raw, tmp_path / "memory" / "step_00000001.pickle")
    assert path.read_bytes()[:2] == b"\x80\x04"
    assert read_snapshot(path).entries.height == len(raw["device_traces"][0])
    assert not list((tmp_path / "memory").glob("*.tmp"))


def test_compare_page_growth_between_two_runs_snapshots():
    from types import SimpleNamespace

    from diagnostics.rules.snapshot_evidence import snapshot_inputs
    from diagnostics.views.memory import snapshot_growth_between

    leak = 8 * MIB
    a = snapshot_inputs(training_snapshot(steps=2, leak_bytes_per_step=leak)).snapshot
    b = snapshot_inputs(training_snapshot(steps=4, leak_bytes_per_step=leak)).snapshot
    table, caption = snapshot_growth_between(
        SimpleNamespace(snapshot=a), SimpleNamespace(snapshot=b)
    )
    top = table.row(0, named=True)
    assert top["site"] == "train.py:52 in train_step" and top["B − A MiB"] == 16.0  # 2 x 8
    assert "the same phase" in caption
    assert (
        snapshot_growth_between(SimpleNamespace(snapshot=a), SimpleNamespace(snapshot=None)) is None
    )


def test_an_upload_of_a_trace_and_a_snapshot_gives_one_result_each(tmp_path):
    from diagnostics.upload_analysis import analyse_upload_files
    from tests.diagnostics.test_cli import SMALL_REAL

    snap = _write(tmp_path / "snap.pickle", training_snapshot())
    done = analyse_upload_files(
        [SMALL_REAL, snap],
        display_names=["trace.json.gz", "snap.pickle"],
        mode=None,
        store=tmp_path / "store",
    )
    labels = [r.label for r in done.results]
    assert labels == ["trace.json.gz", "snap.pickle"]
    trace_result, snap_result = (r.result for r in done.results)
    assert trace_result.snapshot is None and trace_result.facts is not None
    assert snap_result.snapshot.peak.allocated_bytes == 296 * MIB
    assert done.results[1].drilldowns == ()


def test_the_byte_cap_holds_for_two_snapshots_together(tmp_path):
    from diagnostics.snapshot import read_and_analyse_pair
    from diagnostics.trace.budget import BudgetExceeded

    a = _write(tmp_path / "a.pickle", training_snapshot())
    b = _write(tmp_path / "b.pickle", training_snapshot())
    size = a.stat().st_size
    read_and_analyse_pair([a, b], max_bytes=2 * size)  # both fit
    with pytest.raises(BudgetExceeded, match="larger than"):
        read_and_analyse_pair([a, b], max_bytes=2 * size - 1)
    with pytest.raises(BudgetExceeded, match="snapshots together"):
        read_and_analyse_pair([a, b], max_bytes=size)


def test_a_zip_of_two_snapshots_is_unpacked_and_compared(tmp_path):
    import zipfile

    from diagnostics.upload_analysis import analyse_upload_files

    archive = tmp_path / "memory.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name, steps in (("memory/step_2.pickle", 2), ("memory/step_5.pickle", 5)):
            raw = training_snapshot(steps=steps, leak_bytes_per_step=8 * MIB)
            zf.writestr(name, pickle.dumps(raw, protocol=4))
    done = analyse_upload_files(
        [archive], display_names=["memory.zip"], mode=None, store=tmp_path / "store"
    )
    (only,) = done.results
    assert only.result.snapshot_growth is not None
    assert "memory-leak-by-site" in {f.rule for f in only.result.findings}
