"""The compiled nesting pass (diagnostics/facts/nesting/op_nesting.c) against the reference it
replaces, the linking's sweep and as-of joins: the same depths, parents and links on every
real trace, on random malformed nestings full of ties, and declined (the sweep runs) where
it would not read its input exactly."""

from __future__ import annotations

import random

import polars as pl
import pytest
from polars.testing import assert_frame_equal, assert_series_equal

from diagnostics.facts import linking, nesting
from diagnostics.facts.linking import build_index, innermost_operator
from diagnostics.facts.nesting import compiled_nesting
from tests.diagnostics.facts.operators_cases import nested_trace, tie_break_trace
from tests.diagnostics.facts.trace_fixture import load_events, real_traces

TRACES = real_traces()


def test_the_compiled_pass_is_built():
    # without it every index takes the sweep (right, but 2x slower at 1 GB): CI must build it
    assert nesting.built()


def _by_sweep(ops: pl.DataFrame, calls: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    tree, sweep = linking._tree_and_sweep(ops)
    linked = innermost_operator(calls, tree, id_col="rt_id", sweep=sweep)
    return tree, linked.get_column("op_id")


def _compiled(ops: pl.DataFrame, calls: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    nested = compiled_nesting(ops, calls)
    assert nested is not None
    depth, parent_id, op_id = nested
    assert op_id is not None
    return ops.with_columns(depth, parent_id), op_id


def _random_rows(rng: random.Random, n: int, threads: int, id_col: str) -> pl.DataFrame:
    """Rows in time order on a coarse grid (ties everywhere), some zero-length or negative,
    nested or overlapping at random."""
    rows = []
    for _ in range(n):
        start = float(rng.randrange(40))
        length = rng.choice([0.0, -1.0, *map(float, range(1, 30))])
        rows.append((100, rng.randrange(threads), start, start + length))
    rows.sort(key=lambda row: row[2])
    frame = pl.DataFrame(
        rows,
        schema={"pid": pl.Int64, "tid": pl.Int64, "start_us": pl.Float64, "end_us": pl.Float64},
        orient="row",
    )
    return frame.with_columns(dur_us=pl.col("end_us") - pl.col("start_us")).with_row_index(id_col)


@pytest.mark.parametrize("seed", range(60))
def test_random_nestings_nest_and_link_as_the_sweep_does(seed):
    rng = random.Random(seed)
    threads = rng.choice([1, 2, 3])
    ops = _random_rows(rng, rng.randrange(1, 60), threads, "op_id")
    calls = _random_rows(rng, rng.randrange(0, 40), threads + 1, "rt_id")  # one has no ops
    tree, linked = _compiled(ops, calls)
    reference_tree, reference_linked = _by_sweep(ops, calls)
    assert_frame_equal(tree, reference_tree)
    assert_series_equal(linked, reference_linked)


def test_deep_and_wide_nesting_matches_the_sweep():
    # 3,000 operators one inside the next, then 3,000 siblings starting together
    n = 3000
    deep = [(1, 1, float(i), float(2 * n - i)) for i in range(n)]
    wide = [(1, 2, 0.0, float(1 + i % 7)) for i in range(n)]
    ops = pl.DataFrame(
        sorted(deep + wide, key=lambda row: row[2]),
        schema={"pid": pl.Int64, "tid": pl.Int64, "start_us": pl.Float64, "end_us": pl.Float64},
        orient="row",
    ).with_row_index("op_id")
    calls = ops.select("pid", "tid", "start_us", "end_us").with_row_index("rt_id")
    tree, linked = _compiled(ops, calls)
    reference_tree, reference_linked = _by_sweep(ops, calls)
    assert_frame_equal(tree, reference_tree)
    assert_series_equal(linked, reference_linked)
    assert tree.get_column("depth").max() == n


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_real_traces_index_as_the_sweep_does(path, monkeypatch):
    events, _ = load_events(path)
    compiled = build_index(events)
    monkeypatch.setattr(nesting, "_op_nesting", None)
    reference = build_index(events)
    for part in ("gpu", "runtime", "ops", "host"):
        assert_frame_equal(getattr(compiled, part), getattr(reference, part))


@pytest.mark.parametrize("trace", [nested_trace, tie_break_trace])
def test_the_hand_made_cases_index_alike_either_way(trace, monkeypatch):
    compiled = build_index(trace())
    monkeypatch.setattr(nesting, "_op_nesting", None)
    reference = build_index(trace())
    for part in ("gpu", "runtime", "ops", "host"):
        assert_frame_equal(getattr(compiled, part), getattr(reference, part))


def _ops(**columns) -> pl.DataFrame:
    base = {
        "pid": [1, 1, 1],
        "tid": [1, 1, 1],
        "start_us": [0.0, 1.0, 2.0],
        "end_us": [10.0, 5.0, 3.0],
    }
    return pl.DataFrame({**base, **columns}).with_row_index("op_id")


@pytest.mark.parametrize(
    "ops",
    [
        _ops(tid=[1, None, 1]),  # a null key: the as-of join's rule for it, not ours
        _ops(start_us=[0.0, 2.0, 1.0]),  # out of time order
        _ops(end_us=[10.0, float("nan"), 3.0]),
        _ops(pid=pl.Series([1, 1, 1], dtype=pl.Int32)),  # another type
    ],
    ids=["null", "unsorted", "nan", "int32"],
)
def test_input_it_would_not_read_exactly_is_declined_and_the_sweep_runs(ops):
    assert compiled_nesting(ops) is None
    tree = operator_tree_of(ops)
    assert tree.get_column("depth").dtype == pl.Int64


def operator_tree_of(ops: pl.DataFrame) -> pl.DataFrame:
    nested = compiled_nesting(ops)
    if nested is None:
        return linking._tree_and_sweep(ops)[0]
    return ops.with_columns(nested[0], nested[1])


def test_a_column_in_several_chunks_is_declined_by_the_module():
    ops = _ops()
    chunked = pl.concat([ops.head(1), ops.tail(2)], rechunk=False)
    assert chunked.get_column("start_us").n_chunks() == 2
    streams = [chunked.get_column(c).__arrow_c_stream__() for c in ("pid", "tid", "start_us")]
    streams.append(chunked.get_column("end_us").rechunk().__arrow_c_stream__())
    assert nesting._op_nesting.nest(*streams) is None
    # the Python side hands it over in one chunk, and it is read
    nested = compiled_nesting(chunked)
    assert nested is not None
    assert nested[0].to_list() == [1, 2, 3]
    assert nested[1].to_list() == [None, 0, 1]


def test_calls_in_any_order_link_as_the_sweep_links_them(monkeypatch):
    # a drill-down's calls (the largest allocations) come by size, not by time
    ops = _ops()
    calls = pl.DataFrame(
        {"pid": [1, 1, 1], "tid": [1, 1, 1], "start_us": [2.5, 0.5, 1.5], "end_us": [2.6, 0.6, 9]}
    ).with_row_index("alloc_id")
    assert compiled_nesting(ops, calls) is None  # the module takes calls in time order only
    tree = operator_tree_of(ops)
    with monkeypatch.context() as patched:  # linked by the compiled pass, in time order
        patched.setattr(linking, "_sweep", None)
        compiled = innermost_operator(calls, tree, id_col="alloc_id")
    monkeypatch.setattr(nesting, "_op_nesting", None)
    assert_frame_equal(compiled, innermost_operator(calls, tree, id_col="alloc_id"))
    assert compiled.get_column("op_id").to_list() == [2, 0, None]


def test_no_operators_and_no_calls():
    empty = _ops().head(0)
    nested = compiled_nesting(empty, empty.rename({"op_id": "rt_id"}))
    assert nested is not None
    assert [len(column) for column in nested if column is not None] == [0, 0, 0]
    assert nested[1].dtype == pl.UInt32
