"""The mismatched-upload check on real traces: what each file says about its job."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from diagnostics.errors import InputError
from diagnostics.trace.loader import load_trace_file
from diagnostics.upload_analysis import analyse_upload_files
from diagnostics.views.upload_set import (
    analyse_upload_set,
    check_names,
    identity,
    mismatches,
    release,
)

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
V100 = SHARED / "traces" / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
RANK0_OF_16 = SHARED / "traces" / "hta_a100_rank0_of_16.json.gz"
RANK3_OF_8 = SHARED / "traces" / "hta_a100_rank3_of_8.json.gz"
H200_RUNS = SHARED / "gpu-runs" / "h200-default"


def h200(run: str) -> Path:
    return next((H200_RUNS / run / "trace").glob("*.json.gz"))


def rows(*paths: Path) -> list[dict]:
    return [identity(p.name, load_trace_file(p)) for p in paths]


def uploads(*paths: Path) -> list[tuple[str, io.BytesIO]]:
    return [(p.name, io.BytesIO(p.read_bytes())) for p in paths]


def test_a_v100_and_an_h200_trace_differ_in_gpu_and_time():
    reasons = mismatches(rows(V100, h200("gpu-healthy")))
    assert reasons[0] == (
        "GPU models differ (kineto_resnet50_num_workers_0.pt.trace.json.gz: "
        f"Tesla V100-DGXS-32GB; {h200('gpu-healthy').name}: NVIDIA H200)"
    )
    # recorded in 2021 and 2026
    assert any(r.startswith("Recorded ") and "days apart" in r for r in reasons)


def test_ranks_of_jobs_with_different_world_sizes_differ():
    reasons = mismatches(rows(RANK0_OF_16, RANK3_OF_8))
    assert any(r.startswith("World sizes (distributedInfo) differ") for r in reasons)


def test_two_traces_of_one_machine_and_day_agree():
    assert mismatches(rows(h200("gpu-healthy"), h200("gpu-leak"))) == ()
    assert mismatches(rows(h200("gpu-healthy"))) == ()  # one file: nothing to compare


def test_identity_reads_the_metadata():
    row = rows(RANK3_OF_8)[0]
    assert (row["rank"], row["world_size"]) == (3, 8)
    assert row["gpu"] == "NVIDIA A100-PG509-200"
    assert row["recorded"].endswith(" UTC") and row["span_ms"] > 0


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("notes.txt", "unsupported file type (.txt)"),
        ("trace.json.zst", "unsupported file type (.json.zst)"),
        ("Makefile", "unsupported file type (no extension)"),
    ],
)
def test_unsupported_extensions_name_the_file_and_the_accepted_ones(name, problem):
    with pytest.raises(InputError) as info:
        check_names([name])
    assert str(info.value) == (
        f"{name}: {problem}: upload Chrome traces written by torch.profiler, as .json or "
        ".json.gz, or a .zip/.tar/.tar.gz/.tgz of them"
    )


def test_check_names_accepts_traces_and_archives_in_any_case():
    # archives of rank traces are unpacked, bounded, by diagnostics.views.archives (issue 10)
    check_names(["a.JSON", "b.json.GZ", "rank0.pt.trace.json.gz", "ranks.ZIP", "r.tar.gz"])


def test_mismatched_files_wait_for_an_answer_then_separate(tmp_path):
    files = uploads(V100, h200("gpu-healthy"))
    copies, steps = tmp_path / "copies", tmp_path / "steps"
    copies.mkdir()
    asked = analyse_upload_set(files, analyse_upload_files, temp_root=copies, store_root=steps)
    assert asked.needs_answer and asked.results == ()
    assert asked.identities["gpu"].to_list() == ["Tesla V100-DGXS-32GB", "NVIDIA H200"]
    assert list(copies.iterdir()) == []  # the private copy is gone
    assert list(steps.iterdir()) == []  # a question keeps no step folder

    separate = analyse_upload_set(
        files, analyse_upload_files, mode="separate", temp_root=copies, store_root=steps
    )
    assert [r.label for r in separate.results] == [V100.name, h200("gpu-healthy").name]
    for result in separate.results:
        assert result.result.source["kind"] == "trace"
        assert len(result.drilldowns) == 1
    assert list(copies.iterdir()) == []
    # one step folder, which release() removes when the session's upload is replaced
    assert [p.name for p in steps.iterdir()] == [Path(separate.store).name]
    assert separate.results[0].drilldowns[0].timeline(separate.results[0].drilldowns[0].step_ids[0])
    release(separate)
    assert list(steps.iterdir()) == []


def test_agreeing_files_are_analysed_as_ranks_at_once(tmp_path):
    files = uploads(h200("gpu-healthy"), h200("gpu-leak"))
    done = analyse_upload_set(files, analyse_upload_files, temp_root=tmp_path, store_root=tmp_path)
    assert not done.needs_answer and done.mode == "ranks"
    (only,) = done.results
    assert only.result.source["kind"] == "ranks" and len(only.result.source["ranks"]) == 2
    assert len(only.drilldowns) == 2


def test_drill_down_modules_import_neither_streamlit_nor_torch():
    import subprocess
    import sys

    code = (
        "import sys, diagnostics.drilldown, diagnostics.views.upload_set, "
        "diagnostics.report.drill_plots; print(sorted({'streamlit', 'torch'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.stdout.strip() == "[]"
