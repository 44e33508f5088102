"""memory-fragmentation: the caching allocator holds memory it cannot hand out whole.

What it finds
    In a CUDA memory snapshot, free blocks inside segments that also hold live tensors
    (split blocks) above a share of reserved memory, or an out-of-memory request smaller
    than the cached free memory in all yet larger than any one free block.

Why it matters
    A segment that holds one live tensor cannot be returned to CUDA, and its free pieces
    serve only requests that fit them: reserved memory climbs while allocated does not,
    and a large request fails with gigabytes "reserved but unallocated" (the hint in
    PyTorch's own out-of-memory message).

How to fix
    ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` lets a segment grow in place
    instead of leaving holes (set before CUDA starts); failing that, allocate the largest,
    longest-lived tensors first, or set ``max_split_size_mb`` so large blocks are not
    split.
"""

from __future__ import annotations

from typing import Any, ClassVar

from diagnostics.model import AnalysisInputs
from diagnostics.rules.base import Example, Finding, Fix, Rule, Severity
from diagnostics.rules.evidence import chart
from diagnostics.rules.snapshot_evidence import SNAPSHOT, mib, snapshot_inputs, window
from diagnostics.snapshot import examples as snap
from diagnostics.thresholds import Thresholds

FIX_CODE = """\
# before: the default allocator splits segments and keeps their free pieces
python train.py

# after: segments grow in place (set before the first CUDA call)
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py
# or, in the script, before torch touches CUDA:
import os
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
"""


class MemoryFragmentation(Rule):
    id = "memory-fragmentation"
    title = "Reserved GPU memory is fragmented"
    severity = Severity.MEDIUM
    needs = (SNAPSHOT,)
    threshold_names = ("snapshot_fragmentation_min_pct", "snapshot_fragmentation_min_bytes")

    def not_applicable(self, inputs: AnalysisInputs) -> str | None:
        snapshot = inputs.snapshot
        if snapshot is not None and snapshot.fragmentation.expandable_segments:
            return "the allocator already runs with expandable_segments:True"
        return None

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        snapshot = inputs.snapshot
        assert snapshot is not None
        frag = snapshot.fragmentation
        reserved = snapshot.dump.reserved_bytes
        share = 100.0 * frag.inactive_split_bytes / reserved if reserved else 0.0
        failed_in_pieces = bool(frag.request_would_fit_cached)
        heavy = (
            share >= thresholds.snapshot_fragmentation_min_pct
            and frag.inactive_split_bytes >= thresholds.snapshot_fragmentation_min_bytes
        )
        if not (heavy or failed_in_pieces):
            return []
        evidence: dict[str, Any] = {
            "source": snapshot.source,
            **window(snapshot),
            "reserved_bytes": reserved,
            "active_bytes": snapshot.dump.active_bytes,
            "cached_free_bytes": frag.cached_free_bytes,
            "inactive_split_blocks": frag.inactive_split_blocks,
            "inactive_split_bytes": frag.inactive_split_bytes,
            "inactive_split_pct": round(share, 1),
            "largest_free_block_bytes": frag.largest_free_block_bytes,
            "failed_request_bytes": frag.failed_request_bytes,
            # what expandable segments would give back: the split pieces become one range
            "bytes_freed": frag.inactive_split_bytes,
            "threshold_pct": thresholds.snapshot_fragmentation_min_pct,
            "chart": chart(
                "bar",
                "Reserved memory at the dump: in use, and cached free in split pieces",
                "state",
                "memory (MiB)",
                ["active", "cached free", "inactive split pieces", "largest free block"],
                {
                    "memory (MiB)": [
                        round((snapshot.dump.active_bytes or 0) / 2**20, 1),
                        None
                        if frag.cached_free_bytes is None
                        else round(frag.cached_free_bytes / 2**20, 1),
                        round((frag.inactive_split_bytes or 0) / 2**20, 1),
                        round((frag.largest_free_block_bytes or 0) / 2**20, 1),
                    ]
                },
            ),
        }
        if failed_in_pieces:
            detail = (
                f"A {mib(frag.failed_request_bytes)} request failed while "
                f"{mib(frag.cached_free_bytes)} sat cached and free, in pieces of at most "
                f"{mib(frag.largest_free_block_bytes)}."
            )
        else:
            detail = (
                f"{mib(frag.inactive_split_bytes)} ({share:.0f}% of the "
                f"{mib(reserved)} reserved) is free but split among "
                f"{frag.inactive_split_blocks} pieces inside segments that hold live tensors."
            )
        return [
            Finding(
                rule=self.id,
                severity=Severity.HIGH if failed_in_pieces else self.severity,
                title=f"{mib(frag.inactive_split_bytes)} of reserved GPU memory is free "
                "but fragmented",
                evidence=evidence,
                recommendation=detail
                + " Run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so segments "
                f"grow in place; that would make the {mib(frag.inactive_split_bytes)} usable.",
                fix=Fix(code=FIX_CODE),
            )
        ]

    examples: ClassVar = (
        Example(
            "400 MiB in 8 MiB holes of an 800 MiB segment",
            True,
            lambda: snapshot_inputs(snap.fragmented_snapshot()),
            expect=lambda f: f.evidence["inactive_split_bytes"] == 400 * snap.MIB or _fail(f),
        ),
        Example(
            "a 12 MiB request fails with 40 MiB cached in 4 MiB pieces",
            True,
            lambda: snapshot_inputs(
                snap.fragmented_snapshot(
                    tensors=20, tensor_bytes=4 * snap.MIB, oom_bytes=12 * snap.MIB
                )
            ),
            expect=lambda f: f.severity == Severity.HIGH or _fail(f),
        ),
        Example(
            "a healthy training snapshot", False, lambda: snapshot_inputs(snap.training_snapshot())
        ),
        Example(
            "fragmented, but expandable_segments is already on",
            False,
            lambda: snapshot_inputs(snap.fragmented_snapshot(expandable_segments=True)),
            skipped=True,
        ),
    )


def _fail(finding: Finding) -> bool:
    raise AssertionError(f"unexpected evidence: {finding.evidence}")
