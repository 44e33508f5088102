"""The one way a share is written: ``pct``."""

from __future__ import annotations

import math

import pytest

from diagnostics.percent import MISSING, pct


@pytest.mark.parametrize(
    ("share", "digits", "written"),
    [
        (12.345, 1, "12.3 %"),
        (100.0, 1, "100.0 %"),
        (0.0, 1, "0.0 %"),
        (0.05, 1, "0.1 %"),  # rounds up to one decimal: written as ever
        # not zero, but one decimal would say 0.0 %: two significant figures instead
        (0.0412, 1, "0.041 %"),
        (0.04, 1, "0.040 %"),
        (0.00512, 1, "0.0051 %"),
        (-0.0412, 1, "-0.041 %"),
        (0.0004, 1, "< 0.001 %"),
        (-0.0004, 1, "> -0.001 %"),
        (0.4, 0, "0.40 %"),
        (0.6, 0, "1 %"),
        (33.35, 2, "33.35 %"),
    ],
)
def test_a_share_is_written_with_the_digits_it_needs(share, digits, written):
    assert pct(share, digits) == written


@pytest.mark.parametrize("missing", [None, math.nan, math.inf, -math.inf])
def test_a_missing_or_non_finite_share_is_a_dash(missing):
    assert pct(missing) == MISSING
