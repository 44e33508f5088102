"""optimizer-state-dominates: optimizer state is most of the memory at the peak.

What it finds
    In a CUDA memory snapshot with its trace, blocks live at the peak that the optimizer
    made and kept across its step (Adam's ``exp_avg``/``exp_avg_sq``, made in
    ``_init_group``) above a share of the peak. Categories are inferred from frames and
    phase (docs/MEMORY.md).

Why it matters
    fp32 Adam keeps 8 bytes per parameter, twice the weights: for a large model with
    small activations the optimizer, not the model or the batch, sets the peak.

How to fix
    An 8-bit optimizer (bitsandbytes ``Adam8bit``) keeps a quarter of the state; sharding
    the state across data-parallel ranks (ZeRO-1: ``ZeroRedundancyOptimizer`` or FSDP)
    keeps 1/N of it per rank. ``fused=True``/``foreach`` Adam does not shrink the state but
    avoids the per-parameter temporaries of the step.
"""

from __future__ import annotations

from typing import Any, ClassVar

from diagnostics.model import AnalysisInputs
from diagnostics.rules.base import Example, Finding, Fix, Rule, Severity
from diagnostics.rules.snapshot_evidence import (
    SNAPSHOT_HISTORY,
    category_at_peak,
    mib,
    site_rows,
    sites_chart,
    snapshot_inputs,
    window,
)
from diagnostics.snapshot import examples as snap
from diagnostics.thresholds import Thresholds

FIX_CODE = """\
# before
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

# after: 8-bit states (a quarter of the bytes), or shard them across ranks
import bitsandbytes as bnb
optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=3e-4)
# distributed: from torch.distributed.optim import ZeroRedundancyOptimizer
# optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=3e-4)
"""

# 8-bit states keep 1 byte of every 4 that fp32 states take
_EIGHT_BIT_FREES = 0.75


class OptimizerStateDominates(Rule):
    id = "optimizer-state-dominates"
    title = "Optimizer state dominates peak GPU memory"
    severity = Severity.LOW
    needs = (SNAPSHOT_HISTORY,)
    threshold_names = ("snapshot_optimizer_state_min_pct",)

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        snapshot = inputs.snapshot
        assert snapshot is not None and snapshot.peak is not None
        peak, state, share, sites = category_at_peak(snapshot, "optimizer_state")
        if share < thresholds.snapshot_optimizer_state_min_pct:
            return []
        freed = int(state * _EIGHT_BIT_FREES)
        evidence: dict[str, Any] = {
            "source": snapshot.source,
            **window(snapshot),
            "at": "the peak",
            "peak_allocated_bytes": peak,
            "peak_time_s": snapshot.peak.time_s,
            "optimizer_state_bytes": state,
            "optimizer_state_pct": round(share, 1),
            "parameter_bytes": snapshot.category_bytes("parameters"),
            "bytes_freed": freed,
            "bytes_freed_method": "8-bit states: 3/4 of the fp32 optimizer state live at the "
            "peak; sharding over N ranks frees (N-1)/N of it instead",
            "category_method": snapshot.category_method,
            "sites": site_rows(sites),
            "chart": sites_chart(
                "Largest allocation sites at the peak", sites, "held at the peak (MiB)"
            ),
            "threshold_pct": thresholds.snapshot_optimizer_state_min_pct,
        }
        return [
            Finding(
                rule=self.id,
                severity=self.severity,
                title=f"Optimizer state is {share:.0f}% of peak GPU memory ({mib(state)})",
                evidence=evidence,
                recommendation=(
                    f"At the peak ({mib(peak)}), {mib(state)} was optimizer state. An 8-bit "
                    f"optimizer would free about {mib(freed)}; sharding it across "
                    "data-parallel ranks (ZeRO-1, FSDP) frees (N-1)/N of it per rank. "
                    "fused=True or foreach Adam trims the step's temporaries, not the state."
                ),
                fix=Fix(code=FIX_CODE),
            )
        ]

    examples: ClassVar = (
        Example(
            "Adam on 64 MiB of parameters: 128 MiB of state at a 296 MiB peak",
            True,
            lambda: snapshot_inputs(snap.training_snapshot()),
            expect=lambda f: f.evidence["optimizer_state_bytes"] == 128 * snap.MIB or _fail(f),
        ),
        Example(
            "SGD: no optimizer state",
            False,
            lambda: snapshot_inputs(snap.training_snapshot(adam=False)),
        ),
        Example(
            "Adam, but 512 MiB of activations set the peak",
            False,
            lambda: snapshot_inputs(snap.training_snapshot(activation_bytes=512 * snap.MIB)),
        ),
    )


def _fail(finding: Finding) -> bool:
    raise AssertionError(f"unexpected evidence: {finding.evidence}")
