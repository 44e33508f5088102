"""rank-stragglers: one rank's steps are slower than the others'.

What it finds
    With traces from several ranks of one job, a rank whose mean step time exceeds the
    ranks' median by more than a threshold, with every rank's step time and GPU busy share.

Why it matters
    In synchronous data-parallel training every all-reduce waits for the slowest rank, so
    one straggler sets the pace of the whole job and the other GPUs idle in NCCL kernels.

How to fix
    Look at what differs on the slow rank: uneven data shards or sequence lengths (sort or
    bucket by length, ``drop_last=True``), a slower or thermally throttled GPU, a noisy
    neighbour on its host, or extra work done on that rank (logging, evaluation,
    checkpointing on rank 0 only).
"""

from __future__ import annotations

from typing import Any, ClassVar

from diagnostics.model import AnalysisInputs
from diagnostics.rules import examples as ex
from diagnostics.rules.base import Example, Finding, Fix, Rule, Severity
from diagnostics.rules.evidence import chart, r
from diagnostics.thresholds import Thresholds

FIX_CODE = """\
# before: rank 0 does extra work inside the step, shards are uneven
if rank == 0:
    log_metrics(model, batch)          # every step
sampler = DistributedSampler(dataset, drop_last=False)

# after: extra work off the step's critical path, even shards
if rank == 0 and step % 100 == 0:
    log_metrics(model, batch)
sampler = DistributedSampler(dataset, drop_last=True)
"""


class RankStragglers(Rule):
    id = "rank-stragglers"
    title = "A rank is slower than the others"
    severity = Severity.MEDIUM
    needs = frozenset({"trace"})
    threshold_names = ("straggler_slowdown_pct",)

    def skip_reason(self, inputs: AnalysisInputs) -> str | None:
        ranks = inputs.trace.ranks if inputs.trace is not None else None
        if ranks is None or ranks.height < 2:
            return "needs traces of two or more ranks of one job"
        return None

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        import numpy as np

        assert inputs.trace is not None and inputs.trace.ranks is not None
        ranks = inputs.trace.ranks.sort("rank")
        means = np.asarray(ranks["step_time_ms_mean"].to_list(), dtype=float)
        median = float(np.nanmedian(means))
        if not np.isfinite(median) or median <= 0:
            return []
        slowdown = 100.0 * (means - median) / median
        slow = np.flatnonzero(slowdown > thresholds.straggler_slowdown_pct)
        if slow.size == 0:
            return []
        worst = int(np.nanargmax(means))
        rank_ids = ranks["rank"].to_list()
        # the others wait for the slowest: bringing it to the median saves that difference
        saving = 100.0 * (means[worst] - median) / means[worst]
        evidence: dict[str, Any] = {
            "source": "traces of several ranks: mean profiler step time per rank",
            "median_step_ms": r(median),
            "straggler_ranks": [int(rank_ids[i]) for i in slow],
            "slowest_rank": int(rank_ids[worst]),
            "slowest_step_ms": r(float(means[worst])),
            "slowdown_pct": r(float(slowdown[worst]), 1),
            "ranks": [
                {
                    "rank": row["rank"],
                    "steps": row["steps"],
                    "step_time_ms_mean": r(row["step_time_ms_mean"]),
                    "gpu_utilization_pct": r(row["gpu_utilization_pct"], 1),
                }
                for row in ranks.iter_rows(named=True)
            ],
            "steps": None,
            "chart": chart(
                "bar",
                "Mean step time per rank",
                "rank",
                "step time (ms)",
                rank_ids,
                {"step time (ms)": means.tolist()},
                highlight_x=[int(rank_ids[i]) for i in slow],
            ),
        }
        return [
            Finding(
                rule=self.id,
                severity=self.severity,
                title=f"Rank {rank_ids[worst]} steps {slowdown[worst]:.0f}% slower than the "
                "median rank",
                evidence=evidence,
                recommendation=(
                    f"Rank {rank_ids[worst]} takes {means[worst]:.1f} ms per step against a "
                    f"median of {median:.1f} ms; every other rank waits for it at each "
                    "all-reduce. Check its data shard, its GPU and host, and any rank-only work."
                ),
                fix=Fix(code=FIX_CODE, config_patch=None),
                estimated_saving_pct=r(saving, 1),
            )
        ]

    examples: ClassVar = (
        Example(
            "4 ranks, rank 2 takes 130 ms against 100 ms",
            True,
            lambda: ex.inputs(
                trace=ex.trace(
                    ranks={
                        "rank": [0, 1, 2, 3],
                        "steps": [5] * 4,
                        "step_time_ms_mean": [100.0, 101.0, 130.0, 99.0],
                        "step_time_ms_p50": [100.0, 101.0, 130.0, 99.0],
                        "gpu_utilization_pct": [80.0, 79.0, 61.0, 81.0],
                    }
                )
            ),
        ),
        Example(
            "4 ranks within 3% of each other",
            False,
            lambda: ex.inputs(
                trace=ex.trace(
                    ranks={
                        "rank": [0, 1, 2, 3],
                        "steps": [5] * 4,
                        "step_time_ms_mean": [100.0, 101.0, 103.0, 99.0],
                        "step_time_ms_p50": [100.0, 101.0, 103.0, 99.0],
                        "gpu_utilization_pct": [80.0] * 4,
                    }
                )
            ),
        ),
    )
