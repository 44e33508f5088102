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
    # no trace at all: no recording to be "before"; the blocks simply have no frames
    assert facts.sites_at_dump["site"].to_list() == ["(no frames)"]


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


def test_a_block_awaiting_free_still_holds_memory():
    # freed on one stream while another still uses it: free_requested, no free_completed
    b = SnapshotBuilder()
    keep = b.alloc(6 * MIB, forward_frames(11))
    pending = b.alloc(4 * MIB, forward_frames(12))
    b.free(pending, frames=forward_frames(13), pending=True)
    raw = b.snapshot()
    facts = _facts(raw)
    assert facts.dump.allocated_bytes == 6 * MIB
    assert facts.dump.awaiting_free_bytes == 4 * MIB
    assert facts.peak.allocated_bytes == 10 * MIB  # counted until free_completed
    assert facts.timeline["allocated_bytes"].to_list()[-1] == facts.dump.active_bytes
    del keep


def test_expandable_segments_map_and_unmap_move_reserved():
    """Hand-written entries as the allocator writes them with expandable_segments:True:
    one 64 MiB segment mapped in two 32 MiB steps, then 32 MiB unmapped."""
    base = 0x7F0000000000
    entries = [
        {"action": "segment_map", "addr": base, "size": 32 * MIB, "stream": 0, "time_us": 0},
        {"action": "alloc", "addr": base, "size": 20 * MIB, "stream": 0, "time_us": 10},
        {"action": "segment_map", "addr": base + 32 * MIB, "size": 32 * MIB, "time_us": 20},
        {"action": "alloc", "addr": base + 20 * MIB, "size": 30 * MIB, "time_us": 30},
        {"action": "free_requested", "addr": base + 20 * MIB, "size": 30 * MIB, "time_us": 40},
        {"action": "free_completed", "addr": base + 20 * MIB, "size": 30 * MIB, "time_us": 40},
        {"action": "segment_unmap", "addr": base + 32 * MIB, "size": 32 * MIB, "time_us": 50},
    ]
    raw = {
        "segments": [
            {
                "device": 0,
                "address": base,
                "total_size": 32 * MIB,
                "is_expandable": True,
                "allocated_size": 20 * MIB,
                "blocks": [
                    {"address": base, "size": 20 * MIB, "state": "active_allocated"},
                    {"address": base + 20 * MIB, "size": 12 * MIB, "state": "inactive"},
                ],
            }
        ],
        "device_traces": [entries],
        "allocator_settings": {"expandable_segments": True},
    }
    facts = _facts(raw)
    assert facts.timeline["reserved_bytes"].to_list() == [
        m * MIB for m in (32, 32, 64, 64, 64, 64, 32)
    ]
    assert (facts.peak.allocated_bytes, facts.peak.seq, facts.peak.time_s) == (50 * MIB, 3, 30e-6)
    assert facts.peak.max_reserved_bytes == 64 * MIB
    assert facts.fragmentation.expandable_segments is True


def test_two_devices_analyse_the_one_with_most_reserved():
    raw = training_snapshot()
    small = {
        "device": 1,
        "address": 1 << 40,
        "total_size": 2 * MIB,
        "blocks": [{"address": 1 << 40, "size": 2 * MIB, "state": "inactive"}],
    }
    raw["segments"].append(small)
    facts = _facts(raw)
    assert facts.device == 0
    assert any("devices 0, 1" in w for w in facts.warnings)


def test_a_ring_buffer_that_dropped_its_oldest_entries_still_gives_true_levels():
    """max_entries keeps the newest entries only: anchored at the dump, the levels of the
    kept entries are those of the full trace, entry for entry."""
    full = training_snapshot(steps=3, leak_bytes_per_step=2 * MIB)
    facts_full = _facts(full)
    dropped = 40
    cut = {**full, "device_traces": [full["device_traces"][0][dropped:]]}
    facts_cut = _facts(cut)
    levels_full = facts_full.timeline["allocated_bytes"].to_list()[dropped:]
    assert facts_cut.timeline["allocated_bytes"].to_list() == levels_full
    assert (
        facts_cut.timeline["reserved_bytes"].to_list()
        == (facts_full.timeline["reserved_bytes"].to_list()[dropped:])
    )
    # blocks allocated before the kept window still count: those live at dump by their own
    # frames (the parameters), those freed in the window as "before the recording", unknown
    sites = facts_cut.sites_at_peak
    assert int(sites["bytes"].sum()) == facts_cut.peak.allocated_bytes
    assert facts_cut.category_bytes("parameters") == 64 * MIB
    before = sites.filter(pl.col("site") == "(before the recording)")
    assert before.height == 1 and before["category"][0] == "unknown"


def test_a_trace_the_segments_contradict_leaves_the_peak_unknown():
    """A segment of live tensors missing from the dump (the trace says they were never
    freed): replayed back, the window would start below zero, so no level is trusted."""
    raw = training_snapshot()
    raw["segments"] = raw["segments"][:-3]
    facts = _facts(raw)
    assert facts.peak is None and facts.timeline.height == 0
    assert any("left unknown" in w for w in facts.warnings)
    # the dump state itself is still the segments' own
    assert facts.dump.reserved_bytes == sum(s["total_size"] for s in raw["segments"])
    # the rules that judge the peak stay silent (the healthy scenario fires the optimizer one)
    fired = {f.rule for f in _findings(raw)}
    assert not fired & {"activations-dominate-peak", "optimizer-state-dominates"}
    assert "optimizer-state-dominates" in {f.rule for f in _findings(training_snapshot())}


def _findings(raw):
    from diagnostics.rules.engine import run_rules
    from diagnostics.rules.snapshot_evidence import snapshot_inputs

    return run_rules(snapshot_inputs(raw)).findings
