import polars as pl

from diagnostics.facts.intervals import covered_between, merge_intervals, total_length


def frame(*ranges, device=None):
    data = {"start_us": [float(a) for a, _ in ranges], "end_us": [float(b) for _, b in ranges]}
    if device is not None:
        data["device"] = device
    return pl.DataFrame(data)


def test_merge_unions_overlapping_nested_and_touching_ranges():
    merged = merge_intervals(frame((0, 10), (5, 20), (6, 7), (20, 25), (30, 40)))
    # (0,10)∪(5,20)∪(6,7)∪(20,25) touch or overlap -> (0,25); (30,40) stands alone.
    assert merged.rows() == [(0.0, 25.0), (30.0, 40.0)]
    assert total_length(merged) == (25 - 0) + (40 - 30)


def test_merge_keeps_keys_apart():
    merged = merge_intervals(frame((0, 10), (5, 15), (0, 3), device=[0, 0, 1]), by=["device"])
    assert merged.sort("device").rows() == [(0, 0.0, 15.0), (1, 0.0, 3.0)]


def test_covered_between_counts_each_instant_once():
    union = merge_intervals(frame((0, 10), (20, 30)))
    queries = frame((5, 25), (-5, 0), (0, 100), (12, 18))
    got = covered_between(union, queries, "covered")["covered"].to_list()
    # [5,25]: (10-5) + (25-20) = 10; [-5,0]: nothing; [0,100]: 10 + 10; [12,18]: in the hole.
    assert got == [10.0, 0.0, 20.0, 0.0]


def test_covered_between_per_key():
    union = merge_intervals(frame((0, 10), (0, 4), device=[0, 1]), by=["device"])
    queries = frame((2, 8), (2, 8), device=[0, 1])
    got = covered_between(union, queries, "covered", by=["device"])["covered"].to_list()
    # device 0 covers all of [2,8] (6 µs); device 1 only [2,4] (2 µs).
    assert got == [6.0, 2.0]
