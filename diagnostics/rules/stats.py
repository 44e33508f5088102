"""Robust statistics the rules share: Theil-Sen slopes, rolling robust z-scores, outliers.

Robust because the inputs are short, noisy series from shared machines: one slow step or
one allocator jump must not decide a finding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


# MAD x 1.4826 estimates the standard deviation of normally distributed data.
MAD_TO_SIGMA = 1.4826
# Theil-Sen is O(n^2) in pairs; above this many points an even subsample keeps it cheap
# (2000 points -> 2 M pairs) without changing the median slope materially.
THEIL_SEN_MAX_POINTS = 2000
# Fewer past values than this give no meaningful median/MAD.
MIN_HISTORY = 5


def theil_sen_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Median of the pairwise slopes (Theil 1950, Sen 1968): tolerates ~29% outliers."""
    import numpy as np

    xs = np.asarray(x, dtype=float)
    ys = np.asarray(y, dtype=float)
    keep = np.isfinite(xs) & np.isfinite(ys)
    xs, ys = xs[keep], ys[keep]
    if xs.size < 2:
        return 0.0
    if xs.size > THEIL_SEN_MAX_POINTS:
        idx = np.linspace(0, xs.size - 1, THEIL_SEN_MAX_POINTS).astype(int)
        xs, ys = xs[idx], ys[idx]
    i, j = np.triu_indices(xs.size, k=1)
    dx = xs[j] - xs[i]
    valid = dx != 0
    if not valid.any():
        return 0.0
    return float(np.median((ys[j] - ys[i])[valid] / dx[valid]))


def rolling_robust_z(values: Sequence[float], window: int, warmup: int) -> np.ndarray:
    """z of each value against the median and MAD of the ``window`` values before it.

    Only past values form the reference (as ZClip's moving statistics do), so a spike does
    not inflate its own yardstick. Steps before ``warmup``, or with fewer than
    ``MIN_HISTORY`` finite values before them, get NaN. A zero MAD (a flat history) falls back to 1e-12 so any
    departure counts, and the ratio test in the caller keeps that from over-firing.
    """
    import numpy as np

    arr = np.asarray(values, dtype=float)
    z = np.full(arr.size, np.nan)
    for idx in range(max(warmup, 1), arr.size):
        if not np.isfinite(arr[idx]):
            continue
        history = arr[max(0, idx - window) : idx]
        history = history[np.isfinite(history)]
        if history.size < MIN_HISTORY:
            continue
        median = np.median(history)
        mad = np.median(np.abs(history - median)) * MAD_TO_SIGMA
        z[idx] = (arr[idx] - median) / max(mad, 1e-12)
    return z


def rolling_median_before(values: Sequence[float], window: int) -> np.ndarray:
    """Median of the ``window`` finite values before each position (NaN when none)."""
    import numpy as np

    arr = np.asarray(values, dtype=float)
    out = np.full(arr.size, np.nan)
    for idx in range(1, arr.size):
        history = arr[max(0, idx - window) : idx]
        history = history[np.isfinite(history)]
        if history.size:
            out[idx] = np.median(history)
    return out


def increasing_share(values: Sequence[float]) -> float:
    """Of all pairs of values (earlier, later) that differ, the share where the later one is
    higher: Mann-Kendall's trend statistic as a share (0.5 for noise, 1 for a steady rise).

    Pairs rather than neighbours: a leak of 4 MiB a step with now and then a 1-3 MiB fall
    (a batch freed, the allocator trimming) has only 72% of its step-to-step changes up but
    96% of its pairs; transient spikes above a rising line do not hide it either (0.86 at
    one step in four), while a single jump in a flat line stays near 0.74. Evenly spaced
    points beyond THEIL_SEN_MAX_POINTS, as for the slope.
    """
    import numpy as np

    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    arr = np.asarray(downsample(arr, THEIL_SEN_MAX_POINTS), dtype=float)
    i, j = np.triu_indices(arr.size, k=1)
    signs = np.sign(arr[j] - arr[i])
    differ = signs[signs != 0]
    if differ.size == 0:
        return 0.0
    return float((differ > 0).sum() / differ.size)


def robust_sigma_outliers(values: Sequence[float], sigma: float) -> np.ndarray:
    """Indices of values above median + sigma x (1.4826 x MAD).

    SageMaker's StepOutlier uses mean + sigma x std, but the outliers inflate both: with
    10% of steps at 6x the median, mean + 3 std lands exactly on them and nothing is
    flagged. The median and MAD ignore up to half the values being outliers.
    """
    import numpy as np

    arr = np.asarray(values, dtype=float)
    finite = arr[np.isfinite(arr)]
    if finite.size < 3:
        return np.array([], dtype=int)
    med = np.median(finite)
    spread = max(np.median(np.abs(finite - med)) * MAD_TO_SIGMA, 1e-12)
    return np.flatnonzero(np.isfinite(arr) & (arr > med + sigma * spread))


def median(values: Sequence[float]) -> float:
    # Plain Python, same result as numpy's median of the finite values: the rules that
    # only need a median (too-few-workers on every trace) then never import numpy.
    arr = sorted(x for v in values if v is not None and math.isfinite(x := float(v)))
    n = len(arr)
    if not n:
        return float("nan")
    mid = n // 2
    return arr[mid] if n % 2 else (arr[mid - 1] + arr[mid]) / 2.0


def downsample(values: Sequence[float | int | None], max_points: int = 500) -> list:
    """An even subsample for chart data in evidence (findings stay small in JSON)."""
    items = list(values)
    if len(items) <= max_points:
        return items
    import numpy as np

    idx = np.linspace(0, len(items) - 1, max_points).astype(int)
    return [items[i] for i in idx]
