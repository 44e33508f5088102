"""analyze(): the result and its JSON summary on real traces, rank folders and run folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnostics.analyze import analyze, analyze_files, trace_run_steps
from diagnostics.errors import InputError
from diagnostics.result import BREAKDOWN_KEYS, IDLE_KEYS, SCHEMA, SUMMARY_KEYS
from diagnostics.runs import RunWriter
from tests.diagnostics.trace.helpers import (
    SHARED_TRACES,
    cpu_op,
    kernel,
    runtime,
    trace_doc,
    write_json,
)

GOLDEN = SHARED_TRACES / "kineto_resnet50_golden_overview.txt"
# torch-tb-profiler's names for the breakdown parts, in its order
GOLDEN_PARTS = {
    "Kernel": "kernel",
    "Memcpy": "memcpy",
    "Memset": "memset",
    "Runtime": "runtime",
    "DataLoader": "dataloader",
    "CPU Exec": "cpu_exec",
    "Other": "other",
}


def golden_overview(trace_name: str) -> dict:
    """The plugin's overview answer for a trace: lines 1-5 are num_workers_0's, 6-10 _4's."""
    lines = [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]
    overviews = [doc for doc in lines if "performance" in doc and "gpu_metrics" in doc]
    assert len(overviews) == 2
    return overviews[0 if "num_workers_0" in trace_name else 1]


def golden_numbers(trace_name: str) -> tuple[dict[str, float], float]:
    overview = golden_overview(trace_name)
    (average,) = overview["performance"]
    parts = {GOLDEN_PARTS[c["name"]]: float(c["extra"]) for c in average["children"]}
    metrics = {m["title"]: m["value"] for m in overview["gpu_metrics"]["data"]}
    utilization = float(metrics["GPU Utilization"].rstrip(" %"))
    return parts, utilization


def assert_summary_complete(doc: dict) -> None:
    assert doc["schema"] == SCHEMA
    assert set(SUMMARY_KEYS) <= set(doc["summary"])
    json.dumps(doc, allow_nan=False)  # strictly JSON: no NaN, no objects


@pytest.mark.parametrize(
    "name",
    ["kineto_resnet50_num_workers_0.pt.trace.json.gz", "kineto_resnet50_num_workers_4.pt.trace.json.gz"],
)  # fmt: skip
def test_breakdown_and_utilisation_agree_with_torch_tb_profiler_golden(name):
    result = analyze(SHARED_TRACES / name)
    parts, utilization = golden_numbers(name)
    summary = result.summary
    assert set(summary["breakdown_pct"]) == set(BREAKDOWN_KEYS)
    for key, expected in parts.items():
        assert summary["breakdown_pct"][key] == pytest.approx(expected, abs=1.0), key
    # torch-tb-profiler's utilisation counts kernels only: the facts keep that definition;
    # the summary's one utilisation is busy time (copies and memsets too) over the span
    gpu = result.facts.gpu
    assert gpu["utilization_pct"].mean() == pytest.approx(utilization, abs=1.0)
    busy_pct = 100 * gpu["busy_us"].sum() / gpu["span_us"].sum()
    assert summary["gpu_utilization_pct"] == pytest.approx(busy_pct)
    assert summary["gpu_utilization_pct"] >= gpu["utilization_pct"].mean()
    # the two named figures: kernel time as nvidia-smi and the plugin define it (the golden
    # overview's "GPU Utilization", 55.51 % and 70.27 %), and busy time with copies, memsets
    assert summary["gpu_kernel_utilization_pct"] == pytest.approx(utilization, abs=1.0)
    assert summary["gpu_busy_pct"] == pytest.approx(busy_pct)
    assert summary["gpu_busy_pct"] >= summary["gpu_kernel_utilization_pct"]
    assert summary["steps"] == 6 and summary["step_time_source"] == "trace"
    assert_summary_complete(result.to_json())


