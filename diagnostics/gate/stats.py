"""The gate's statistics, in the standard library: a Mann–Whitney U test and a seeded
bootstrap interval on a ratio of medians.

Mann–Whitney U (Mann & Whitney 1947, "On a test of whether one of two random variables is
stochastically larger than the other", Ann. Math. Statist. 18(1)), as asv uses it to tell a
benchmark's change from its noise:

- U_x = R_x - n_x (n_x + 1) / 2, where R_x is the sum of x's ranks in the pooled sample
  (tied values get their average rank); U_y = n_x n_y - U_x.
- Exact p-value when there are no ties and n_x n_y <= EXACT_MAX_PAIRS: the null
  distribution of U counts the arrangements of the pooled ranks, by the recurrence
  c(u; m, n) = c(u - n; m - 1, n) + c(u; m, n - 1) (Mann & Whitney 1947), over
  C(m + n, m) equally likely arrangements. Two-sided p = 2 min(P(U <= u), P(U >= u)), at
  most 1.
- Otherwise the normal approximation with the tie correction and a continuity correction of
  0.5 (Lehmann, "Nonparametrics", 1975, sec. 1.4; the same as scipy.stats.mannwhitneyu's
  method="asymptotic"): mean n_x n_y / 2, variance
  n_x n_y / 12 * ((N + 1) - sum(t^3 - t) / (N (N - 1))), N = n_x + n_y, t the size of each
  group of ties; z = (|U - mean| - 0.5) / sd, p = erfc(z / sqrt 2).

The bootstrap resamples each sample with replacement (Efron & Tibshirani, "An Introduction
to the Bootstrap", 1993, ch. 13: the percentile interval) and takes the 2.5th and 97.5th
percentiles of median(y*) / median(x*). The generator is seeded, so one input always gives
one interval: a CI gate must not flip its verdict on a re-run of the same files.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Above this many pairs the exact count's table grows past a few hundred thousand cells;
# the normal approximation is then within a fraction of a percent of the exact p.
EXACT_MAX_PAIRS = 2500
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261201
# Up to this many values (both sides) resample in Python (~30 ms for 36 + 36); above, polars
# draws them, BOOTSTRAP_CHUNK_VALUES at a time (a bounded frame however long the run)
PYTHON_BOOTSTRAP_MAX_VALUES = 1000
BOOTSTRAP_CHUNK_VALUES = 1 << 20


@dataclass(frozen=True)
class MannWhitney:
    u_x: float  # pairs (x_i, y_j) with x_i > y_j, ties counted one half
    u_y: float
    p_value: float  # two-sided
    method: str  # "exact" or "normal"


def _average_ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2.0 + 1.0  # ranks count from 1
        start = end + 1
    return ranks


def _u_distribution(m: int, n: int) -> list[int]:
    """counts[u]: how many orderings of m x's and n y's have exactly u (x, y) pairs with x
    above y. These are the coefficients of the Gaussian binomial [m + n choose m]_q, the
    closed form of Mann and Whitney's recurrence: prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i),
    built one factor at a time in integers (exact)."""
    counts = [0] * (m * n + 1)
    counts[0] = 1
    for i in range(1, m + 1):
        for k in range(len(counts) - 1, n + i - 1, -1):  # times (1 - q^(n+i))
            counts[k] -= counts[k - n - i]
        for k in range(i, len(counts)):  # over (1 - q^i): a running sum with stride i
            counts[k] += counts[k - i]
    return counts


def _exact_p(u: float, m: int, n: int) -> float:
    counts = _u_distribution(m, n)
    u_int = int(round(u))
    at_most, at_least = sum(counts[: u_int + 1]), sum(counts[u_int:])
    return min(1.0, 2.0 * min(at_most, at_least) / math.comb(m + n, m))


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """The two-sided Mann–Whitney U test of x against y (see the module docstring)."""
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        raise ValueError("mann_whitney_u needs at least one value on each side")
    pooled = [float(v) for v in x] + [float(v) for v in y]
    ranks = _average_ranks(pooled)
    u_x = sum(ranks[:m]) - m * (m + 1) / 2.0
    u_y = m * n - u_x
    ties = _tie_sizes(pooled)
    if not ties and m * n <= EXACT_MAX_PAIRS:
        return MannWhitney(u_x, u_y, _exact_p(u_x, m, n), "exact")
    total = m + n
    tie_term = sum(t**3 - t for t in ties) / (total * (total - 1))
    variance = m * n / 12.0 * ((total + 1) - tie_term)
    if variance <= 0:  # every value the same: nothing tells the samples apart
        return MannWhitney(u_x, u_y, 1.0, "normal")
    z = max(0.0, abs(u_x - m * n / 2.0) - 0.5) / math.sqrt(variance)
    return MannWhitney(u_x, u_y, min(1.0, math.erfc(z / math.sqrt(2.0))), "normal")


def _tie_sizes(values: Sequence[float]) -> list[int]:
    counts: dict[float, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return [count for count in counts.values() if count > 1]


def smallest_p_value(m: int, n: int) -> float:
    """The smallest two-sided p the exact test can give with m and n values: when it is
    above the significance level no outcome could be significant (3 against 3: 0.1)."""
    if m == 0 or n == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(m + n, m))


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, "linear")."""
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    weight = position - low
    return sorted_values[low] * (1.0 - weight) + sorted_values[high] * weight


def bootstrap_median_ratio_ci(
    x: Sequence[float],
    y: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """The percentile bootstrap interval of median(y) / median(x); None when a resampled
    median of x can be zero or either sample is empty."""
    if not x or not y or min(x) <= 0:
        return None
    xs, ys = [float(v) for v in x], [float(v) for v in y]
    if len(xs) + len(ys) > PYTHON_BOOTSTRAP_MAX_VALUES:
        ratios = _polars_median_ratios(xs, ys, resamples, seed)
    else:
        rng = random.Random(seed)
        ratios = sorted(
            statistics.median(rng.choices(ys, k=len(ys)))
            / statistics.median(rng.choices(xs, k=len(xs)))
            for _ in range(resamples)
        )
    tail = (1.0 - confidence) / 2.0
    return _percentile(ratios, tail), _percentile(ratios, 1.0 - tail)


def _resampled_medians(values: list[float], resamples: int, seed: int) -> list[float]:
    """``resamples`` medians of resamples of ``values``, drawn in polars a chunk at a time
    (drawing 5,000 values 2,000 times in Python took 9 s; this, under one)."""
    import polars as pl

    size = len(values)
    per_chunk = max(1, BOOTSTRAP_CHUNK_VALUES // size)
    series = pl.Series("v", values, dtype=pl.Float64)
    medians: list[float] = []
    for chunk, start in enumerate(range(0, resamples, per_chunk)):
        count = min(per_chunk, resamples - start)
        drawn = series.sample(size * count, with_replacement=True, seed=seed + chunk)
        frame = pl.DataFrame({"v": drawn, "resample": pl.int_range(size * count, eager=True)})
        medians += (
            frame.group_by(pl.col("resample") // size, maintain_order=True)
            .agg(pl.col("v").median())["v"]
            .to_list()
        )
    return medians


def _polars_median_ratios(
    xs: list[float], ys: list[float], resamples: int, seed: int
) -> list[float]:
    medians_x = _resampled_medians(xs, resamples, seed)
    medians_y = _resampled_medians(ys, resamples, seed + 1_000_003)  # independent of x's
    return sorted(my / mx for mx, my in zip(medians_x, medians_y, strict=True))
