"""Helpers the rules share to read their inputs and to shape evidence.

Every finding's ``evidence`` holds its numbers plus, under ``"chart"``, a
:class:`diagnostics.chart.Chart` built by :func:`chart` (the contract: ``docs/CHARTS.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import polars as pl

from diagnostics.chart import Chart, ChartKind
from diagnostics.dotted import dotted_get
from diagnostics.model import AnalysisInputs
from diagnostics.rules.stats import downsample
from diagnostics.sources import RunData, TraceFacts

# environment keys under which a run may record memory totals (bytes)
HOST_MEMORY_KEYS = ("memory_total_bytes", "host_memory_bytes", "total_memory_bytes", "ram_bytes")
GPU_MEMORY_KEYS = ("gpu_memory_bytes", "gpu_total_memory_bytes", "gpu_mem_total_bytes")


def step_range(steps: pl.Series) -> list[int] | None:
    """[first, last] step number for evidence; None when no step carries one (a trace whose
    steps are all named like ``ProfilerStep#abc``: their numbers are unknown, not 0)."""
    numbered = steps.drop_nulls()
    if numbered.len() == 0:
        return None
    return [int(numbered.min()), int(numbered.max())]  # type: ignore[arg-type]


def step_number(value: Any) -> int | None:
    """One step's number for evidence, None when unknown."""
    return None if value is None else int(value)


def first_positive_int(mapping: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = mapping.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return int(value)
    return None


def chart(
    kind: ChartKind,
    title: str,
    x_label: str,
    y_label: str,
    x: Sequence[Any],
    series: dict[str, Sequence[Any]],
    highlight_x: Sequence[Any] = (),
    max_points: int = 500,
) -> Chart:
    """A finding's chart, at most ``max_points`` per series (findings stay small in JSON),
    with numpy numbers made plain and NaN/inf as gaps; ChartError when the parts disagree.

    A point whose x is unknown (None: a step named ``ProfilerStep#abc``) has no place on
    the axis and is left out of the chart, its values with it; the finding's figures still
    count it."""
    x = list(x)
    if any(v is None for v in x) and all(len(values) == len(x) for values in series.values()):
        keep = [i for i, v in enumerate(x) if v is not None]
        x = [x[i] for i in keep]
        columns = {name: list(values) for name, values in series.items()}
        series = {name: [values[i] for i in keep] for name, values in columns.items()}
    return Chart(
        kind=kind,
        title=title,
        x_label=x_label,
        y_label=y_label,
        x=tuple(_plain(v) for v in downsample(x, max_points)),
        series={
            name: tuple(_plain(v) for v in downsample(list(values), max_points))
            for name, values in series.items()
        },
        highlight_x=tuple(_plain(v) for v in highlight_x if v is not None),
    )


def _plain(value: Any) -> Any:
    """JSON-safe scalars: numpy numbers become Python ones, NaN/inf become None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def r(value: float | None, digits: int = 2) -> float | None:
    """Rounded for evidence; None and non-finite stay None."""
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), digits)


def run_device(run: RunData) -> Literal["cuda", "cpu"] | None:
    """The device a run trained on: environment first, then config, then CUDA memory records."""
    for raw in (run.environment.get("device"), run.config.get("device")):
        if isinstance(raw, str) and raw != "auto":
            return "cuda" if raw.startswith("cuda") else "cpu"
    if has_steps(run, "cuda_allocated_bytes"):
        return "cuda"
    if run.steps.height:
        return "cpu"
    return None


def config_value(run: RunData | None, key: str, default: Any = None) -> Any:
    """A config value by its dotted key (flat "data.num_workers" or nested data -> num_workers)."""
    return default if run is None else dotted_get(run.config, key, default)


def config_count(run: RunData | None, key: str) -> int | None:
    """A config value that counts things (``data.num_workers``) as an int; None when absent
    or not a whole number of 0 or more (a hand-edited ``"many"`` is unknown, not a crash)."""
    value = config_value(run, key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not (math.isfinite(value) and value == int(value) and value >= 0):
        return None
    return int(value)


def has_steps(run: RunData | None, *columns: str) -> bool:
    """The run has step records with at least one non-null value in each column."""
    if run is None or run.steps.height == 0:
        return False
    return all(
        c in run.steps.columns and run.steps[c].null_count() < run.steps.height for c in columns
    )


def cuda_trace(inputs: AnalysisInputs) -> TraceFacts | None:
    trace = inputs.trace
    return trace if trace is not None and trace.device == "cuda" else None


def numeric(frame: pl.DataFrame, column: str) -> list[float]:
    """A column as floats with nulls as NaN (for the numpy statistics)."""
    return [float("nan") if v is None else float(v) for v in frame[column].to_list()]


def cpu_count(inputs: AnalysisInputs) -> int | None:
    """The CPUs the run could use, from its environment record (a bare trace has none)."""
    if inputs.run is not None:
        for key in ("cpu_count_usable", "usable_cpus", "cpu_count"):
            value = inputs.run.environment.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None
