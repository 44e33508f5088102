"""The drill-down views of one rank's trace: Overview, Operators, Kernels, Memory,
Timeline, Export (what torch-tb-profiler's views showed), as pure polars tables.

``build_drilldown(trace)`` computes every table once from the loader's event table;
``DrillDown.timeline(step)`` and ``DrillDown.step_export(step)`` work on one step when asked,
from the trace in memory (run folders) or from its event table on disk (uploads:
``DrillDown.stored`` and diagnostics.drilldown.stored), reading only that step's window.
Figures are drawn by diagnostics.report.drill_plots; pages only lay them out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from diagnostics.drilldown.export import PERFETTO_STEPS, step_slice_json
from diagnostics.drilldown.kernels import kernel_view
from diagnostics.drilldown.memory import (
    allocator_curve,
    curve_peaks,
    top_allocations,
    trace_start_us,
)
from diagnostics.drilldown.operators import operator_view, search
from diagnostics.drilldown.overview import step_breakdown_table
from diagnostics.drilldown.stored import StoredTrace, store_trace, window
from diagnostics.drilldown.timeline import Timeline, step_timeline, step_window
from diagnostics.facts.breakdown import step_breakdown
from diagnostics.facts.device import identify_device
from diagnostics.facts.linking import build_index
from diagnostics.facts.memory import memory_curve
from diagnostics.facts.peaks import device_peak
from diagnostics.facts.roofline import operator_roofline
from diagnostics.facts.steps import find_steps
from diagnostics.trace.loader import LoadedInput, load
from diagnostics.trace.schema import LoadedTrace

__all__ = [
    "PERFETTO_STEPS",
    "DrillDown",
    "StoredTrace",
    "Timeline",
    "build_drilldown",
    "drilldowns_of",
    "load_drilldowns",
    "search",
]


@dataclass(frozen=True)
class DrillDown:
    label: str  # "rank 3 · file.json.gz": which trace this is
    trace: LoadedTrace | StoredTrace  # in memory, or on disk and read one step at a time
    steps: pl.DataFrame  # step, start_us, end_us, dur_us, host_start_us, host_end_us
    breakdown: pl.DataFrame  # facts.breakdown per step (for the per-step bars)
    overview: pl.DataFrame  # category, mean_ms, pct
    operators: pl.DataFrame  # operators.OPERATOR_VIEW_SCHEMA, by operator
    operators_by_shape: pl.DataFrame  # the same, by operator and input shapes
    kernels: pl.DataFrame  # kernels.KERNEL_VIEW_SCHEMA
    memory_curve: pl.DataFrame  # memory.CURVE_SCHEMA (downsampled, peaks kept)
    memory_peaks: pl.DataFrame  # device, time_ms, allocated_mib
    allocations: pl.DataFrame  # memory.ALLOCATION_SCHEMA, largest first

    @property
    def has_shapes(self) -> bool:
        return bool(self.operators_by_shape.height) and bool(
            (self.operators_by_shape["input_shapes"] != "").any()
        )

    @property
    def step_ids(self) -> list[int]:
        # a step whose number is unknown (ProfilerStep#abc) cannot be asked for by number
        return [int(s) for s in self.steps["step"].to_list() if s is not None]

    def _step(self, step: int) -> tuple[LoadedTrace, float, float]:
        start_us, end_us = step_window(self.steps, step)
        return window(self.trace, start_us, end_us, self.label), start_us, end_us

    def timeline(self, step: int) -> Timeline:
        part, _, _ = self._step(step)
        return step_timeline(part.events, self.steps, step, thread_names=part.metadata.thread_names)

    def step_export(self, step: int) -> bytes:
        part, start_us, end_us = self._step(step)
        return step_slice_json(part, start_us, end_us)

    def stored(self, folder: Path, stem: str) -> DrillDown:
        """This drill-down with its event table written under ``folder`` (see
        diagnostics.drilldown.stored): what an upload's drill-down keeps in the server."""
        if isinstance(self.trace, StoredTrace):
            return self
        return replace(self, trace=store_trace(self.trace, folder, stem))


def build_drilldown(trace: LoadedTrace, label: str | None = None) -> DrillDown:
    """Every drill-down table of one rank's trace."""
    events = trace.events
    index = build_index(events)
    steps = find_steps(events, index)
    breakdown = step_breakdown(events, steps, index)
    start_us = trace_start_us(events)
    curve = allocator_curve(memory_curve(events), start_us)
    name = os.path.basename(trace.metadata.path)
    kernel_names = index.gpu.filter(pl.col("cat") == "kernel")["name"].unique().to_list()
    peak = device_peak(
        identify_device(trace.metadata.device_properties, trace.metadata.extra, kernel_names)
    )
    roofline = operator_roofline(index, peak)
    return DrillDown(
        label=label or f"rank {trace.rank} · {name}",
        trace=trace,
        steps=steps.frame.select(
            "step", "start_us", "end_us", "dur_us", "host_start_us", "host_end_us"
        ),
        breakdown=breakdown,
        overview=step_breakdown_table(breakdown),
        operators=operator_view(index, "operator", peak, roofline),
        operators_by_shape=operator_view(index, "operator+shape", peak, roofline),
        kernels=kernel_view(index, peak, roofline),
        memory_curve=curve,
        memory_peaks=curve_peaks(curve),
        allocations=top_allocations(events, index, start_us),
    )


def drilldowns_of(loaded: LoadedInput) -> tuple[DrillDown, ...]:
    """One DrillDown per rank of a loaded input (empty for a run without a trace)."""
    return tuple(build_drilldown(trace) for trace in loaded.traces)


def load_drilldowns(path: str | os.PathLike[str]) -> tuple[DrillDown, ...]:
    """A trace file, folder of ranks or run folder -> one DrillDown per rank."""
    return drilldowns_of(load(path))
