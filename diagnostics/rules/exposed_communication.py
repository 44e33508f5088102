"""exposed-communication: collectives the step waits for, not hidden behind compute.

What it finds
    A trace whose communication (communication kernels of any family on a GPU: NCCL/RCCL,
    symmetric memory, vLLM's custom all-reduce, DeepEP, NVSHMEM; gloo/c10d collectives on a CPU)
    runs without compute beside it for more than a threshold share of the profiled step
    time. With several ranks matched, the share of collective time spent waiting for a later
    rank is taken out first: that is a straggler's cost (rank-stragglers), which no overlap
    can hide; what is judged is the exposed transfer. It reports collective time, the share overlapped by compute (HTA's
    ``get_comm_comp_overlap``), the exposed time per step and, with several ranks, how much
    of the communication was waiting for a later rank rather than transferring. With one
    rank of a larger job it says that waiting cannot be told from transfer.

Why it matters
    DistributedDataParallel all-reduces gradient buckets while backward still runs; when the
    buckets are too large, too few, or the all-reduce is called synchronously after
    backward, the whole gradient synchronisation sits on the step's critical path and every
    GPU idles through it. Exposed communication is step time a faster network would buy
    back, and that better overlap buys back for free.

How to fix
    Let DDP overlap: keep the default bucket size or lower it (``bucket_cap_mb``) so the
    first buckets are sent while backward continues, use ``gradient_as_bucket_view=True``
    (no copy into the buckets) and ``static_graph=True`` when the graph does not change;
    never all-reduce gradients by hand after ``backward()``. Communicate less often with
    gradient accumulation under ``model.no_sync()``. If most of it is waiting for a later
    rank, fix that rank first (see rank-stragglers).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import polars as pl

from diagnostics.facts.comm_ranks import MATCHED_SCHEMA, RANK_COMM_SCHEMA, CollectiveMatch
from diagnostics.facts.comms import COLLECTIVE_SCHEMA, COMM_STEP_SCHEMA, CommFacts
from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules.base import TRACE, Example, Finding, Fix, Need, Rule, Severity
from diagnostics.rules.evidence import chart, config_value, r, step_range
from diagnostics.thresholds import Thresholds

# A reference-trainer run that all-reduced after backward (distributed.sync=after-backward,
# the exposed-communication scenario) is fixed by DDP's overlap; other runs get the code only.
OVERLAP_PATCH = {"distributed.sync": "overlap"}
FIX_CODE = """\
# before: gradients all-reduced by hand after backward (nothing overlaps), or one huge bucket
model = DDP(model, bucket_cap_mb=1024)
loss.backward()
for p in model.parameters():
    dist.all_reduce(p.grad)             # synchronous, after backward: fully exposed

# after: DDP's bucketed all-reduce overlaps backward; accumulate to communicate less often
model = DDP(model, bucket_cap_mb=25,    # default; smaller buckets start sending earlier
            gradient_as_bucket_view=True, static_graph=True)
for i, batch in enumerate(loader):
    sync = (i + 1) % accumulation_steps == 0
    with contextlib.nullcontext() if sync else model.no_sync():
        (model(batch).loss / accumulation_steps).backward()
    if sync:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
