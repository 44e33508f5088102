"""The restricted snapshot reader: every real form reads, nothing in a pickle ever runs,
and every bad file is one InputError line naming the file and the field.

Snapshots are built here as the plain dicts torch/cuda/memory.py's ``_snapshot`` docstring
documents (a real one needs a CUDA device), and pickled with ``pickle.dumps``.
"""

from __future__ import annotations

import gzip
import pickle
import pickletools

import pytest

from diagnostics.errors import InputError
from diagnostics.snapshot.examples import MIB, SnapshotBuilder, forward_frames, training_snapshot
from diagnostics.snapshot.reader import read_snapshot
from diagnostics.trace.budget import BudgetExceeded


def _write(tmp_path, obj, name="snap.pickle", protocol=4):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


def _minimal(state: str) -> dict:
    """One 2 MiB segment: a 1 MiB block in ``state`` and a 1 MiB free block."""
    return {
        "segments": [
            {
                "device": 0,
                "address": 4096,
                "total_size": 2 * MIB,
                "stream": 0,
                "segment_type": "large",
                "allocated_size": MIB if state == "active_allocated" else 0,
                "active_size": MIB,
                "blocks": [
                    {"address": 4096, "size": MIB, "requested_size": MIB - 8, "state": state},
                    {"address": 4096 + MIB, "size": MIB, "requested_size": 0, "state": "inactive"},
                ],
            }
        ],
        "device_traces": [[]],
    }


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_new_schema_reads_at_every_protocol(tmp_path, protocol):
    raw = training_snapshot(new_schema=True)
    snap = read_snapshot(_write(tmp_path, raw, protocol=protocol))
    assert snap.generation == "new"
    assert snap.pickle_protocol == protocol
    assert snap.allocator_settings["expandable_segments"] is False
    assert len(snap.annotations) == len(raw["external_annotations"]) == 4
    assert snap.entries.height == len(raw["device_traces"][0])
    assert snap.has_times
    # every block of every segment, as the dict holds them
    assert snap.blocks.height == sum(len(s["blocks"]) for s in raw["segments"])
    assert snap.entries_with_compile_context == 0  # written empty by the builder


def test_old_schema_without_allocator_settings_or_times(tmp_path):
    raw = training_snapshot(new_schema=False)
    assert "allocator_settings" not in raw and "time_us" not in raw["device_traces"][0][0]
    snap = read_snapshot(_write(tmp_path, raw, protocol=2))
    assert snap.generation == "old"
    assert snap.allocator_settings is None
    assert not snap.has_times
    assert snap.entries.height == len(raw["device_traces"][0])


@pytest.mark.parametrize("written", ["active_pending_free", "active_awaiting_free"])
def test_pending_free_as_written_and_as_documented(tmp_path, written):
    snap = read_snapshot(_write(tmp_path, _minimal(written)))
    assert snap.blocks["state"].to_list() == ["active_awaiting_free", "inactive"]


def test_legacy_bare_list_of_segments(tmp_path):
    # memory_viz's _read accepts a bare list as "segments only"
    snap = read_snapshot(_write(tmp_path, _minimal("active_allocated")["segments"]))
    assert snap.segments.height == 1 and snap.entries.height == 0


