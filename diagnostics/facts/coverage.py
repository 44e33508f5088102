"""How much of the GPU's kernel time the analysis can account for.

Two questions, each a share of summed kernel time (every kernel, every stream):

* **classified**: kernels whose name the kernel-family table knows
  (``facts/kernel_families.py``), split by unit (matrix, vector, memory, communication) and
  by precision; the kernels it does not know are listed with their time, largest first.
  A rule whose figure rests on classified time stays silent below
  ``Thresholds.kernel_classified_min_pct`` and says which kernels it could not read.
* **attributed to an operator**: kernels linked through their correlation id to a runtime
  call that lies inside a CPU operator (``facts/linking.py``). Null when the trace holds no
  CPU operators at all (a GPU-only trace): nothing could be attributed, which is not a
  measurement of the links.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from diagnostics.facts.kernel_families import UNITS
from diagnostics.facts.linking import TraceIndex

UNKNOWN = "unknown"
UNKNOWN_KERNELS_LISTED = 10


@dataclass(frozen=True)
class KernelCoverage:
    kernel_us: float  # summed kernel time, µs
    classified_pct: float  # of kernel_us, in a known family
    by_unit_pct: dict[str, float]  # UNITS + "unknown", adding up to 100
    by_precision_pct: dict[str, float]  # each precision seen + "unknown", adding up to 100
    # the largest kernels no family knows: name, calls, device_us
    unknown_kernels: tuple[dict[str, Any], ...]
    unknown_kernel_count: int  # distinct unknown names
    operator_attributed_pct: float | None  # of kernel_us, linked to a CPU operator

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel_us": self.kernel_us,
            "classified_pct": self.classified_pct,
            "by_unit_pct": dict(self.by_unit_pct),
            "by_precision_pct": dict(self.by_precision_pct),
            "unknown_kernels": [dict(k) for k in self.unknown_kernels],
            "unknown_kernel_count": self.unknown_kernel_count,
            "operator_attributed_pct": self.operator_attributed_pct,
        }


def _shares(kernels: pl.DataFrame, column: str, total_us: float) -> dict[str, float]:
    by = (
        kernels.group_by(pl.col(column).fill_null(UNKNOWN))
        .agg(pl.col("device_us").sum())
        .sort(["device_us", column], descending=[True, False])
    )
    return {row[column]: 100.0 * row["device_us"] / total_us for row in by.iter_rows(named=True)}


def kernel_coverage(
    kernels: pl.DataFrame, index: TraceIndex | None = None
) -> KernelCoverage | None:
    """Coverage of the kernel table (facts.operators.kernel_table: family, unit, precision);
    ``index`` gives the operator links (None: attribution unknown). None without kernels."""
    total_us = float(kernels["device_us"].sum()) if kernels.height else 0.0
    if total_us <= 0:
        return None
    known_us = float(kernels.filter(pl.col("family").is_not_null())["device_us"].sum())
    units = _shares(kernels, "unit", total_us)
    by_unit = {unit: units.get(unit, 0.0) for unit in (*UNITS, UNKNOWN)}
    unknown = kernels.filter(pl.col("family").is_null()).sort(
        ["device_us", "name"], descending=[True, False]
    )
    return KernelCoverage(
        kernel_us=total_us,
        classified_pct=100.0 * known_us / total_us,
        by_unit_pct=by_unit,
        by_precision_pct=_shares(kernels, "precision", total_us),
        unknown_kernels=tuple(
            unknown.head(UNKNOWN_KERNELS_LISTED).select("name", "calls", "device_us").to_dicts()
        ),
        unknown_kernel_count=unknown.height,
        operator_attributed_pct=_attributed_pct(index),
    )


def _attributed_pct(index: TraceIndex | None) -> float | None:
    if index is None or index.ops.height == 0:
        return None
    kernels = index.gpu.filter(pl.col("cat") == "kernel")
    total_us = float(kernels["dur_us"].sum()) if kernels.height else 0.0
    if total_us <= 0:
        return None
    linked_us = float(kernels.filter(pl.col("op_id").is_not_null())["dur_us"].sum())
    return 100.0 * linked_us / total_us