@pytest.mark.parametrize(
    "name",
    ["hta_a100_rank3_of_8.json.gz", "hta_a100_alexnet_with_syncs.json.gz"],
)
def test_real_modern_traces_give_a_complete_summary(name):
    result = analyze(SHARED_TRACES / name)
    doc = result.to_json()
    assert_summary_complete(doc)
    summary = doc["summary"]
    assert summary["device"] == "cuda"
    assert summary["steps"] >= 1 and summary["step_time_ms"]["p50"] > 0
    assert 0 < summary["gpu_utilization_pct"] <= 100
    assert sum(summary["breakdown_pct"].values()) == pytest.approx(100.0, abs=0.01)
    assert set(summary["gpu_idle_breakdown_pct"]) == set(IDLE_KEYS)
    assert doc["source"]["kind"] == "trace" and doc["source"]["files"] == [
        str(SHARED_TRACES / name)
    ]
    assert doc["environment"]["gpu_name"].startswith("NVIDIA A100")


def one_step_trace(step_us: float, kernel_us: float, rank: int) -> dict:
    """One ProfilerStep of step_us µs whose only GPU work is one kernel of kernel_us µs."""
    return trace_doc(
        [
            cpu_op("ProfilerStep#1", 0.0, step_us, cat="user_annotation"),
            cpu_op("aten::mm", 10.0, 20.0),
            runtime(12.0, 5.0),
            kernel(20.0, kernel_us),
        ],
        distributedInfo={"rank": rank, "world_size": 2},
        deviceProperties=[{"id": 0, "name": "Test GPU", "totalGlobalMem": 16 << 30}],
    )


def test_rank_folder_summary_comes_from_rank_0_with_a_rank_table(tmp_path):
    folder = tmp_path / "ranks"
    write_json(folder / "a.json", one_step_trace(1000.0, 500.0, rank=1))
    write_json(folder / "b.json", one_step_trace(2000.0, 500.0, rank=0))
    result = analyze(folder)
    doc = result.to_json()
    assert_summary_complete(doc)
    assert doc["source"]["kind"] == "ranks" and doc["source"]["ranks"] == [0, 1]
    summary = doc["summary"]
    # rank 0's one step lasts 2000 µs = 2.0 ms
    assert summary["step_time_ms"] == {"mean": 2.0, "p50": 2.0, "p95": 2.0}
    ranks = summary["ranks"]
    assert ranks["count"] == 2
    assert [row["rank"] for row in ranks["table"]] == [0, 1]
    assert [row["step_time_ms_mean"] for row in ranks["table"]] == [2.0, 1.0]
    # spread: (slowest 2.0 - fastest 1.0) / median 1.5 = 66.7 %
    assert ranks["spread"]["slowest_rank"] == 0
    assert ranks["spread"]["spread_pct"] == pytest.approx((2.0 - 1.0) / 1.5 * 100)
    assert result.facts is not None and result.facts.rank == 0
    assert [f.rank for f in result.rank_facts] == [0, 1]


def write_run(tmp_path: Path, step_times_ms: list[float], *, trace: dict | None) -> Path:
    writer = RunWriter.create(
        tmp_path / "runs",
        config={"scenario": "healthy", "device": "cuda", "data": {"num_workers": 2}},
        environment={"device": "cuda", "pytorch_version": "2.9.0", "gpu_name": "Test GPU"},
        run_id="run-a",
        total_steps=len(step_times_ms),
    )
    for step, ms in enumerate(step_times_ms, start=1):
        writer.append_step(
            {
                "step": step,
                "step_time_ms": ms,
                "data_wait_ms": ms / 4,
                "samples_per_s": 8 / (ms / 1000.0),
                "batch_size": 8,
                "cuda_peak_bytes": 1000 * step,
            }
        )
    if trace is not None:
        write_json(writer.path / "trace" / "host_1.1.pt.trace.json.gz", trace, gz=True)
    writer.finalise("completed")
    return writer.path


