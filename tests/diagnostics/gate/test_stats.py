"""The gate's statistics against independent oracles: brute-force enumeration of every
arrangement for the exact Mann–Whitney distribution, the normal approximation worked by hand
(ranks, tie term, z) with the standard normal from the standard library, and bootstrap
intervals whose answer is forced by the data."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import pytest

from diagnostics.gate.stats import (
    bootstrap_median_ratio_ci,
    mann_whitney_u,
    smallest_p_value,
)


def _brute_force_two_sided_p(x: list[float], y: list[float]) -> float:
    """Every way to split the pooled (tie-free) values into |x| and |y|, equally likely
    under the null: p = 2 min(share with U <= u, share with U >= u)."""
    pooled = x + y
    observed = sum(1 for a in x for b in y if a > b)
    at_most = at_least = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(x)):
        xs = [pooled[i] for i in chosen]
        ys = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        u = sum(1 for a in xs for b in ys if a > b)
        total += 1
        at_most += u <= observed
        at_least += u >= observed
    return min(1.0, 2.0 * min(at_most, at_least) / total)


def test_completely_separated_samples_of_five_give_the_smallest_exact_p():
    # U_x = 0: only 1 of the C(10, 5) = 252 arrangements is as extreme on each side
    test = mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert (test.u_x, test.u_y, test.method) == (0.0, 25.0, "exact")
    assert test.p_value == pytest.approx(2 / 252)


@pytest.mark.parametrize(
    ("x", "y"),
    [
        ([1.0, 4.0, 6.0, 9.0, 12.0], [2.0, 3.0, 5.0, 7.0, 8.0]),
        ([10.5, 11.2, 9.8], [12.1, 13.0, 12.7, 11.9]),
        ([3.1, 8.2, 5.5, 7.7, 1.2, 9.9], [4.4, 2.3, 6.6, 0.5, 10.1, 11.3, 12.8]),
    ],
)
def test_exact_p_equals_the_count_over_every_arrangement(x, y):
    assert mann_whitney_u(x, y).p_value == pytest.approx(_brute_force_two_sided_p(x, y))


def test_ties_use_the_normal_approximation_with_the_tie_and_continuity_corrections():
    # pooled, sorted: 1x 2x 2x 2y 3x 3y 4y 5y; average ranks 1, 3, 3, 3, 5.5, 5.5, 7, 8
    # R_x = 1 + 3 + 3 + 5.5 = 12.5, U_x = 12.5 - 4*5/2 = 2.5, U_y = 16 - 2.5 = 13.5
    # ties of 3 and 2: sum(t^3 - t) = 24 + 6 = 30; N = 8
    # var = 4*4/12 * (9 - 30/56) = 11.2857..., z = (|2.5 - 8| - 0.5) / sqrt(var)
    test = mann_whitney_u([1, 2, 2, 3], [2, 3, 4, 5])
    assert (test.u_x, test.u_y, test.method) == (2.5, 13.5, "normal")
    z = 5.0 / math.sqrt(16 / 12 * (9 - 30 / 56))
    assert test.p_value == pytest.approx(2 * (1 - NormalDist().cdf(z)))
    assert test.p_value == pytest.approx(0.1367, abs=5e-4)


def test_identical_samples_are_not_significant():
    test = mann_whitney_u([5.0] * 6, [5.0] * 6)
    assert test.p_value == 1.0


def test_the_smallest_reachable_p_tells_when_a_sample_is_too_small():
    assert smallest_p_value(3, 3) == pytest.approx(2 / 20)  # never below 0.05
    assert smallest_p_value(4, 4) == pytest.approx(2 / 70)
    assert smallest_p_value(0, 5) == 1.0


def test_constant_samples_give_a_bootstrap_interval_of_exactly_their_ratio():
    assert bootstrap_median_ratio_ci([10.0] * 7, [12.0] * 9) == pytest.approx((1.2, 1.2))


def test_the_bootstrap_is_seeded_so_one_input_gives_one_interval():
    x = [101.0, 97.5, 99.1, 120.3, 98.8, 100.2, 96.4]
    y = [104.2, 99.9, 131.0, 101.7, 103.3, 100.8, 102.5]
    first = bootstrap_median_ratio_ci(x, y)
    assert first == bootstrap_median_ratio_ci(list(x), list(y))
    low, high = first
    # the interval brackets the observed median ratio, 102.5 / 99.1
    assert low <= 102.5 / 99.1 <= high
    assert bootstrap_median_ratio_ci(x, y, seed=7) != first


def test_no_interval_without_a_positive_baseline():
    assert bootstrap_median_ratio_ci([], [1.0]) is None
    assert bootstrap_median_ratio_ci([0.0, 1.0], [1.0, 2.0]) is None


def test_long_runs_resample_in_polars_with_the_same_guarantees():
    # 800 + 900 values: above the Python path's 1,000, so polars draws the resamples
    assert bootstrap_median_ratio_ci([10.0] * 800, [12.0] * 900) == pytest.approx((1.2, 1.2))
    base = [100.0 + (i * 37 % 101) / 10.0 for i in range(600)]  # 100.0 .. 110.0, spread
    slower = [v * 1.1 for v in base]  # every step 10 % slower: median ratio exactly 1.1
    low, high = bootstrap_median_ratio_ci(base, slower)
    assert low < 1.1 < high and high - low < 0.03
    assert bootstrap_median_ratio_ci(base, slower) == (low, high)