"""


def _families(comms: CommFacts) -> list[dict[str, Any]] | None:
    """Collectives and their time per communication family (facts.comm_families)."""
    if comms.families.height == 0:
        return None
    return [
        {
            "family": row["family"],
            "collectives": row["collectives"],
            "busy_us": r(row["busy_us"], 0),
        }
        for row in comms.families.iter_rows(named=True)
    ]


class ExposedCommunication(Rule):
    id = "exposed-communication"
    title = "Communication is not overlapped with compute"
    severity = Severity.MEDIUM
    needs = (
        TRACE,
        Need(
            "communication in the trace (communication kernels or collectives)",
            lambda inputs: inputs.trace is not None and inputs.trace.comms is not None,
            "the trace holds no communication (no communication kernels or collectives)",
        ),
        Need(
            "profiled steps to measure the communication against",
            lambda inputs: (
                inputs.trace is not None
                and inputs.trace.comms is not None
                and inputs.trace.comms.exposed_pct is not None
            ),
            "the trace has no profiled steps to measure communication against",
        ),
    )
    threshold_names = ("exposed_comm_min_pct",)

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        assert inputs.trace is not None and inputs.trace.comms is not None
        trace, comms = inputs.trace, inputs.trace.comms
        exposed_pct = float(comms.exposed_pct or 0.0)
        wait = self._waiting(inputs, trace.rank)
        # With ranks matched, the part of a collective spent waiting for a later rank is a
        # straggler's cost (rank-stragglers), which no overlap can hide: judge the rest.
        transfer_pct = exposed_pct * (1.0 - wait / 100.0) if wait is not None else exposed_pct
        if transfer_pct <= thresholds.exposed_comm_min_pct:
            return []
        per_step = comms.per_step
        steps = per_step["step"].to_list()
        evidence: dict[str, Any] = {
            "source": (
                "trace: communication kernels against computation kernels on the same GPU"
                if comms.source == "gpu_kernels"
                else "trace: host collectives against the training loop thread's operators"
            ),
            "rank": trace.rank,
            "collective_us": r(comms.collective_us, 0),
            "overlap_pct": r(comms.overlap_pct, 1),
            "exposed_us": r(comms.exposed_us, 0),
            "exposed_us_per_step": r(comms.exposed_us_per_step, 0),
            "exposed_pct": r(exposed_pct, 1),
            "threshold_pct": thresholds.exposed_comm_min_pct,
            "collectives": comms.collectives_count,
            "families": _families(comms),
            "comm_wait_pct": r(wait, 1) if wait is not None else None,
            "exposed_transfer_pct": r(transfer_pct, 1),
            "ranks": self._ranks(inputs),
            "steps": step_range(per_step["step"]),
            "chart": chart(
                "bar",
                "Communication per step",
                "step",
                "time (ms)",
                steps,
                {
                    "exposed (ms)": (per_step["exposed_us"] / 1000.0).round(3).to_list(),
                    "overlapped (ms)": (per_step["overlapped_us"] / 1000.0).round(3).to_list(),
                },
            ),
        }
        waiting = (
            f" Another {pct(exposed_pct - transfer_pct)} of step time was spent waiting for "
            "later ranks inside collectives: see rank-stragglers."
            if wait is not None and exposed_pct - transfer_pct >= 1.0
            else ""
        )
        world = (trace.distributed or {}).get("world_size")
        if wait is None and isinstance(world, int) and world > 1:
            # One rank of a larger job: a collective kernel runs from this rank's arrival
            # until the last member's, so its exposed time holds waiting for the others too.
            waiting = (
                f" This is one rank of {world}: the time its collectives spent waiting for "
                "later ranks cannot be told apart from transfer without the other ranks' "
                "traces, so part of the exposed time may be a straggler's cost; analyse "
                "the ranks' traces together to split it."
            )
        overlap = (
            f"only {pct(comms.overlap_pct)} of it overlapped compute"
            if comms.overlap_pct is not None
            else "overlap unknown"
        )
        return [
            Finding(
                rule=self.id,
                severity=Severity.HIGH
                if transfer_pct >= 2 * thresholds.exposed_comm_min_pct
                else Severity.MEDIUM,
                title=f"{pct(transfer_pct)} of step time is communication nothing overlaps",
                evidence=evidence,
                recommendation=(
                    f"Communication took {comms.collective_us / 1000:.1f} ms over "
                    f"{per_step.height} steps and {overlap}: "
                    f"{(comms.exposed_us_per_step or 0) / 1000:.1f} ms a step is exposed. "
                    "Let DDP overlap gradient buckets with backward (default bucket_cap_mb, "
                    "gradient_as_bucket_view, static_graph) and communicate less often with "
                    "no_sync() accumulation." + waiting
                ),
                fix=Fix(
                    code=FIX_CODE,
                    config_patch=OVERLAP_PATCH
                    if config_value(inputs.run, "distributed.sync") == "after-backward"
                    else None,
                ),
                # hiding all of the transfer behind compute saves at most its exposed share
                estimated_saving_pct=r(transfer_pct, 1),
            )
        ]

    @staticmethod
    def _waiting(inputs: AnalysisInputs, rank: int) -> float | None:
        match = inputs.collective_match
        if match is None:
            return None
        row = match.per_rank.filter(pl.col("rank") == rank)
        return float(row["wait_pct"][0]) if row.height and row["wait_pct"][0] is not None else None

    @staticmethod
    def _ranks(inputs: AnalysisInputs) -> list[dict[str, Any]] | None:
        ranks = inputs.trace.ranks if inputs.trace is not None else None
        if ranks is None or "exposed_comm_ms_per_step" not in ranks.columns:
            return None
        return [
            {
                "rank": row["rank"],
                "exposed_comm_ms_per_step": r(row["exposed_comm_ms_per_step"]),
                "comm_overlap_pct": r(row["comm_overlap_pct"], 1),
            }
            for row in ranks.iter_rows(named=True)
        ]

    examples: ClassVar = (
        Example(
            "all-reduce after backward: 30 ms of each 100 ms step exposed",
            True,
            lambda: _with_comms(collective_ms=30.0, overlapped_ms=0.0),
        ),
        Example(
            "DDP overlapping backward: 30 ms of communication, 27 ms of it under compute",
            False,
            lambda: _with_comms(collective_ms=30.0, overlapped_ms=27.0),
        ),
        Example(
            "a single-process trace without collectives",
            False,
            lambda: ex.inputs(trace=ex.trace()),
            skipped=True,
        ),
        Example(
            "2 ranks: 40 ms of each step in exposed collectives, but 90% of the collective "
            "time is waiting for a late rank (a straggler, not missing overlap)",
            False,
            lambda: _with_comms(collective_ms=40.0, overlapped_ms=0.0, wait_pct=90.0),
        ),
        Example(
            "2 ranks: 40 ms of each step in exposed collectives, 20% of it waiting for the "
            "other rank: the transfer is still exposed",
            True,
            lambda: _with_comms(collective_ms=40.0, overlapped_ms=0.0, wait_pct=20.0),
        ),
    )


def _with_comms(
    collective_ms: float, overlapped_ms: float, steps: int = 5, wait_pct: float | None = None
) -> AnalysisInputs:
    """A trace of ``steps`` 100 ms steps with the given communication per step; with
    ``wait_pct``, rank 0 of two matched ranks, waiting that share of its collective time."""
    step_us, coll, over = 100_000.0, collective_ms * 1000.0, overlapped_ms * 1000.0
    per_step = pl.DataFrame(
        {
            "step": list(range(1, steps + 1)),
            "dur_us": [step_us] * steps,
            "collective_us": [coll] * steps,
            "overlapped_us": [over] * steps,
            "exposed_us": [coll - over] * steps,
            "compute_us": [60_000.0] * steps,
            "exposed_pct": [(coll - over) / step_us * 100.0] * steps,
        },
        schema=COMM_STEP_SCHEMA,
    )
    comms = CommFacts(
        source="gpu_kernels",
        collectives_count=steps * 4,
        collective_us=coll * steps,
        overlapped_us=over * steps,
        exposed_us=(coll - over) * steps,
        overlap_pct=over / coll * 100.0,
        exposed_pct=(coll - over) / step_us * 100.0,
        exposed_us_per_step=coll - over,
        trace_collective_us=coll * steps,
        trace_overlap_pct=over / coll * 100.0,
        per_step=per_step,
        collectives=pl.DataFrame(schema=COLLECTIVE_SCHEMA),
    )
    trace = replace(ex.trace(steps=steps, step_us=step_us), comms=comms)
    if wait_pct is None:
        return ex.inputs(trace=trace)
    total = coll * steps
    per_rank = pl.DataFrame(
        {
            "rank": [0, 1],
            "matched": [steps * 4] * 2,
            "collective_us": [total, total * (1.0 - wait_pct / 100.0)],
            "wait_us": [total * wait_pct / 100.0, 0.0],
            "transfer_us": [total * (1.0 - wait_pct / 100.0)] * 2,
            "wait_pct": [wait_pct, 0.0],
            "late_count": [0, steps * 4],
            "late_share_pct": [0.0, 100.0],
            "caused_wait_share_pct": [0.0, 100.0],
        },
        schema=RANK_COMM_SCHEMA,
    )
    match = CollectiveMatch(
        collectives=pl.DataFrame(schema=MATCHED_SCHEMA),
        per_rank=per_rank,
        skew_us_p50=total * wait_pct / 100.0 / (steps * 4),
        skew_us_max=total * wait_pct / 100.0 / (steps * 4),
        significant=steps * 4,
    )
    return ex.inputs(trace=trace, collective_match=match)
