"""Communication facts (diagnostics.facts.comms) on real traces: two NCCL jobs from HTA's
test data, the same trace with NCCL's new kernel names, and a real 2-rank gloo run."""

from __future__ import annotations

import bisect
import socket
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from diagnostics.analyze import analyze
from diagnostics.facts.comm_ranks import match_collectives
from diagnostics.facts.comms import (
    CommKind,
    comm_facts,
    comm_kind,
    gpu_comm_split,
    overlap_of,
)
from diagnostics.facts.linking import build_index
from diagnostics.facts.steps import find_steps
from diagnostics.trace.loader import load

RANK3_OF_8 = "hta_a100_rank3_of_8.json.gz"
RANK0_OF_16 = "hta_a100_rank0_of_16.json.gz"


@pytest.mark.parametrize(
    ("name", "cat", "kind"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "kernel", CommKind.GPU_KERNEL),
        (
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            "kernel",
            CommKind.GPU_KERNEL,
        ),
        ("ncclDevKernel_Generic", "kernel", CommKind.GPU_KERNEL),
        ("c10d::allreduce_", "cpu_op", CommKind.HOST_OP),
        ("record_param_comms", "cpu_op", CommKind.HOST_OP),
        ("nccl:all_reduce", "user_annotation", CommKind.HOST_OP),
        ("gloo:all_reduce", "user_annotation", CommKind.HOST_OP),
        ("void at::native::vectorized_elementwise_kernel<4>", "kernel", None),
        ("aten::mm", "cpu_op", None),
        ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", None),
        # a host range named like a kernel is not a kernel, and the reverse
        ("ncclKernel_AllReduce", "cpu_op", None),
        ("c10d::allreduce_", "kernel", None),
    ],
)
def test_one_classifier_for_every_name(name: str, cat: str, kind: CommKind | None) -> None:
    assert comm_kind(name, cat) == kind


def _facts(events: pl.DataFrame):
    index = build_index(events)
    steps = find_steps(events, index)
    return index, steps, comm_facts(events, index, steps)


@pytest.fixture(scope="module")
def rank3(shared_traces_dir: Path) -> pl.DataFrame:
    return load(shared_traces_dir / RANK3_OF_8).traces[0].events


@pytest.fixture(scope="module")
def rank0(shared_traces_dir: Path) -> pl.DataFrame:
    return load(shared_traces_dir / RANK0_OF_16).traces[0].events


def _reference_overlap_us(gpu: pl.DataFrame) -> tuple[float, float]:
    """(union of NCCL kernels, part of it under a computation kernel), by plain Python
    interval arithmetic: an independent check of the vectorised sweep."""

    def merged(rows: list[tuple[float, float]]) -> list[tuple[float, float]]:
        out: list[list[float]] = []
        for start, end in sorted(rows):
            if out and start <= out[-1][1]:
                out[-1][1] = max(out[-1][1], end)
            else:
                out.append([start, end])
        return [(a, b) for a, b in out]

    kernels = gpu.filter(pl.col("cat") == "kernel")
    is_comm = kernels["name"].str.starts_with("nccl")
    comm = merged(list(zip(*kernels.filter(is_comm).select("start_us", "end_us"), strict=True)))
    comp = merged(list(zip(*kernels.filter(~is_comm).select("start_us", "end_us"), strict=True)))
    starts = [a for a, _ in comp]
    overlapped = 0.0
    for a, b in comm:
        i = max(bisect.bisect_right(starts, a) - 1, 0)
        while i < len(comp) and comp[i][0] < b:
            overlapped += max(0.0, min(b, comp[i][1]) - max(a, comp[i][0]))
            i += 1
    return sum(b - a for a, b in comm), overlapped


