"""One snapshot analysed: dump-time sums against the segments, the peak against a
straightforward replay written here, sites and categories at the peak, fragmentation and
the out-of-memory event. Expected numbers come from the raw dicts (the json.load oracle
of traces, for pickles) or from the sizes the scenario was built with.
"""

from __future__ import annotations

import polars as pl
import pytest

from diagnostics.snapshot.analysis import analyse_snapshot
from diagnostics.snapshot.examples import (
    MIB,
    SnapshotBuilder,
    forward_frames,
    training_snapshot,
    user_frames,
)
from diagnostics.snapshot.reader import parse_snapshot


def _facts(raw):
    return analyse_snapshot(parse_snapshot(raw, "test.pickle", bytes_read=10**7))


def _straight_replay(raw):
    """Peak allocated over the trace, walking forward from an empty device (the
    builder's window starts before the first allocation): +alloc, -free_completed."""
    level, peak, peak_i = 0, 0, None
    for i, entry in enumerate(raw["device_traces"][0]):
        if entry["action"] == "alloc":
            level += entry["size"]
        elif entry["action"] == "free_completed":
            level -= entry["size"]
        if level > peak:
            peak, peak_i = level, i
    return peak, peak_i


@pytest.mark.parametrize("new_schema", [True, False])
def test_dump_state_equals_segment_sums_to_the_byte(new_schema):
    raw = training_snapshot(new_schema=new_schema, steps=3)
    facts = _facts(raw)
    segments = raw["segments"]
    assert facts.dump.reserved_bytes == sum(s["total_size"] for s in segments)
    assert facts.dump.allocated_bytes == sum(s["allocated_size"] for s in segments)
    assert facts.dump.active_bytes == sum(s["active_size"] for s in segments)
    assert facts.dump.inactive_bytes == sum(
        b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"
    )
    assert facts.warnings == ()


@pytest.mark.parametrize("new_schema", [True, False])
def test_peak_equals_a_straightforward_replay(new_schema):
    raw = training_snapshot(new_schema=new_schema, leak_bytes_per_step=3 * MIB, steps=3)
    peak, index = _straight_replay(raw)
    facts = _facts(raw)
    assert facts.peak.allocated_bytes == peak
    assert facts.peak.seq == index
    entries = raw["device_traces"][0]
    if new_schema:
        assert facts.peak.time_s == pytest.approx(
            (entries[index]["time_us"] - entries[0]["time_us"]) / 1e6
        )
    else:
        assert facts.peak.time_s is None  # old snapshots have no time_us
    # the blocks live at the peak add up to it
    assert int(facts.sites_at_peak["bytes"].sum()) == peak
    assert int(facts.categories_at_peak["bytes"].sum()) == peak


def test_categories_at_the_peak_match_what_the_scenario_built():
    # 4 layers of 16 MiB params; 4 saved activations of 8 MiB and one live temporary at
    # the peak (the last layer's, allocated before its saved output); Adam: 2 x params
    facts = _facts(training_snapshot(param_bytes=64 * MIB, activation_bytes=32 * MIB))
    got = dict(zip(*facts.categories_at_peak.select("category", "bytes"), strict=True))
    assert got == {
        "parameters": 64 * MIB,
        "gradients": 64 * MIB,
        "optimizer_state": 128 * MIB,
        "activations": 32 * MIB,
        "temporaries": 8 * MIB,
        "unknown": 0,
    }
    top = facts.sites_at_peak.row(0, named=True)
    assert top["label"] == "train.py:44 in train_step" and top["user_code"]
    assert "torch/optim/adam.py:160 in _init_group" in top["stack"]


def test_site_skips_torch_and_unsymbolised_frames():
    facts = _facts(training_snapshot())
    labels = facts.sites_at_peak["label"].to_list()
    assert "model.py:30 in forward" in labels
    assert not any("functional.py" in label or "??" in label for label in labels)


def test_no_history_leaves_peak_unknown():
    raw = training_snapshot()
    raw["device_traces"] = [[]]
    for seg in raw["segments"]:
        for block in seg["blocks"]:
            block["frames"] = []
    facts = _facts(raw)
    assert facts.peak is None and facts.timeline.height == 0
    assert facts.to_dict()["categories_at_peak"] is None
    assert facts.dump.allocated_bytes == sum(s["allocated_size"] for s in raw["segments"])
    assert facts.category_bytes("unknown", at="dump") == facts.dump.active_bytes


def _fragmented_oom():
    """Twenty 4 MiB tensors in one 80 MiB segment, every other one freed: ten 4 MiB
    holes (40 MiB cached free) and a 6 MiB request that fits in none of them."""
    b = SnapshotBuilder()
    big = b.alloc(80 * MIB, user_frames(5))
    b.free(big, frames=user_frames(6))
    handles = [b.alloc(4 * MIB, forward_frames(70 + i)) for i in range(20)]
    for handle in handles[::2]:
        b.free(handle, frames=forward_frames(90))
    b.oom(6 * MIB, device_free=3 * MIB)
    return b.snapshot()


def test_fragmentation_and_the_oom_event():
    facts = _facts(_fragmented_oom())
    frag = facts.fragmentation
    assert frag.cached_free_bytes == 40 * MIB
    assert frag.inactive_split_blocks == 10
    assert frag.inactive_split_bytes == 40 * MIB
    assert frag.largest_free_block_bytes == 4 * MIB
    assert frag.failed_request_bytes == 6 * MIB
    assert frag.request_would_fit_cached is True
    oom = facts.oom
    assert (oom.requested_bytes, oom.device_free_bytes) == (6 * MIB, 3 * MIB)
    assert (oom.allocated_bytes, oom.reserved_bytes) == (40 * MIB, 80 * MIB)
    assert int(oom.sites["bytes"].sum()) == 40 * MIB
    assert oom.sites.height == 10  # ten live tensors, one line each


def test_segment_map_covers_each_segment():
    facts = _facts(_fragmented_oom())
    seg = facts.segment_map.filter(pl.col("segment") == 0).sort("offset")
    assert int(seg["size"].sum()) == 80 * MIB
    assert seg["offset"].to_list()[:3] == [0, 4 * MIB, 8 * MIB]
    assert seg["state"].to_list()[:2] == ["inactive", "active_allocated"]
