"""activations-dominate-peak: saved activations are most of the memory at the peak.

What it finds
    In a CUDA memory snapshot with its trace, the blocks live at the peak that were
    allocated in a module's forward and outlived the forward pass (tensors autograd saved
    for backward) above a share of the peak. The category is inferred from frames and
    phase (docs/MEMORY.md); what it cannot place counts as unknown, never as activations.

Why it matters
    Activations grow with the micro-batch and the sequence length, and they are the one
    part of training memory that can be recomputed instead of kept: at this share the
    peak is set by them, not by the model.

How to fix
    Checkpoint activations (``torch.utils.checkpoint`` around the blocks that save the
    most, or the framework's activation-checkpointing option), or run a smaller
    micro-batch with gradient accumulation to keep the effective batch.
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
def forward(self, x):
    for block in self.blocks:
        x = block(x)
    return x

# after: keep only each block's input; recompute the rest in backward
from torch.utils.checkpoint import checkpoint

def forward(self, x):
    for block in self.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return x
"""


class ActivationsDominatePeak(Rule):
    id = "activations-dominate-peak"
    title = "Activations dominate peak GPU memory"
    severity = Severity.MEDIUM
    needs = (SNAPSHOT_HISTORY,)
    threshold_names = ("snapshot_activations_min_pct",)

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        snapshot = inputs.snapshot
        assert snapshot is not None and snapshot.peak is not None
        peak, activations, share, sites = category_at_peak(snapshot, "activations")
        if share < thresholds.snapshot_activations_min_pct:
            return []
        evidence: dict[str, Any] = {
            "source": snapshot.source,
            **window(snapshot),
            "at": "the peak",
            "peak_allocated_bytes": peak,
            "peak_time_s": snapshot.peak.time_s,
            "activation_bytes": activations,
            "activation_pct": round(share, 1),
            "unknown_pct": round(100.0 * snapshot.category_bytes("unknown") / peak, 1)
            if peak
            else None,
            # checkpointing keeps a block's input and recomputes the rest: at most this
            "bytes_freed": activations,
            "bytes_freed_method": "upper bound: the activations live at the peak; "
            "checkpointing keeps each checkpointed block's inputs",
            "category_method": snapshot.category_method,
            "sites": site_rows(sites),
            "chart": sites_chart(
                "Largest allocation sites at the peak", sites, "held at the peak (MiB)"
            ),
            "threshold_pct": thresholds.snapshot_activations_min_pct,
        }
        top = sites.row(0, named=True)["label"] if sites.height else None
        where = f" The largest site is {top}." if top else ""
        return [
            Finding(
                rule=self.id,
                severity=self.severity,
                title=f"Activations are {share:.0f}% of peak GPU memory ({mib(activations)})",
                evidence=evidence,
                recommendation=(
                    f"At the peak ({mib(peak)}), {mib(activations)} were tensors saved in "
                    f"forward for backward.{where} Checkpoint activations "
                    "(torch.utils.checkpoint) to free up to that much, or halve the "
                    "micro-batch and accumulate gradients."
                ),
                fix=Fix(code=FIX_CODE),
            )
        ]

    examples: ClassVar = (
        Example(
            "256 MiB of activations over 16 MiB of parameters (SGD)",
            True,
            lambda: snapshot_inputs(
                snap.training_snapshot(
                    param_bytes=16 * snap.MIB, activation_bytes=256 * snap.MIB, adam=False
                )
            ),
            expect=lambda f: f.evidence["activation_bytes"] == 256 * snap.MIB or _fail(f),
        ),
        Example(
            "Adam on 64 MiB of parameters, 32 MiB of activations",
            False,
            lambda: snapshot_inputs(snap.training_snapshot()),
        ),
    )


def _fail(finding: Finding) -> bool:
    raise AssertionError(f"unexpected evidence: {finding.evidence}")
