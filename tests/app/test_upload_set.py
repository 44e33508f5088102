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


@pytest.fixture(scope="module")
def two_rank_traces(two_rank_runs) -> list[Path]:
    """Rank 0 and rank 1 of one real 2-process run of the trainer (torchrun, gloo on CPU):
    the shared traces hold no two ranks of one job."""
    run = two_rank_runs.healthy
    return [next((run / "trace").glob(f"{run.name}.rank{rank}.*.json.gz")) for rank in (0, 1)]


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


def test_two_single_process_runs_recorded_apart_are_not_ranks():
    healthy, leak = h200("gpu-healthy"), h200("gpu-leak")
    reasons = mismatches(rows(healthy, leak))
    # same GPU, no PyTorch version in either: only what says they are ranks is missing
    assert reasons[0] == (
        "None of the files carries distributedInfo (rank and world size): nothing says "
        "they are ranks of one job"
    )
    assert reasons[1].startswith("Recorded 78.8 s apart, where ranks of one job record at ")
    assert f"{healthy.name}: 2026-11-30 23:34:45 UTC for 0.1 s" in reasons[1]
    assert len(reasons) == 2
    assert mismatches(rows(healthy)) == ()  # one file: nothing to compare


def test_ranks_of_one_job_agree(two_rank_traces):
    found = rows(*two_rank_traces)
    assert [(r["rank"], r["world_size"]) for r in found] == [(0, 2), (1, 2)]
    assert mismatches(found) == ()


def test_a_rank_file_beside_one_without_distributed_info_is_asked_about(two_rank_traces):
    rank0, healthy = two_rank_traces[0], h200("gpu-healthy")
    reasons = mismatches(rows(rank0, healthy))
    assert (
        f"Only some files carry distributedInfo ({rank0.name}: rank 0 of 2; "
        f"{healthy.name}: no distributedInfo)"
    ) in reasons


def test_a_repeated_rank_is_asked_about(two_rank_traces):
    rank0 = two_rank_traces[0]
    assert mismatches(rows(rank0, rank0)) == (
        f"Rank 0 appears 2 times ({rank0.name}; {rank0.name})",
    )


def test_a_rank_beyond_its_world_size_is_asked_about(two_rank_traces):
    rank0, rank1 = rows(*two_rank_traces)
    # what a file from a 1-process job would say beside rank 1 of the 2-process one
    lone = {**rank0, "world_size": 1, "rank": 1, "file": "lone.json.gz"}
    reasons = mismatches([rank0, lone])
    assert "Ranks outside their world size (lone.json.gz: rank 1 of 1)" in reasons
    assert mismatches([rank0, rank1]) == ()


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
        ".json.gz, or a .zip/.tar/.tar.gz/.tgz of them, or CUDA memory snapshots (.pickle or "
        ".pickle.gz)"
    )


def test_check_names_accepts_traces_and_archives_in_any_case():
    # archives of rank traces are unpacked, bounded, by diagnostics.unpack.archives (issue 10)
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


def test_agreeing_files_are_analysed_as_ranks_at_once(tmp_path, two_rank_traces):
    files = uploads(*two_rank_traces)
    copies, steps = tmp_path / "copies", tmp_path / "steps"
    copies.mkdir()
    done = analyse_upload_set(files, analyse_upload_files, temp_root=copies, store_root=steps)
    assert not done.needs_answer and done.mode == "ranks" and done.mismatches == ()
    (only,) = done.results
    assert only.result.source["kind"] == "ranks" and len(only.result.source["ranks"]) == 2
    assert len(only.drilldowns) == 2
    assert list(copies.iterdir()) == []  # the uploaded copies are gone, the step folder kept
    release(done)
    assert list(steps.iterdir()) == []


def test_two_h200_single_process_traces_wait_for_an_answer(tmp_path):
    files = uploads(h200("gpu-healthy"), h200("gpu-leak"))
    asked = analyse_upload_set(
        files, analyse_upload_files, temp_root=tmp_path, store_root=tmp_path / "steps"
    )
    assert asked.needs_answer and asked.results == ()
    assert asked.identities["gpu"].to_list() == ["NVIDIA H200", "NVIDIA H200"]
    assert asked.identities["rank"].to_list() == [None, None]


