"""rank-stragglers: the cause is named only when one part explains most of the excess, and
late-arriving collectives find a straggler whose step times look even (real rank files)."""

from __future__ import annotations

import gzip
from pathlib import Path

import msgspec
import polars as pl
import pytest

from diagnostics.analyze import analyze, analyze_loaded
from diagnostics.rules.rank_stragglers import RankStragglers, _ranks, name_cause
from diagnostics.thresholds import Thresholds
from diagnostics.trace.loader import LoadedInput, load_trace_files

RULE = RankStragglers()


def _check(inputs):
    assert RULE.skip_reason(inputs) is None
    return RULE.check(inputs, Thresholds())


@pytest.mark.parametrize(
    ("column", "cause"),
    [
        ("data_wait_ms_per_step", "data wait"),
        ("memcpy_ms_per_step", "host-to-device"),
        ("compute_ms_per_step", "compute"),
    ],
)
def test_cause_named_when_one_part_explains_the_excess(column: str, cause: str) -> None:
    # rank 2 is 30 ms slower; 27 ms of it (90% >= 80%) in one part
    parts = {
        c: [5.0] * 4 for c in ("data_wait_ms_per_step", "memcpy_ms_per_step", "compute_ms_per_step")
    }
    parts[column] = [5.0, 5.0, 32.0, 5.0]
    (finding,) = _check(_ranks(step_time_ms_mean=[100.0, 100.0, 130.0, 100.0], **parts))
    assert finding.evidence["slowest_rank"] == 2
    assert finding.evidence["cause"] == cause
    assert finding.evidence["cause_excess_ms_per_step"][cause] == pytest.approx(27.0)
    assert cause in finding.title


def test_no_cause_when_the_excess_is_spread() -> None:
    # 30 ms slower: 15 ms data, 15 ms compute; neither reaches 80% of 30 ms
    (finding,) = _check(
        _ranks(
            step_time_ms_mean=[100.0, 100.0, 130.0, 100.0],
            data_wait_ms_per_step=[5.0, 5.0, 20.0, 5.0],
            compute_ms_per_step=[60.0, 60.0, 75.0, 60.0],
            memcpy_ms_per_step=[1.0] * 4,
        )
    )
    assert finding.evidence["cause"] is None
    assert "No single part" in finding.recommendation


def test_name_cause_boundary_is_the_threshold() -> None:
    ranks = _ranks(
        step_time_ms_mean=[100.0, 110.0],
        data_wait_ms_per_step=[0.0, 8.0],
    ).trace.ranks
    assert name_cause(ranks, 1, 10.0, 80.0)[0] == "data_wait_ms_per_step"  # 8 of 10 = 80%
    assert name_cause(ranks, 1, 10.01, 80.0)[0] is None


def _write_ranks(source: Path, folder: Path, ranks: int, late_rank: int, delay_us: float) -> None:
    """Copies of one real NCCL rank trace as ``ranks`` ranks; ``late_rank`` starts every
    event ``delay_us`` later (as if it reached each collective late)."""
    with gzip.open(source, "rb") as handle:
        doc = msgspec.json.decode(handle.read())
    base = [e.get("ts") for e in doc["traceEvents"]]
    for rank in range(ranks):
        shift = delay_us if rank == late_rank else rank * 10.0
        for event, ts in zip(doc["traceEvents"], base, strict=True):
            if isinstance(ts, int | float):
                event["ts"] = ts + shift
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": ranks}
        with gzip.open(folder / f"rank{rank}.json.gz", "wb", compresslevel=1) as out:
            out.write(msgspec.json.encode(doc))


def test_late_rank_found_on_real_rank_files_in_parallel(
    shared_traces_dir: Path, tmp_path: Path
) -> None:
    # four ranks of the A100 job, rank 1 reaching every collective 3 ms late: the step times
    # are identical (the same trace), but the other ranks wait inside each collective
    _write_ranks(shared_traces_dir / "hta_a100_rank3_of_8.json.gz", tmp_path, 4, 1, 3000.0)
    result = analyze(tmp_path)  # 4 files: the process pool's path
    finding = next(f for f in result.findings if f.rule == "rank-stragglers")
    assert finding.evidence["slowest_rank"] == 1
    assert finding.evidence["late_share_pct"] == 100.0
    assert finding.evidence["slowdown_pct"] == pytest.approx(0.0)  # even step times
    # identical ranks: no part of the step differs, so no cause is named
    assert finding.evidence["cause"] is None
    ranks = result.summary["comm_ranks"]
    assert ranks["matched_collectives"] == 60
    assert ranks["skew_us_max"] == pytest.approx(3000.0 - 0.0)
    # the sequential loader gives the same per-rank table as the pool
    files = sorted(tmp_path.glob("*.json.gz"))
    traces, notes = load_trace_files(files)
    sequential = analyze_loaded(
        LoadedInput(kind="ranks", path=str(tmp_path), traces=traces, files=tuple(map(str, files)))
    )
    assert result.source["ranks"] == sequential.source["ranks"] == [0, 1, 2, 3]
    pool_table = pl.DataFrame(result.summary["ranks"]["table"])
    assert pool_table.equals(pl.DataFrame(sequential.summary["ranks"]["table"]))
    assert result.summary["comm_ranks"] == sequential.summary["comm_ranks"]
    assert result.summary["events"] == sequential.summary["events"]
