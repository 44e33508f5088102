"""Cross-rank matching keyed by process group where PyTorch recorded one
(diagnostics.facts.comm_ranks): two groups running the same kernel in one step, issued in a
different order on two ranks, are paired by group, not by start order."""

from __future__ import annotations

import polars as pl
import pytest

from diagnostics.facts.comm_ranks import match_collectives
from diagnostics.facts.comms import COLLECTIVE_SCHEMA

KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _table(rows: list[tuple[str | None, int, float, float]]) -> pl.DataFrame:
    """(process group, ordinal, start, end) rows of one step's all-reduces."""
    return pl.DataFrame(
        {
            "step": [7] * len(rows),
            "name": [KERNEL] * len(rows),
            "ordinal": [o for _, o, _, _ in rows],
            "start_us": [s for _, _, s, _ in rows],
            "end_us": [e for _, _, _, e in rows],
            "family": ["nccl"] * len(rows),
            "collective_name": ["allreduce"] * len(rows),
            "in_msg_nelems": [1024] * len(rows),
            "process_group_name": [g for g, _, _, _ in rows],
            "process_group_ranks": [None] * len(rows),
        },
        schema=COLLECTIVE_SCHEMA,
    )


def test_collectives_are_paired_within_their_process_group() -> None:
    # rank 0 issues group "1" at 0 µs, then group "2" at 20 µs; rank 1 issues group "2" at
    # 5 µs and group "1" at 8 µs (another stream). Ordinals count within a group, so each
    # group's first all-reduce is ordinal 0 on both ranks.
    rank0 = _table([("1", 0, 0.0, 10.0), ("2", 0, 20.0, 30.0)])
    rank1 = _table([("2", 0, 5.0, 30.0), ("1", 0, 8.0, 10.0)])
    match = match_collectives({0: rank0, 1: rank1})
    assert match is not None
    by_group = {row["process_group_name"]: row for row in match.collectives.to_dicts()}
    # group "1": rank 0 at 0, rank 1 at 8 -> skew 8 µs, rank 1 last
    assert by_group["1"]["skew_us"] == pytest.approx(8.0) and by_group["1"]["last_rank"] == 1
    # group "2": rank 1 at 5, rank 0 at 20 -> skew 15 µs, rank 0 last
    assert by_group["2"]["skew_us"] == pytest.approx(15.0) and by_group["2"]["last_rank"] == 0


def test_without_process_groups_the_name_stands_in_as_before() -> None:
    # the same starts with no group recorded: paired in start order (0 with 5, 20 with 8),
    # the documented limit when a trace carries no Process Group Name
    rank0 = _table([(None, 0, 0.0, 10.0), (None, 1, 20.0, 30.0)])
    rank1 = _table([(None, 0, 5.0, 30.0), (None, 1, 8.0, 10.0)])
    match = match_collectives({0: rank0, 1: rank1})
    assert match is not None
    assert sorted(match.collectives["skew_us"].to_list()) == pytest.approx([5.0, 12.0])
