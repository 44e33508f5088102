"""memory-leak-by-site: one allocation site holds more in a later snapshot of the same
phase.

What it finds
    Two CUDA memory snapshots of one job (``--compare``, or a run folder's first and last
    ``memory/*.pickle``), both dumped in the same phase of the step: the allocation sites
    (first frame in user code) whose live bytes grew by more than a threshold, named with
    their line and stack. Snapshots of different phases, or without trace entries to tell
    the phase, are compared but not judged.

Why it matters
    At the same point of two steps a training loop holds the same tensors. A site that
    holds more each time keeps something alive across steps (a loss kept with its graph, a
    list of outputs, a cache), and the run ends out of memory. The run-level memory-leak
    rule sees the slope; this one names the line.

How to fix
    Keep plain numbers (``loss.item()``) or detached tensors across steps, clear caches
    and lists each step, and do not hold references to outputs that carry autograd graphs.
"""

from __future__ import annotations

from typing import Any, ClassVar

import polars as pl

from diagnostics.model import AnalysisInputs
from diagnostics.rules.base import Example, Finding, Fix, Rule, Severity
from diagnostics.rules.evidence import chart
from diagnostics.rules.snapshot_evidence import TWO_SNAPSHOTS, mib, snapshot_inputs, window
from diagnostics.snapshot import examples as snap
from diagnostics.thresholds import Thresholds

FIX_CODE = """\
# before: the loss tensor (and its graph) kept every step
losses.append(loss)

# after: keep the number
losses.append(loss.item())
"""


class MemoryLeakBySite(Rule):
    id = "memory-leak-by-site"
    title = "An allocation site grows between snapshots"
    severity = Severity.HIGH
    needs = (TWO_SNAPSHOTS,)
    threshold_names = ("snapshot_leak_min_bytes",)

    def not_applicable(self, inputs: AnalysisInputs) -> str | None:
        growth = inputs.snapshot_growth
        if growth is not None and not growth.same_phase:
            return (
                f"the snapshots were dumped in different or unknown phases "
                f"({growth.phase_before} and {growth.phase_after}): growth between them may "
                "be the phase's own"
            )
        return None

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        growth = inputs.snapshot_growth
        assert growth is not None and inputs.snapshot is not None
        grown = growth.sites.filter(
            (pl.col("growth_bytes") >= thresholds.snapshot_leak_min_bytes)
            & pl.col("user_code").fill_null(False)
        )
        findings = []
        for row in grown.head(3).iter_rows(named=True):
            evidence: dict[str, Any] = {
                "source": f"{growth.before} -> {growth.after}",
                **window(inputs.snapshot),
                "at": "dump time of each snapshot",
                "phase": growth.phase_after,
                "site": row["label"],
                "path": row["site"],
                "bytes_before": row["bytes_before"],
                "bytes_after": row["bytes_after"],
                "growth_bytes": row["growth_bytes"],
                "blocks_before": row["blocks_before"],
                "blocks_after": row["blocks_after"],
                "bytes_freed": row["growth_bytes"],
                "total_growth_bytes": growth.growth_bytes,
                "stack": "\n".join((row["stack"] or "").splitlines()[:8]),
                "threshold_bytes": thresholds.snapshot_leak_min_bytes,
                "chart": chart(
                    "bar",
                    f"{row['label']}: memory held at the dump of each snapshot",
                    "snapshot",
                    "held (MiB)",
                    [str(growth.before), str(growth.after)],
                    {
                        "held (MiB)": [
                            round(row["bytes_before"] / 2**20, 1),
                            round(row["bytes_after"] / 2**20, 1),
                        ]
                    },
                ),
            }
            findings.append(
                Finding(
                    rule=self.id,
                    severity=self.severity,
                    title=f"Leak suspect: {row['label']} grew by {mib(row['growth_bytes'])} "
                    "between snapshots",
                    evidence=evidence,
                    recommendation=(
                        f"{row['label']} held {mib(row['bytes_before'])} in {growth.before} "
                        f"and {mib(row['bytes_after'])} in {growth.after}, both dumped in the "
                        f"{growth.phase_after} phase ({row['blocks_before']} -> "
                        f"{row['blocks_after']} tensors). Freeing what it keeps across steps "
                        f"would return {mib(row['growth_bytes'])}."
                    ),
                    fix=Fix(code=FIX_CODE),
                )
            )
        return findings

    examples: ClassVar = (
        Example(
            "train.py:52 keeps 8 MiB a step: 2 steps, then 5",
            True,
            lambda: snapshot_inputs(
                snap.training_snapshot(steps=5, leak_bytes_per_step=8 * snap.MIB),
                before=snap.training_snapshot(steps=2, leak_bytes_per_step=8 * snap.MIB),
            ),
            expect=lambda f: (
                (
                    f.evidence["site"] == "train.py:52 in train_step"
                    and f.evidence["growth_bytes"] == 24 * snap.MIB
                )
                or _fail(f)
            ),
        ),
        Example(
            "the same job without the leak, 2 steps then 5",
            False,
            lambda: snapshot_inputs(
                snap.training_snapshot(steps=5), before=snap.training_snapshot(steps=2)
            ),
        ),
        Example(
            "dumped in different phases (after train.py:52, after the optimizer step)",
            False,
            lambda: snapshot_inputs(
                snap.training_snapshot(steps=5, leak_bytes_per_step=8 * snap.MIB),
                before=snap.training_snapshot(
                    steps=2, leak_bytes_per_step=8 * snap.MIB, adam=False
                ),
            ),
            skipped=True,
        ),
    )


def _fail(finding: Finding) -> bool:
    raise AssertionError(f"unexpected evidence: {finding.evidence}")