def test_run_folder_step_times_come_from_the_steady_step_records(tmp_path):
    step_times = [10.0, 20.0, 30.0, 40.0, 100.0]
    result = analyze(write_run(tmp_path, step_times, trace=one_step_trace(2000.0, 500.0, 0)))
    summary = result.summary
    assert result.source["kind"] == "run"
    assert summary["steps"] == 5 and summary["step_time_source"] == "run"
    # steady state leaves the first step (worker start-up) out: 20, 30, 40, 100
    assert summary["step_time_ms"]["mean"] == pytest.approx(190.0 / 4)
    assert summary["step_time_ms"]["p50"] == 35.0
    # linear p95 between the 3rd (40) and 4th (100) values: 40 + 0.85 * 60 = 91
    assert summary["step_time_ms"]["p95"] == pytest.approx(91.0)
    # data wait is a quarter of every step: 25 %
    assert summary["data_wait_pct"] == pytest.approx(25.0)
    assert summary["peak_memory_bytes"] == 5000
    # the trace still gives the breakdown: 500 µs of kernel in a 2000 µs step = 25 %
    assert summary["breakdown_pct"]["kernel"] == pytest.approx(25.0)
    assert summary["trace_steps"] == 1
    assert result.environment["pytorch_version"] == "2.9.0"
    assert_summary_complete(result.to_json())


def test_run_folder_without_a_trace_still_analyses(tmp_path):
    result = analyze(write_run(tmp_path, [10.0, 30.0], trace=None))
    doc = result.to_json()
    assert_summary_complete(doc)
    summary = doc["summary"]
    assert summary["steps"] == 2 and summary["step_time_ms"]["mean"] == 20.0
    for key in (
        "breakdown_pct",
        "gpu_utilization_pct",
        "gpu_kernel_utilization_pct",
        "gpu_busy_pct",
        "gpu_busy_us",
        "gpu_idle_breakdown_pct",
    ):
        assert summary[key] is None, key
    assert summary["device"] == "cuda"
    assert result.facts is None and result.run is not None


def test_real_instrumented_run_from_the_trainer(tiny_run):
    result = analyze(tiny_run)
    doc = result.to_json()
    assert_summary_complete(doc)
    assert doc["source"]["kind"] == "run"
    assert doc["summary"]["steps"] == result.run.steps.height > 0
    assert doc["summary"]["device"] == "cpu"
    assert doc["summary"]["gpu_utilization_pct"] is None  # a CPU run has no GPU
    assert result.facts is not None, "the tiny run is profiled: its trace must be read"
    assert doc["source"]["ranks"] == [0]
    # on one clock, the profiler's steps are exactly the records marked profiled
    profiled = result.run.steps.filter(pl.col("profiled"))["step"].to_list()
    assert [m["run_step"] for m in doc["summary"]["trace_run_steps"]] == profiled
    assert len(profiled) == result.facts.steps.height


def test_trace_steps_join_run_records_on_one_clock():
    # Kineto 2.2+: ts in µs since baseTimeNanoseconds. Base 1,700,000,000 s; trace steps
    # of 100 ms at ts 0, 100,000 and 200,000 µs end at 1,700,000,000.1 / .2 / .3 s.
    trace_steps = pl.DataFrame(
        {
            "step": [7, 8, 9],
            "dur_us": [100_000.0] * 3,
            "host_end_us": [100_000.0, 200_000.0, 300_000.0],
        }
    )
    # run records end 2 ms after each trace step (the record is written after the step)
    run_steps = pl.DataFrame(
        {
            "step": [11, 12, 13, 14],
            "wall_time": [1.7e9 + 0.002, 1.7e9 + 0.102, 1.7e9 + 0.202, 1.7e9 + 0.302],
        }
    )
    joined = trace_run_steps(trace_steps, run_steps, clock_offset_s=1.7e9)
    assert joined.select("trace_step", "run_step").rows() == [(7, 12), (8, 13), (9, 14)]
    # a second clock 10 s off matches nothing rather than the wrong steps
    assert trace_run_steps(trace_steps, run_steps, clock_offset_s=1.7e9 + 10).height == 0


