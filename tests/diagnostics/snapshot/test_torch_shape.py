"""Snapshots shaped as torch writes them, which real ones recorded by other projects show
(six, torch 2.1 to 2.7, read while writing this): frame dicts shared among all stacks,
each free's two entries sharing one frames list (75-87 % of the opcodes memo gets), and
trace sizes in the bytes asked for, not the blocks' rounded sizes."""

from __future__ import annotations

import pickle
import pickletools

import polars as pl
import pytest

from diagnostics.snapshot.analysis import analyse_snapshot
from diagnostics.snapshot.examples import MIB, SnapshotBuilder, deep_stack_snapshot, user_frames
from diagnostics.snapshot.reader import parse_snapshot, read_snapshot


@pytest.fixture(scope="module")
def deep_pickle(tmp_path_factory):
    raw = deep_stack_snapshot()
    path = tmp_path_factory.mktemp("deep") / "deep.pickle"
    path.write_bytes(pickle.dumps(raw, protocol=4))
    return raw, path


def _memo_get_share(data: bytes) -> float:
    names = [op.name for op, _arg, _pos in pickletools.genops(data)]
    return sum(n in ("BINGET", "LONG_BINGET", "GET") for n in names) / len(names)


def test_the_fixture_pickles_as_real_snapshots_do(deep_pickle):
    raw, path = deep_pickle
    assert len(raw["device_traces"][0]) >= 30_000
    assert _memo_get_share(path.read_bytes()) >= 0.70
    frames = [f for e in raw["device_traces"][0] for f in e["frames"]]
    assert len({id(f) for f in frames}) < 500 < len(frames)  # shared, as torch shares them


def test_a_torch_shaped_snapshot_is_read_and_its_dump_is_the_segment_sums(deep_pickle):
    raw, path = deep_pickle
    facts = analyse_snapshot(read_snapshot(path))
    segments = raw["segments"]
    assert facts.dump.reserved_bytes == sum(s["total_size"] for s in segments)
    assert facts.dump.allocated_bytes == sum(s["allocated_size"] for s in segments)
    assert facts.dump.active_bytes == sum(s["active_size"] for s in segments)
    assert int(facts.sites_at_dump["bytes"].sum()) == facts.dump.active_bytes
    assert facts.warnings == ()
    assert facts.entries == len(raw["device_traces"][0])
    # the model's lines hold what is live at dump: 100 weights and 100 gradients of 1 MiB
    assert int(facts.sites_at_dump["blocks"].sum()) == 200


def test_trace_sizes_are_the_requested_bytes_and_the_levels_agree():
    # 1000 bytes asked for is a 1024-byte block: the trace says 1000, the block 1024
    b = SnapshotBuilder()
    kept = b.alloc(1000, user_frames(10))
    temp = b.alloc(3 * MIB + 100, user_frames(11))
    b.free(temp, frames=user_frames(12))
    raw = b.snapshot()
    assert [e["size"] for e in raw["device_traces"][0] if e["action"] == "alloc"] == [
        1000,
        3 * MIB + 100,
    ]
    facts = analyse_snapshot(parse_snapshot(raw, "requested.pickle"))
    assert facts.warnings == ()
    assert facts.dump.allocated_bytes == 1024  # the block, as the segments sum it
    assert facts.peak is not None
    assert facts.peak.allocated_bytes == 1000 + 3 * MIB + 100  # in the trace's bytes
    assert facts.timeline["allocated_bytes"].to_list()[-1] == 1000
    assert kept in {blk["address"] for s in raw["segments"] for blk in s["blocks"]}


def test_a_trace_that_disagrees_with_the_dump_says_so_and_keeps_the_dump(tmp_path):
    # the dump holds one 1 MiB tensor; the trace claims four 1 MiB allocations elsewhere,
    # never freed: the levels are unknown and what was held at dump is the dump's own
    raw = {
        "segments": [
            {
                "device": 0,
                "address": 1 << 30,
                "total_size": 2 * MIB,
                "allocated_size": MIB,
                "blocks": [
                    {
                        "address": 1 << 30,
                        "size": MIB,
                        "requested_size": MIB,
                        "state": "active_allocated",
                    },
                    {
                        "address": (1 << 30) + MIB,
                        "size": MIB,
                        "requested_size": 0,
                        "state": "inactive",
                    },
                ],
            }
        ],
        "device_traces": [
            [
                {
                    "action": "alloc",
                    "addr": (2 << 30) + i * MIB,
                    "size": MIB,
                    "stream": 0,
                    "frames": [],
                }
                for i in range(4)
            ]
        ],
    }
    facts = analyse_snapshot(parse_snapshot(raw, "disagree.pickle"))
    assert facts.peak is None
    assert int(facts.sites_at_dump["bytes"].sum()) == MIB == facts.dump.allocated_bytes
    assert any("disagree" in w for w in facts.warnings)
    from diagnostics.report.memory import snapshot_rows

    rows = dict(snapshot_rows(facts.to_dict()))
    assert "4 trace entries and the segments disagree" in rows["peak"]
    assert "_record_memory_history was off" not in rows["peak"]


def test_blocks_larger_than_their_segment_leave_the_free_size_unknown():
    raw = {
        "segments": [
            {
                "device": 0,
                "address": 4096,
                "total_size": MIB,
                "blocks": [
                    {"address": 4096, "size": 2048 * MIB, "state": "active_allocated"},
                ],
            }
        ],
        "device_traces": [[]],
    }
    facts = analyse_snapshot(parse_snapshot(raw, "overfull.pickle"))
    assert facts.fragmentation.cached_free_bytes is None
    assert any("larger than the segment" in w for w in facts.warnings)
    from diagnostics.report.memory import snapshot_rows

    text = dict(snapshot_rows(facts.to_dict()))["fragmentation"]
    assert text.startswith("unknown cached free")
    assert "-" not in text.split(";")[0]


def test_each_real_generation_reads_without_a_warning():
    """Both schema generations and a pending free, built as torch writes them: the trace
    and the segments agree, so the analysis has no warning to give."""
    for new_schema in (True, False):
        b = SnapshotBuilder(new_schema=new_schema)
        a = b.alloc(5 * MIB + 3, user_frames(1))
        c = b.alloc(700, user_frames(2))
        b.free(a, frames=user_frames(3), pending=True)
        b.free(c, frames=user_frames(4))
        facts = analyse_snapshot(parse_snapshot(b.snapshot(), "gen.pickle"))
        assert facts.warnings == ()
        assert facts.peak is not None and facts.peak.allocated_bytes == 5 * MIB + 3 + 700
        states = facts.segment_map.filter(pl.col("state") != "inactive")["state"].to_list()
        assert states == ["active_awaiting_free"]