class _WritesMarker:
    """Pickles as a call to exec that writes a marker file, as a hostile snapshot would."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


@pytest.mark.parametrize(("protocol", "opcode"), [(2, "GLOBAL"), (4, "STACK_GLOBAL")])
def test_a_global_is_refused_and_nothing_runs(tmp_path, protocol, opcode):
    marker = tmp_path / "marker_a"
    hostile = {**_minimal("active_allocated"), "device_traces": [[_WritesMarker(marker)]]}
    data = pickle.dumps(hostile, protocol=protocol)
    names = {op.name for op, _, _ in pickletools.genops(data)}
    assert {opcode, "REDUCE"} <= names
    # the crafted pickle is live: plain pickle.loads runs it (proved on another marker)
    probe = tmp_path / "marker_b"  # same length: the pickle's string sizes hold
    pickle.loads(data.replace(str(marker).encode(), str(probe).encode()))
    assert probe.read_text() == "ran"

    path = tmp_path / "hostile.pickle"
    path.write_bytes(data)
    with pytest.raises(InputError) as caught:
        read_snapshot(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path))
    assert "exec" in message and "nothing was run" in message
    assert not marker.exists()


def test_truncated_file_is_one_line(tmp_path):
    data = pickle.dumps(training_snapshot(), protocol=4)
    path = tmp_path / "cut.pickle"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated|not a readable pickle"):
        read_snapshot(path)


@pytest.mark.parametrize("value", [42, "segments", (1, 2), None])
def test_wrong_top_level_type(tmp_path, value):
    with pytest.raises(InputError, match="not a CUDA memory snapshot"):
        read_snapshot(_write(tmp_path, value))


def test_dict_without_segments(tmp_path):
    with pytest.raises(InputError, match="no 'segments' key"):
        read_snapshot(_write(tmp_path, {"traceEvents": []}))


def test_field_of_the_wrong_type_names_the_field(tmp_path):
    raw = _minimal("active_allocated")
    raw["segments"][0]["blocks"][1]["size"] = "1 MiB"
    with pytest.raises(InputError, match=r"segments\[0\]\.blocks\[1\]\.size: expected an integer"):
        read_snapshot(_write(tmp_path, raw))


def test_unknown_block_state_names_the_field(tmp_path):
    with pytest.raises(InputError, match=r"blocks\[0\]\.state: unknown state 'pinned'"):
        read_snapshot(_write(tmp_path, _minimal("pinned")))


def test_gzip_snapshot_reads(tmp_path):
    raw = training_snapshot()
    path = tmp_path / "snap.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(raw, protocol=4)))
    assert read_snapshot(path).entries.height == len(raw["device_traces"][0])


def test_byte_cap_counts_decompressed_bytes(tmp_path):
    raw = training_snapshot()
    data = pickle.dumps(raw, protocol=4)
    gz = tmp_path / "snap.pickle.gz"
    gz.write_bytes(gzip.compress(data))
    assert gz.stat().st_size < len(data) // 2  # the cap sits between the two sizes
    with pytest.raises(BudgetExceeded, match="larger than the .* limit .decompressed."):
        read_snapshot(gz, max_bytes=len(data) - 1)
    assert read_snapshot(gz, max_bytes=len(data)).entries.height > 0


def test_shared_references_bomb_is_refused(tmp_path):
    # 20,000 references to one list of 20,000 blocks: 400 million blocks from ~100 KB
    blocks = [{"size": 512, "state": "inactive"}] * 20_000
    seg = {"total_size": 512 * 20_000, "blocks": blocks}
    with pytest.raises(InputError, match="more items than its size allows"):
        read_snapshot(_write(tmp_path, {"segments": [seg] * 20_000}))


def test_display_name_is_used(tmp_path):
    path = _write(tmp_path, 7)
    with pytest.raises(InputError) as caught:
        read_snapshot(path, display_name="upload.pickle")
    assert str(caught.value).startswith("upload.pickle: ")


def test_pending_free_block_is_built_by_the_builder():
    b = SnapshotBuilder()
    address = b.alloc(MIB, forward_frames(10))
    b.free(address, pending=True)
    states = [blk["state"] for seg in b.snapshot()["segments"] for blk in seg["blocks"]]
    assert "active_pending_free" in states


@pytest.mark.parametrize(("key", "value"), [("time_us", "12:00"), ("size", True), ("addr", 2.5)])
def test_an_entry_field_of_the_wrong_type_names_entry_and_field(tmp_path, key, value):
    raw = training_snapshot()
    raw["device_traces"][0][7][key] = value
    with pytest.raises(InputError, match=rf"device_traces\[0\]\[7\]\.{key}: expected an integer"):
        read_snapshot(_write(tmp_path, raw))


def test_an_unknown_action_names_the_entry(tmp_path):
    raw = training_snapshot()
    raw["device_traces"][0][3]["action"] = "teleport"
    with pytest.raises(InputError, match=r"device_traces\[0\]\[3\]\.action: unknown action"):
        read_snapshot(_write(tmp_path, raw))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"Pmarker\n.", "refers to a persistent object"),  # PERSID: persistent_load refused
        (b"\x80\x05\x97.", "not a readable pickle"),  # NEXT_BUFFER without buffers
        (b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93.", "refers to builtins.eval"),  # no REDUCE
        (b"cos\nsystem\n(S'true'\ntR.", "refers to os.system"),  # protocol 0 GLOBAL + REDUCE
    ],
)
def test_crafted_opcodes_are_one_line(tmp_path, data, problem):
    path = tmp_path / "crafted.pickle"
    path.write_bytes(data)
    with pytest.raises(InputError, match=problem) as caught:
        read_snapshot(path)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("field", "value"), [("line", [1]), ("filename", {"a": 1}), ("name", 3)])
def test_a_frame_field_of_the_wrong_type_names_the_frame(tmp_path, field, value):
    raw = training_snapshot()
    entry = raw["device_traces"][0][0]
    entry["frames"] = [dict(f) for f in entry["frames"]]  # the block keeps its own frames
    entry["frames"][1][field] = value
    with pytest.raises(InputError, match=r"device_traces\[0\]\[0\]\.frames\[1\]"):
        read_snapshot(_write(tmp_path, raw))


def _nested(width: int = 50, depth: int = 4) -> list:
    value: list = [0]
    for _ in range(depth):
        value = [value] * width
    return value


@pytest.mark.parametrize("field", ["external_annotations", "allocator_settings"])
def test_a_free_form_field_that_expands_by_shared_references_is_refused(tmp_path, field):
    # under 1 KB of pickle naming one list 50 times, four deep: 6.25 M items walked as a tree
    raw = training_snapshot()
    raw[field] = [_nested()] if field == "external_annotations" else {"bomb": _nested()}
    path = _write(tmp_path, raw)
    with pytest.raises(InputError, match=rf"{field}.*more items than its size allows") as caught:
        read_snapshot(path)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("value", [["alloc"], {"a": 1}, None, 3])
def test_an_action_of_the_wrong_type_names_the_entry(tmp_path, value):
    raw = training_snapshot()
    raw["device_traces"][0][5]["action"] = value
    with pytest.raises(InputError, match=r"device_traces\[0\]\[5\]\.action: unknown action"):
        read_snapshot(_write(tmp_path, raw))


@pytest.mark.parametrize("value", [["inactive"], {"state": "inactive"}, None])
def test_a_block_state_of_the_wrong_type_names_the_block(tmp_path, value):
    raw = _minimal("active_allocated")
    raw["segments"][0]["blocks"][0]["state"] = value
    with pytest.raises(InputError, match=r"segments\[0\]\.blocks\[0\]\.state: unknown state"):
        read_snapshot(_write(tmp_path, raw))


def test_a_setting_beyond_64_bits_names_the_setting(tmp_path):
    raw = training_snapshot()
    raw["allocator_settings"]["max_split_size"] = 10**5000
    with pytest.raises(
        InputError, match=r"allocator_settings\.max_split_size: integer out of range"
    ):
        read_snapshot(_write(tmp_path, raw))


def test_expandable_segments_of_the_wrong_type_names_the_setting(tmp_path):
    raw = training_snapshot()
    raw["allocator_settings"]["expandable_segments"] = ["yes"]
    with pytest.raises(InputError, match=r"allocator_settings\.expandable_segments: expected"):
        read_snapshot(_write(tmp_path, raw))


@pytest.mark.parametrize(
    "opcode",
    [b"\x8e", b"\x96", b"\x8d"],  # BINBYTES8, BYTEARRAY8, BINUNICODE8
    ids=["bytes8", "bytearray8", "unicode8"],
)
def test_a_length_beyond_the_file_is_truncated_not_out_of_memory(tmp_path, opcode):
    # 18 bytes declaring a 2**62-byte object: bytes are allocated at their declared length
    # before they are read, which fails as a MemoryError
    path = tmp_path / "claims.pickle"
    path.write_bytes(b"\x80\x04" + opcode + (2**62).to_bytes(8, "little") + b"abcdefg")
    with pytest.raises(InputError, match="is truncated"):
        read_snapshot(path)


_WRONG_VALUES = [[1], {"k": 1}, "text", 2.5, None, True, 10**30, -(10**30), b"raw", (1, 2)]


def _field_paths(raw: dict) -> list[tuple]:
    """A path to every field the reader looks at, one of each kind."""
    seg, entry = raw["segments"][0], raw["device_traces"][0][0]
    paths: list[tuple] = [("segments",), ("device_traces",), ("allocator_settings",)]
    paths += [("external_annotations",), ("external_annotations", 0)]
    paths += [("segments", 0, key) for key in seg]
    paths += [("segments", 0, "blocks", 0, key) for key in seg["blocks"][0]]
    paths += [("device_traces", 0), ("device_traces", 0, 0)]
    paths += [("device_traces", 0, 0, key) for key in entry]
    paths += [("device_traces", 0, 0, "frames", 0, key) for key in ("filename", "line", "name")]
    paths += [("allocator_settings", key) for key in raw["allocator_settings"]]
    paths += [("external_annotations", 0, key) for key in raw["external_annotations"][0]]
    return paths


def test_every_field_of_the_wrong_type_is_one_line_or_read(tmp_path):
    """Each field the reader uses, set to each wrong kind of value: the file is read (and
    analysed, and written out as JSON) or refused in one InputError line; never another
    exception."""
    import copy
    import json

    from diagnostics.snapshot.analysis import analyse_snapshot
    from diagnostics.snapshot.reader import parse_snapshot

    base = training_snapshot(steps=1, layers=2)
    outcomes = {"read": 0, "refused": 0}
    for path in _field_paths(base):
        for value in _WRONG_VALUES:
            raw = copy.deepcopy(base)
            holder = raw
            for key in path[:-1]:
                holder = holder[key]
            holder[path[-1]] = value
            where = ".".join(map(str, path))
            try:
                snap = parse_snapshot(raw, "typed.pickle", bytes_read=10**6)
            except InputError as exc:
                assert "\n" not in str(exc), where
                outcomes["refused"] += 1
                continue
            json.dumps(analyse_snapshot(snap).to_dict(), allow_nan=False)
            outcomes["read"] += 1
    assert outcomes["refused"] > 100 and outcomes["read"] > 20, outcomes