def test_analyze_files_names_uploads_by_their_display_names(tmp_path):
    good = write_json(tmp_path / "tmp1", one_step_trace(1000.0, 100.0, rank=0))
    bad = tmp_path / "tmp2"
    bad.write_text("{not json")
    result = analyze_files([good], display_names=["mine.json"])
    assert result.source["files"] == ["mine.json"] and result.source["kind"] == "trace"
    with pytest.raises(InputError, match=r"^upload\.json: is not valid JSON"):
        analyze_files([good, bad], display_names=["mine.json", "upload.json"])


def test_result_json_is_strict_even_with_non_finite_numbers(tmp_path):
    result = analyze(write_run(tmp_path, [10.0, float("nan")], trace=None))
    text = json.dumps(result.to_json(), allow_nan=False)
    assert "NaN" not in text
    assert result.summary["step_time_ms"]["mean"] == 10.0


def test_events_table_of_the_primary_rank_reaches_the_rules(tmp_path):
    folder = tmp_path / "one"
    write_json(folder / "t.json", one_step_trace(1000.0, 100.0, rank=0))
    result = analyze(folder / "t.json")
    assert result.summary["events"] == 4
    assert isinstance(result.facts.steps, pl.DataFrame)


_names = st.sampled_from(
    [
        "ProfilerStep#1",
        "ProfilerStep#2",
        "aten::mm",
        "cudaLaunchKernel",
        "Memcpy HtoD (Pageable -> Device)",
        "Memcpy DtoH (Device -> Pinned)",
        "[memory]",
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        "cudaStreamSynchronize",
        "aten::item",
    ]
)
_categories = st.sampled_from(
    ["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "user_annotation", "Operator", "Kernel"]
    + ["Runtime", "Memcpy", "cuda_sync", "python_function", "unknown", None]
)
_args = st.fixed_dictionaries(
    {},
    optional={
        "device": st.sampled_from([0, 1]),
        "stream": st.sampled_from([7, 8]),
        "correlation": st.integers(0, 5),
        "External id": st.integers(0, 5),
        "bytes": st.integers(0, 10**9),
        "Total Allocated": st.integers(0, 10**9),
        "Device Type": st.sampled_from([0, 1]),
        "Device Id": st.sampled_from([-1, 0]),
    },
)
_plausible_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "i"]),
        "name": _names,
        "cat": _categories,
        "ts": st.floats(0, 1e4),
        "dur": st.floats(0, 1e3),
        "pid": st.sampled_from([0, 1, 100]),
        "tid": st.sampled_from([0, 7, 100]),
    },
    optional={"args": _args},
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_plausible_event, min_size=1, max_size=30))
def test_any_plausible_trace_analyses_to_strict_json_or_an_input_error(tmp_path_factory, events):
    # steps, copies, syncs, memory and DataLoader events in any mix and order: the facts
    # and rules must cope, and the result must stay strict JSON with every summary key
    path = tmp_path_factory.mktemp("plausible") / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    try:
        result = analyze(path)
    except InputError as exc:
        assert str(exc).startswith(f"{path}: ")
        return
    assert_summary_complete(result.to_json())


def test_analysing_a_real_trace_never_imports_numpy_or_the_snapshot_analysis():
    """numpy's import is about a tenth of a second, a tenth of what a bare json.load of the
    benchmark's trace takes (bench/bench_analyzer.py --quick): the analysis, every rule's
    check included, keeps it out. So with the memory-snapshot analysis (8 ms of imports),
    which a trace never needs although the rules' snapshot examples live beside it. A100
    rank 3 of 8 is the trace where the GEMM shape rules run their comparisons and
    slow-matmul-shape fires."""
    trace = SHARED_TRACES / "hta_a100_rank3_of_8.json.gz"
    code = (
        "import sys\n"
        "from diagnostics.analyze import analyze_files\n"
        f"result = analyze_files([{str(trace)!r}])\n"
        "print(sorted(f.rule for f in result.findings), 'numpy' in sys.modules,"
        " 'diagnostics.snapshot.analysis' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    fired, numpy_imported, snapshot_analysis_imported = done.stdout.strip().rsplit(" ", 2)
    assert "slow-matmul-shape" in fired
    assert numpy_imported == "False"
    assert snapshot_analysis_imported == "False"