def test_rank3_of_8_overlap_and_exposed_time(rank3: pl.DataFrame) -> None:
    index, steps, facts = _facts(rank3)
    assert facts is not None and facts.source == "gpu_kernels"
    # 18 AllReduce + 42 SendRecv kernels, all on NCCL stream 21, one after another: their
    # union is the sum of their durations, 32,880 + 130,655 µs, and all lie in the steps.
    assert facts.collectives_count == 60
    assert facts.collective_us == pytest.approx(32_880 + 130_655)
    union, overlapped = _reference_overlap_us(index.gpu)
    assert facts.collective_us == pytest.approx(union)
    assert facts.overlapped_us == pytest.approx(overlapped)
    assert facts.overlapped_us == pytest.approx(75_614)
    assert facts.exposed_us == pytest.approx(163_535 - 75_614)
    assert facts.overlap_pct == pytest.approx(75_614 / 163_535 * 100)  # 46.24 %
    # six steps, ten collectives each; per-step exposure adds up to the total
    per_step = facts.per_step
    assert per_step.height == 6
    assert facts.collectives.group_by("step").len()["len"].to_list() == [10] * 6
    assert per_step["exposed_us"].sum() == pytest.approx(facts.exposed_us)
    assert facts.exposed_pct == pytest.approx(
        facts.exposed_us / per_step["dur_us"].sum() * 100
    )  # 18.9 % of the step time
    assert (per_step["exposed_us"] + per_step["overlapped_us"]).to_list() == pytest.approx(
        per_step["collective_us"].to_list()
    )


def test_rank0_of_16_communication_barely_overlaps(rank0: pl.DataFrame) -> None:
    index, _, facts = _facts(rank0)
    assert facts is not None
    # SendRecv kernels on three NCCL streams (36 + 22 + 22 = 80 kernels) lasting
    # 171,521 + 9,258 + 9,566 = 190,345 µs; streams ran at once for 2,475 µs of it, which
    # the union counts once: 187,870 µs.
    assert facts.collectives_count == 80
    union, overlapped = _reference_overlap_us(index.gpu)
    assert facts.collective_us == pytest.approx(union) == pytest.approx(190_345 - 2_475)
    assert facts.overlapped_us == pytest.approx(overlapped) == pytest.approx(2_553)
    assert facts.overlap_pct == pytest.approx(2_553 / 187_870 * 100)  # 1.36 %
    assert facts.exposed_us == pytest.approx(187_870 - 2_553)


# HTA 0.5.0's get_comm_comp_overlap on the same files (bench/bench_comm_hta.py prints them).
HTA_OVERLAP_PCT = {RANK3_OF_8: 47.03, RANK0_OF_16: 1.37}


@pytest.mark.parametrize("trace", [RANK3_OF_8, RANK0_OF_16])
def test_hta_window_reproduces_hta_figure(shared_traces_dir: Path, trace: str) -> None:
    """HTA keeps only GPU work launched before the last ProfilerStep starts (its Trace drops
    the last step unless include_last_profiler_step). On that window our sweep gives HTA's
    figure to its two decimals; the difference in our headline is that last step."""
    events = load(shared_traces_dir / trace).traces[0].events
    index, steps, _ = _facts(events)
    last_step_start = float(steps.frame["host_start_us"].max())
    window = index.gpu.filter(pl.col("rt_start_us") < last_step_start)
    comm, comp = gpu_comm_split(window)
    segments = overlap_of(comm, comp)
    total = (
        segments.filter(pl.col("state").is_in([1, 3]))
        .select((pl.col("end_us") - pl.col("start_us")).sum())
        .item()
    )
    both = (
        segments.filter(pl.col("state") == 3)
        .select((pl.col("end_us") - pl.col("start_us")).sum())
        .item()
    )
    assert round(both / total * 100, 2) == pytest.approx(HTA_OVERLAP_PCT[trace], abs=0.011)


def test_new_nccl_kernel_names_give_the_same_facts(rank3: pl.DataFrame) -> None:
    """NCCL 2.19 renamed ncclKernel_<Coll>_<Algo>_<Proto>_<Op>_<type> to
    ncclDevKernel_<Coll>_<Op>_<type>_<Algo>_<Proto>; the facts must not change."""
    renamed = rank3.with_columns(
        pl.col("name").str.replace(
            r"^ncclKernel_(\w+?)_(RING|TREE)_(LL|LL128|SIMPLE)_(\w+?)_(\w+)\(.*$",
            "ncclDevKernel_${1}_${4}_${5}_${2}_${3}(ncclDevComm*, unsigned long, ncclWork*)",
        )
    )
    assert renamed.filter(pl.col("name").str.starts_with("ncclDevKernel_")).height == 60
    assert renamed.filter(pl.col("name").str.starts_with("ncclKernel_")).height == 0
    old, new = _facts(rank3)[2], _facts(renamed)[2]
    assert new is not None and old is not None
    assert (new.collective_us, new.overlapped_us, new.collectives_count) == (
        old.collective_us,
        old.overlapped_us,
        old.collectives_count,
    )
    # and a name that is not NCCL's is not communication: the classifier is what finds them
    other = rank3.with_columns(pl.col("name").str.replace(r"^nccl", "xccl"))
    assert _facts(other)[2] is None


