"""Operators' nesting in one compiled pass (op_nesting.c, beside this file): each operator's
depth and parent and each call's innermost operator, exactly as the sweep and as-of joins
in diagnostics.facts.linking give them (the reference, which runs where this is not built
or declines its input).

A package of its own: the compiled module imports nothing back, so the linking depends on
it one way.
"""

from __future__ import annotations

import polars as pl

from diagnostics.arrow_capsules import series

try:
    from diagnostics.facts.nesting import _op_nesting
except ImportError:  # not built (no C compiler): the linking's sweep does it
    _op_nesting = None

NESTING_KEYS = ("pid", "tid", "start_us", "end_us")


def built() -> bool:
    return _op_nesting is not None


def compiled_nesting(
    ops: pl.DataFrame, calls: pl.DataFrame | None = None
) -> tuple[pl.Series, pl.Series, pl.Series | None] | None:
    """(depth, parent_id, and each call's op_id) from the compiled pass, exactly as the
    sweep gives them; None where it is not built or declines (ops and calls: pid, tid,
    start_us, end_us; op_id is the operator's row)."""
    if _op_nesting is None:
        return None
    frames = (ops,) if calls is None else (ops, calls)
    streams = [
        frame.get_column(key).rechunk().__arrow_c_stream__()
        for frame in frames
        for key in NESTING_KEYS
    ]
    nested = _op_nesting.nest(*streams)
    if nested is None:
        return None
    depth, parent_id, call_op = nested
    return series(depth), series(parent_id), None if call_op is None else series(call_op)
