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


def test_covered_between_keeps_the_queries_columns_and_order_and_matches_a_direct_sum():
    """Random ranges on two keys, queries out of time order with columns of their own: each
    query's coverage equals the sum, over the union's ranges of its key, of their overlap
    with it, and the rest of the frame comes back as it went in."""
    import random

    rng = random.Random(7)
    ranges = [(rng.uniform(0, 1000), rng.uniform(0, 60), rng.choice([0, 1])) for _ in range(300)]
    union = merge_intervals(
        pl.DataFrame(
            {
                "device": [d for _, _, d in ranges],
                "start_us": [a for a, _, _ in ranges],
                "end_us": [a + w for a, w, _ in ranges],
            }
        ),
        by=["device"],
    )
    starts = [rng.uniform(-50, 1050) for _ in range(200)]
    queries = pl.DataFrame(
        {
            "label": [f"q{i}" for i in range(200)],
            "device": [rng.choice([0, 1]) for _ in range(200)],
            "start_us": starts,
            "end_us": [a + rng.uniform(-5, 120) for a in starts],  # a few end before they start
        }
    )
    got = covered_between(union, queries, "covered", by=["device"])
    assert got.drop("covered").equals(queries)
    for row in got.iter_rows(named=True):
        direct = sum(
            max(0.0, min(row["end_us"], b) - max(row["start_us"], a))
            for d, a, b in union.select("device", "start_us", "end_us").iter_rows()
            if d == row["device"]
        )
        assert abs(row["covered"] - direct) < 1e-9, row