def test_every_table_column_has_a_label_with_its_unit():
    from diagnostics.facts.ranks import RANKS_SCHEMA
    from diagnostics.views.upload_set import IDENTITY_LABELS, IDENTITY_SCHEMA, RANKS_LABELS

    assert list(IDENTITY_LABELS) == list(IDENTITY_SCHEMA)
    assert set(RANKS_LABELS) == set(RANKS_SCHEMA)
    for column, label in {**IDENTITY_LABELS, **RANKS_LABELS}.items():
        assert "_" not in label
        for unit, shown in (("_ms", "(ms)"), ("_pct", "(%)")):
            if unit in column:
                assert label.endswith(shown), (column, label)


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


@pytest.fixture(scope="module")
def four_rank_files(tmp_path_factory) -> list[Path]:
    from tests.diagnostics.trace.helpers import write_rank_copies

    return write_rank_copies(tmp_path_factory.mktemp("four"), [0, 1, 2, 3])


def _to_the_last_bits(value):
    # polars sums floats in parallel chunks: the same data may differ in the last bits
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True)
    if isinstance(value, dict):
        return {key: _to_the_last_bits(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_the_last_bits(item) for item in value]
    return value


def test_four_ranks_read_once_in_the_pool_give_the_analysis_of_the_files(tmp_path, four_rank_files):
    # the one-pass upload analyses the ranks from what the pool's workers sent back: the
    # same analysis as the files analysed on their own, and every drill-down stored
    from diagnostics.analyze import analyze_files

    names = [p.name for p in four_rank_files]
    upload = analyse_upload_files(four_rank_files, display_names=names, mode=None, store=tmp_path)
    (result,) = upload.results
    alone = analyze_files(four_rank_files, display_names=names)
    assert result.result.to_json() == _to_the_last_bits(alone.to_json())
    assert [d.label for d in result.drilldowns] == names
    assert all(d.steps.height and d.step_export(d.step_ids[0]) for d in result.drilldowns)


def test_four_files_one_without_a_rank_are_asked_about_then_numbered_by_the_loader(
    tmp_path, four_rank_files
):
    import gzip

    import msgspec

    with gzip.open(four_rank_files[3], "rb") as handle:
        doc = msgspec.json.decode(handle.read())
    del doc["distributedInfo"]
    unnamed = tmp_path / "copy.json.gz"
    unnamed.write_bytes(gzip.compress(msgspec.json.encode(doc), compresslevel=1))
    files = [*four_rank_files[:3], unnamed]
    names = [p.name for p in files]

    asked = analyse_upload_files(files, display_names=names, mode=None, store=tmp_path / "a")
    assert asked.needs_answer and asked.results == ()
    assert asked.identities["rank"].to_list() == [0, 1, 2, None]
    assert "Only some files carry distributedInfo" in asked.mismatches[0]

    as_ranks = analyse_upload_files(files, display_names=names, mode="ranks", store=tmp_path / "b")
    (result,) = as_ranks.results
    assert len(result.drilldowns) == 4
    # the pool cannot number a file without a rank: the sequential loader did, by file order
    assert sorted(result.result.source["ranks"]) == [0, 1, 2, 3]

    apart = analyse_upload_files(files, display_names=names, mode="separate", store=tmp_path / "c")
    assert [r.label for r in apart.results] == names
    assert all(len(r.drilldowns) == 1 for r in apart.results)


@pytest.mark.parametrize("n_files", [1, 2])
@pytest.mark.parametrize("mode", ["ranks", "separate"])
def test_fewer_files_than_the_pool_are_read_once_and_give_the_analysis_of_the_files(
    tmp_path, monkeypatch, four_rank_files, n_files, mode
):
    # below the pool's threshold each file is loaded once, here: its identity, drill-down
    # and analysis come from that one load, and the analysis is that of the files alone
    from diagnostics.analyze import analyze_files
    from diagnostics.trace import loader

    files = four_rank_files[:n_files]
    names = [p.name for p in files]
    decoded: list[str] = []
    decode = loader.decode_trace

    def counted(blocks, display, **options):
        decoded.append(display)
        return decode(blocks, display, **options)

    monkeypatch.setattr(loader, "decode_trace", counted)
    upload = analyse_upload_files(files, display_names=names, mode=mode, store=tmp_path)
    assert decoded == names
    monkeypatch.setattr(loader, "decode_trace", decode)

    if mode == "ranks":
        alone = [analyze_files(files, display_names=names)]
    else:
        alone = [analyze_files([p], display_names=[p.name]) for p in files]
    assert len(upload.results) == len(alone)
    for result, expected in zip(upload.results, alone, strict=True):
        assert result.result.to_json() == _to_the_last_bits(expected.to_json())
    drills = [d for result in upload.results for d in result.drilldowns]
    assert [d.label for d in drills] == names
    assert all(d.steps.height and d.step_export(d.step_ids[0]) for d in drills)
