"""What a training job costs, before and after the findings' savings.

A GPU job is priced per GPU-hour, a CPU job per vCPU-hour (times the cores the run could
use), so a CPU run is never priced "per GPU-hour". The default prices are rough list prices
of the large public clouds, gathered by hand on ``PRICES_DATED``; they drift and differ by
region and provider, so reports label them as estimates and every caller can set its own
price (``Pricing.usd_per_gpu_hour``: the price of one priced unit, a GPU or a vCPU).

The savings of several findings are not compounded: each is a share of the same baseline
step time, and findings that explain the same waiting time overlap, so the combined figure
is their sum capped at the largest measured wait or idle share they explain
(:func:`combined_saving_pct`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from diagnostics.dotted import dotted_get
from diagnostics.report import fmt

Tier = Literal["on_demand", "spot"]

PRICES_DATED = "2025-06"


@dataclass(frozen=True)
class GpuPrice:
    name: str
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float
    match: tuple[str, ...]  # substrings of torch.cuda.get_device_name() that mean this GPU
    unit: str = "GPU"  # what one price buys for an hour: a GPU, or one vCPU
    source: str = "8-GPU instance price / 8, on-demand and typical spot"


# Per GPU (an 8-GPU instance's price divided by 8), rounded; spot is a typical recent
# preemptible price, which moves daily.
GPU_PRICES: tuple[GpuPrice, ...] = (
    GpuPrice("NVIDIA H200", 5.00, 2.50, ("H200",)),
    GpuPrice("NVIDIA H100 80GB", 4.00, 2.00, ("H100",)),
    GpuPrice("NVIDIA A100 80GB", 3.40, 1.50, ("A100-SXM4-80GB", "A100 80GB", "A100-80GB")),
    GpuPrice("NVIDIA A100 40GB", 3.00, 1.20, ("A100",)),
    GpuPrice("NVIDIA L4", 0.80, 0.30, ("L4",)),
    GpuPrice("NVIDIA A10G", 1.00, 0.40, ("A10G", "A10")),
    GpuPrice("NVIDIA V100 16GB", 3.06, 0.92, ("V100",)),
    GpuPrice("NVIDIA T4", 0.53, 0.18, ("T4",)),
    GpuPrice(
        "CPU (per vCPU)",
        0.0425,
        0.0125,
        (),
        unit="vCPU",
        source="a general-purpose 8-vCPU instance at about $0.34/h on demand, $0.10 spot, / 8",
    ),
)
DEFAULT_GPU = "NVIDIA A100 80GB"
CPU_ENTRY = "CPU (per vCPU)"
# vCPUs priced for a CPU run whose core count is unknown: the instance the price is from
DEFAULT_VCPUS = 8


def price_named(name: str) -> GpuPrice:
    for entry in GPU_PRICES:
        if entry.name.lower() == name.lower():
            return entry
    known = ", ".join(p.name for p in GPU_PRICES)
    raise ValueError(f"gpu: unknown GPU price entry {name!r}; known: {known}")


def guess_price(gpu_name: str | None, device: str | None) -> GpuPrice:
    """The price entry for the GPU a job ran on; the CPU entry for CPU jobs."""
    if gpu_name:
        for entry in GPU_PRICES:  # ordered so the more specific names match first
            if any(token.lower() in gpu_name.lower() for token in entry.match):
                return entry
    if device == "cpu" and not gpu_name:
        return price_named(CPU_ENTRY)
    return price_named(DEFAULT_GPU)


@dataclass(frozen=True)
class Pricing:
    """The price the cost section uses. ``usd_per_gpu_hour`` None means: the entry's."""

    gpu: str | None = None  # a GPU_PRICES name; None = guessed from the environment
    tier: Tier = "on_demand"
    usd_per_gpu_hour: float | None = None
    gpus: int | None = None  # None = the job's world size where known, else 1

    def __post_init__(self) -> None:
        if self.tier not in ("on_demand", "spot"):
            raise ValueError(f"tier: {self.tier!r}; allowed: on_demand, spot")
        if self.usd_per_gpu_hour is not None and not (
            math.isfinite(self.usd_per_gpu_hour) and self.usd_per_gpu_hour >= 0
        ):
            raise ValueError(f"usd_per_gpu_hour: {self.usd_per_gpu_hour}; must be >= 0")
        if self.gpus is not None and self.gpus < 1:
            raise ValueError(f"gpus: {self.gpus}; must be >= 1")
        if self.gpu is not None:
            price_named(self.gpu)


def steps_per_epoch(
    config: Mapping[str, Any] | None, environment: Mapping[str, Any] | None = None
) -> tuple[int | None, str]:
    """(steps per epoch, how it was found or why it is unknown).

    The run's own count (``environment["steps_per_epoch"]``, from its training split) wins
    over the config's ``data.rows``, which also counts the rows held out for validation.
    """
    recorded = (environment or {}).get("steps_per_epoch")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0:
        return recorded, "the run's training split / train.batch_size, rounded up"
    rows = dotted_get(config, "data.rows")
    batch = dotted_get(config, "train.batch_size")
    if not config:
        return None, "unknown: a trace carries no dataset size or batch size"
    if not isinstance(rows, int) or isinstance(rows, bool) or rows <= 0:
        return None, "unknown: the run config has no data.rows"
    if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        return None, "unknown: the run config has no train.batch_size"
    # The last, partial batch is still a step (the trainer does not drop it).
    return math.ceil(rows / batch), f"data.rows {rows:,} / train.batch_size {batch}, rounded up"


