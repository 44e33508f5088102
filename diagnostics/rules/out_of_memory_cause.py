"""out-of-memory-cause: the snapshot recorded an out-of-memory error; what caused it.

What it finds
    An ``oom`` trace entry in a CUDA memory snapshot (PyTorch dumps one from an OOM
    observer, or the trace keeps the failed request). It names the cause from the state
    at that moment: *fragmentation* when the request was smaller than the memory cached
    free yet larger than every free block; otherwise *held by* the allocation site that
    held the most bytes, with its line and stack, when it holds at least a threshold share
    of the allocated memory (else the largest sites are listed).

Why it matters
    "CUDA out of memory. Tried to allocate 2.00 GiB" says how much was asked, not who
    holds the rest. The snapshot knows: which line's tensors filled the device.

How to fix
    Fragmentation: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. Held by a site:
    free or shrink what that line keeps (``del`` it, ``.detach()`` what is accumulated, a
    smaller batch there), or checkpoint it if it is an activation. Spread over many sites
    (none above the threshold share): the largest are listed, and the batch is the lever.
"""

from __future__ import annotations

from typing import Any, ClassVar

from diagnostics.model import AnalysisInputs
from diagnostics.rules.base import Example, Finding, Fix, Rule, Severity
from diagnostics.rules.snapshot_evidence import (
    SNAPSHOT,
    mib,
    site_rows,
    sites_chart,
    snapshot_inputs,
    window,
)
from diagnostics.snapshot import examples as snap
from diagnostics.thresholds import Thresholds

FIX_CODE = """\
# before: a line that keeps tensors alive across steps
outputs.append(model(batch))

# after: keep what is needed, off the graph (or on the host)
outputs.append(model(batch).detach().cpu())
# fragmentation instead: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
"""


class OutOfMemoryCause(Rule):
    id = "out-of-memory-cause"
    title = "Out of GPU memory: the cause"
    severity = Severity.HIGH
    needs = (SNAPSHOT,)
    threshold_names = ("snapshot_oom_site_min_pct",)

    def not_applicable(self, inputs: AnalysisInputs) -> str | None:
        if inputs.snapshot is not None and inputs.snapshot.oom is None:
            return "the snapshot recorded no out-of-memory event"
        return None

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        snapshot = inputs.snapshot
        assert snapshot is not None and snapshot.oom is not None
        oom = snapshot.oom
        frag = snapshot.fragmentation
        in_pieces = bool(frag.request_would_fit_cached)
        top = oom.sites.row(0, named=True) if oom.sites.height else None
        if in_pieces:
            # the dump state: an out-of-memory snapshot is dumped at the error
            cached = (
                oom.cached_free_bytes
                if oom.cached_free_bytes is not None
                else (frag.cached_free_bytes)
            )
            cause, freed = "fragmentation", cached
            headline = (
                f"a {mib(oom.requested_bytes)} request failed with {mib(cached)} "
                "cached free in pieces too small for it"
            )
            advice = "Run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
        elif top is not None and 100.0 * top["bytes"] >= (
            thresholds.snapshot_oom_site_min_pct * oom.allocated_bytes
        ):
            cause, freed = "held_by_site", int(top["bytes"])
            headline = (
                f"{top['label']} held {mib(top['bytes'])} of the {mib(oom.allocated_bytes)} "
                f"allocated when a {mib(oom.requested_bytes)} request failed"
            )
            advice = (
                f"Free or shrink what {top['label']} keeps ({top['blocks']} tensors, "
                f"category {top['category']})."
            )
        elif top is not None:
            cause, freed = "many_sites", int(top["bytes"])
            listed = ", ".join(
                f"{row['label']} {mib(row['bytes'])}"
                for row in oom.sites.head(3).iter_rows(named=True)
            )
            headline = (
                f"a {mib(oom.requested_bytes)} request failed with {mib(oom.allocated_bytes)} "
                f"allocated across {oom.sites.height} sites, none holding "
                f"{thresholds.snapshot_oom_site_min_pct:.0f} %"
            )
            advice = f"The largest: {listed}. Lower the batch or checkpoint activations."
        else:
            cause, freed = "unknown", None
            headline = f"a {mib(oom.requested_bytes)} request failed"
            advice = "Record the snapshot with _record_memory_history to see what held memory."
        evidence: dict[str, Any] = {
            "source": snapshot.source,
            **window(snapshot),
            "at": "the out-of-memory event",
            "oom_time_s": oom.time_s,
            "cause": cause,
            "requested_bytes": oom.requested_bytes,
            "device_free_bytes": oom.device_free_bytes,
            "allocated_bytes": oom.allocated_bytes,
            "reserved_bytes": oom.reserved_bytes,
            "cached_free_bytes": oom.cached_free_bytes,
            "largest_free_block_bytes": frag.largest_free_block_bytes,
            "bytes_freed": freed,
            "sites": site_rows(oom.sites),
        }
        if oom.sites.height:
            evidence["chart"] = sites_chart(
                "What held memory at the out-of-memory error (by allocation site)",
                oom.sites,
                "held (MiB)",
            )
        return [
            Finding(
                rule=self.id,
                severity=self.severity,
                title=f"Out of memory: {headline}",
                evidence=evidence,
                recommendation=(
                    f"CUDA reported {mib(oom.device_free_bytes)} free; this process had "
                    f"{mib(oom.reserved_bytes)} reserved, {mib(oom.allocated_bytes)} of it in "
                    f"tensors. {advice}"
                ),
                fix=Fix(code=FIX_CODE),
            )
        ]

    examples: ClassVar = (
        Example(
            "40 tensors of 16 MiB from one line, then a 64 MiB request fails",
            True,
            lambda: snapshot_inputs(snap.site_oom_snapshot()),
            expect=lambda f: (
                (
                    f.evidence["cause"] == "held_by_site"
                    and f.evidence["sites"][0]["site"] == "train.py:88 in cache_outputs"
                    and f.evidence["bytes_freed"] == 640 * snap.MIB
                )
                or _fail(f)
            ),
        ),
        Example(
            "a 12 MiB request fails with 40 MiB cached in 4 MiB pieces",
            True,
            lambda: snapshot_inputs(
                snap.fragmented_snapshot(
                    tensors=20, tensor_bytes=4 * snap.MIB, oom_bytes=12 * snap.MIB
                )
            ),
            expect=lambda f: f.evidence["cause"] == "fragmentation" or _fail(f),
        ),
        Example(
            "no out-of-memory event",
            False,
            lambda: snapshot_inputs(snap.training_snapshot()),
            skipped=True,
        ),
    )


def _fail(finding: Finding) -> bool:
    raise AssertionError(f"unexpected evidence: {finding.evidence}")
