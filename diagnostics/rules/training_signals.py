"""What unstable training looks like in step records: the detectors behind unstable-gradients.

Each takes one training phase's records (loss, gradient norm, GradScaler's scale per step)
and the user's thresholds, and returns evidence for what it saw:

- non-finite loss or gradient norm (not on a step GradScaler skipped: that is its overflow
  handling, counted under scaling instead);
- gradient-norm spikes: after a warm-up, a robust z-score against the preceding window above
  the threshold *and* a multiple of that window's median (ZClip's test, made robust to the
  outliers it looks for);
- loss divergence: the last window's median loss well above the best earlier one;
- GradScaler skipping many steps after warm-up, or its scale collapsing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from diagnostics.rules.evidence import numeric, r
from diagnostics.rules.stats import rolling_median_before, rolling_robust_z

if TYPE_CHECKING:
    import numpy as np


def _divergence(loss: np.ndarray, window: int, ratio: float) -> tuple[float, float] | None:
    """(best earlier windowed median, last windowed median) when the last is ratio x worse."""
    import numpy as np

    finite = loss[np.isfinite(loss)]
    if finite.size < 2 * window:
        return None
    medians = np.array([np.median(finite[i - window : i]) for i in range(window, finite.size + 1)])
    last = float(medians[-1])
    best = float(medians[:-window].min()) if medians.size > window else float(medians[0])
    if best > 0 and last > ratio * best:
        return best, last
    return None


@dataclass(frozen=True)
class SignalLimits:
    """The thresholds the detectors use (diagnostics.thresholds, passed by the rule so that
    a user's --thresholds reach them)."""

    grad_window_steps: int
    grad_warmup_steps: int
    grad_spike_z: float
    grad_spike_min_ratio: float
    loss_window_steps: int
    loss_divergence_ratio: float
    scaler_skip_share_max_pct: float
    scaler_scale_min: float


def phase_signals(steps: pl.DataFrame, t: SignalLimits) -> dict[str, Any]:
    """The signals of instability in one training phase's step records, each with its
    evidence and offending steps: non_finite, grad_spikes, divergence, scaler_skipped_steps,
    scale_collapse (absent when not seen)."""
    import numpy as np

    step_ids = np.asarray(steps["step"].to_list())
    loss = np.asarray(numeric(steps, "loss"))
    grad = np.asarray(numeric(steps, "grad_norm"))
    scale = np.asarray(numeric(steps, "amp_scale"))
    has_scale = bool(np.isfinite(scale).any())
    # a step whose scale then halved was skipped by GradScaler (its inf/NaN is expected)
    skipped = np.zeros(step_ids.size, dtype=bool)
    if has_scale:
        skipped[:-1] = np.isfinite(scale[1:]) & (scale[1:] < scale[:-1])
    bad_loss = np.array([v is not None and not math.isfinite(v) for v in steps["loss"].to_list()])
    bad_grad = (
        np.array([v is not None and not math.isfinite(v) for v in steps["grad_norm"].to_list()])
        & ~skipped
    )
    out: dict[str, Any] = {}
    nonfinite = step_ids[bad_loss | bad_grad]
    if nonfinite.size:
        out["non_finite"] = {
            "count": int(nonfinite.size),
            "first_step": int(nonfinite[0]),
            "steps": nonfinite[:50].tolist(),
        }
    z = rolling_robust_z(grad, t.grad_window_steps, t.grad_warmup_steps)
    base = rolling_median_before(grad, t.grad_window_steps)
    with np.errstate(invalid="ignore", divide="ignore"):
        spikes = (z > t.grad_spike_z) & (grad > t.grad_spike_min_ratio * base) & ~skipped
    if spikes.any():
        idx = np.flatnonzero(spikes)
        out["grad_spikes"] = {
            "count": int(idx.size),
            "steps": step_ids[idx][:50].tolist(),
            "max_z": r(float(np.nanmax(z[idx])), 1),
            "max_ratio_to_median": r(float(np.nanmax(grad[idx] / base[idx])), 1),
            "median_grad_norm": r(float(np.nanmedian(grad[np.isfinite(grad)])), 3),
            "warmup_steps": t.grad_warmup_steps,
            "window_steps": t.grad_window_steps,
        }
    div = _divergence(loss, t.loss_window_steps, t.loss_divergence_ratio)
    if div is not None:
        out["divergence"] = {
            "best_windowed_loss": r(div[0], 4),
            "last_windowed_loss": r(div[1], 4),
            "ratio": r(div[1] / div[0], 2),
            "steps": [int(step_ids[-t.loss_window_steps]), int(step_ids[-1])],
        }
    if has_scale:
        after = slice(min(t.grad_warmup_steps, step_ids.size), None)
        considered = int(skipped[after].size)
        n_skipped = int(skipped[after].sum())
        share = 100.0 * n_skipped / considered if considered else 0.0
        if considered and share > t.scaler_skip_share_max_pct:
            out["scaler_skipped_steps"] = {
                "count": n_skipped,
                "share_pct": r(share, 1),
                "steps": step_ids[after][skipped[after]][:50].tolist(),
            }
        finite_scale = scale[np.isfinite(scale)]
        if finite_scale.size and float(finite_scale[-1]) < t.scaler_scale_min:
            out["scale_collapse"] = {
                "first_scale": float(finite_scale[0]),
                "last_scale": float(finite_scale[-1]),
                "steps": [int(step_ids[0]), int(step_ids[-1])],
            }
    return out