def combined_saving_pct(savings: Iterable[float | None], bound_pct: float | None = None) -> float:
    """The findings' savings together, never compounded.

    Each saving is a share of the same baseline (the step time now). Findings often explain
    the same waiting time (a slow loader is also GPU idle time and slow outlier steps), so
    adding them would count it twice and compounding them (each applied to what the others
    leave) still promises more than was measured. The sum is therefore capped at
    ``bound_pct``, the largest measured wait or idle share the findings explain (the
    data-wait share, the GPU's idle share, the outlier steps' excess), even when one finding
    claims more than was measured; without a measured share, at the largest single saving.
    95% at most, so no estimate promises a free job.
    """
    valid = [min(float(s), 95.0) for s in savings if s is not None and math.isfinite(s) and s > 0]
    if not valid:
        return 0.0
    limit = max(valid)
    if bound_pct is not None and math.isfinite(bound_pct):
        limit = max(0.0, float(bound_pct))
    return min(sum(valid), limit, 95.0)


@dataclass(frozen=True)
class CostEstimate:
    gpu: str
    tier: Tier
    usd_per_gpu_hour: float
    price_is_default: bool
    prices_dated: str
    gpus: int
    step_time_ms: float | None  # mean steady-state step time
    time_per_1000_steps_s: float | None
    steps_per_epoch: int | None
    steps_per_epoch_note: str
    time_per_epoch_s: float | None
    cost_per_1000_steps_usd: float | None
    cost_per_epoch_usd: float | None
    saving_pct: float  # combined estimated saving of the findings (not compounded)
    after_time_per_1000_steps_s: float | None
    after_time_per_epoch_s: float | None
    after_cost_per_1000_steps_usd: float | None
    after_cost_per_epoch_usd: float | None
    unit: str = "GPU"  # the priced unit: "GPU" (per GPU-hour) or "vCPU" (per vCPU-hour)
    price_source: str = ""  # where the default price comes from
    saving_bound_pct: float | None = None  # the largest measured wait/idle share

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def estimate_cost(
    *,
    step_time_ms: float | None,
    config: Mapping[str, Any] | None,
    savings_pct: Iterable[float | None],
    gpu_name: str | None,
    device: str | None,
    world_size: int | None = None,
    pricing: Pricing | None = None,
    environment: Mapping[str, Any] | None = None,
    saving_bound_pct: float | None = None,
) -> CostEstimate:
    pricing = pricing or Pricing()
    entry = price_named(pricing.gpu) if pricing.gpu else guess_price(gpu_name, device)
    default_rate = (
        entry.on_demand_usd_per_hour if pricing.tier == "on_demand" else entry.spot_usd_per_hour
    )
    rate = pricing.usd_per_gpu_hour if pricing.usd_per_gpu_hour is not None else default_rate
    if entry.unit == "vCPU":
        cores = (environment or {}).get("cpu_count")
        known = isinstance(cores, int) and not isinstance(cores, bool) and cores > 0
        gpus = pricing.gpus or (cores if known else DEFAULT_VCPUS)
    else:
        gpus = pricing.gpus or (world_size if world_size and world_size > 0 else 1)
    per_epoch, note = steps_per_epoch(config, environment)
    saving = combined_saving_pct(savings_pct, saving_bound_pct)
    keep = 1.0 - saving / 100.0

    def scaled(value: float | None, factor: float) -> float | None:
        return None if value is None else value * factor

    valid_step = step_time_ms if step_time_ms and math.isfinite(step_time_ms) else None
    per_1000_s = scaled(valid_step, 1.0)  # 1000 steps x ms / 1000 = seconds
    per_epoch_s = scaled(valid_step, per_epoch / 1000.0) if per_epoch else None
    usd_per_s = rate * gpus / 3600.0
    return CostEstimate(
        gpu=entry.name,
        tier=pricing.tier,
        usd_per_gpu_hour=rate,
        price_is_default=pricing.usd_per_gpu_hour is None,
        prices_dated=PRICES_DATED,
        gpus=gpus,
        step_time_ms=valid_step,
        time_per_1000_steps_s=per_1000_s,
        steps_per_epoch=per_epoch,
        steps_per_epoch_note=note,
        time_per_epoch_s=per_epoch_s,
        cost_per_1000_steps_usd=scaled(per_1000_s, usd_per_s),
        cost_per_epoch_usd=scaled(per_epoch_s, usd_per_s),
        saving_pct=saving,
        after_time_per_1000_steps_s=scaled(per_1000_s, keep),
        after_time_per_epoch_s=scaled(per_epoch_s, keep),
        after_cost_per_1000_steps_usd=scaled(per_1000_s, usd_per_s * keep),
        after_cost_per_epoch_usd=scaled(per_epoch_s, usd_per_s * keep),
        unit=entry.unit,
        price_source=entry.source,
        saving_bound_pct=saving_bound_pct,
    )


def saving_note(cost: CostEstimate) -> str:
    """How "after fixes" was reached, in words (shared with the HTML report)."""
    bound = (
        f", capped at the largest measured wait or idle share they explain "
        f"({fmt.pct(cost.saving_bound_pct)})"
        if cost.saving_bound_pct is not None
        else ""
    )
    return (
        f"After fixes applies the findings' estimated savings together: "
        f"{fmt.pct(cost.saving_pct)} of step time, each against the same step time and added{bound}; "
        "overlapping findings are not counted twice."
    )