def test_matching_splits_wait_from_transfer(rank3: pl.DataFrame) -> None:
    """Three copies of one rank: rank 1 starts every collective 500 µs later, rank 2 one
    step's collectives 2 ms later. The others wait for the late rank; it waits for none."""
    table = _facts(rank3)[2].collectives  # type: ignore[union-attr]
    first_step = int(table["step"].min())
    late = table.with_columns(pl.col("start_us") + 500.0, pl.col("end_us") + 500.0)
    one_step = table.with_columns(
        pl.when(pl.col("step") == first_step)
        .then(pl.col("start_us") + 2000.0)
        .otherwise(pl.col("start_us")),
        pl.col("end_us") + pl.when(pl.col("step") == first_step).then(2000.0).otherwise(0.0),
    )
    match = match_collectives({0: table, 1: late, 2: one_step}, mean_step_us=77_500.0)
    assert match is not None
    assert match.collectives.height == 60 and set(match.collectives["ranks"]) == {3}
    skews = dict(
        match.collectives.group_by(pl.col("step") == first_step)
        .agg(pl.col("skew_us").max())
        .iter_rows()
    )
    assert skews == {True: pytest.approx(2000.0), False: pytest.approx(500.0)}
    per_rank = {r["rank"]: r for r in match.per_rank.to_dicts()}
    durations = (table["end_us"] - table["start_us"]).to_list()
    # rank 0 waits min(500 µs, its kernel) in each collective outside the first step
    later = (table["step"] != first_step).to_list()
    expected = sum(min(500.0, d) for d, is_later in zip(durations, later, strict=True) if is_later)
    expected += sum(
        min(2000.0, d) for d, is_later in zip(durations, later, strict=True) if not is_later
    )
    assert per_rank[0]["wait_us"] == pytest.approx(expected)
    assert per_rank[0]["wait_us"] + per_rank[0]["transfer_us"] == pytest.approx(sum(durations))
    # rank 1 is last everywhere but in the first step (where rank 2 is)
    significant = match.collectives.filter(pl.col("significant"))
    assert per_rank[1]["late_count"] == significant.filter(pl.col("step") != first_step).height
    assert per_rank[2]["late_count"] == significant.filter(pl.col("step") == first_step).height
    assert per_rank[0]["late_count"] == 0
    # ranks of different jobs share no step: nothing to match
    assert match_collectives({0: table, 1: table.with_columns(pl.col("step") + 10_000)}) is None


@pytest.fixture(scope="module")
def gloo_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gloo")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    job = Path(__file__).with_name("gloo_job.py")
    done = subprocess.run(
        [sys.executable, str(job), str(out), str(port)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_real_gloo_run_has_host_collectives(gloo_ranks: Path) -> None:
    result = analyze(gloo_ranks)
    summary = result.summary
    assert summary["comm_source"] == "host_ops"
    for facts in result.rank_facts:
        comms = facts.comms
        assert comms is not None
        names = comms.collectives.group_by("step", "name").len()
        # DDP with one gradient bucket: one all-reduce a step, issued by c10d on the loop's
        # thread and run by gloo on its worker thread
        for name in ("c10d::allreduce_", "gloo:all_reduce"):
            assert names.filter(pl.col("name") == name)["len"].to_list() == [1, 1, 1]
        # collective time = union of the host collective ranges, inside the steps' span
        events = load(gloo_ranks / f"rank{facts.rank}.json").traces[0].events
        lo, hi = float(facts.steps["start_us"].min()), float(facts.steps["end_us"].max())
        ranges = events.filter(
            pl.col("name").str.starts_with("c10d::") | pl.col("name").str.starts_with("gloo:")
        ).select(pl.col("ts"), (pl.col("ts") + pl.col("dur")).alias("end"))
        covered, last_end = 0.0, -1.0
        for start, end in sorted(ranges.iter_rows()):
            start, end = max(start, lo, last_end), min(end, hi)
            if end > start:
                covered += end - start
            last_end = max(last_end, end)
        assert comms.collective_us == pytest.approx(covered, rel=1e-6)
        assert 0 < comms.exposed_us <= comms.collective_us
    ranks = summary["comm_ranks"]
    assert ranks["matched_collectives"] >= 6  # 3 steps x (c10d call + gloo range)
    assert [r["rank"] for r in ranks["per_rank"]] == [0, 1]
