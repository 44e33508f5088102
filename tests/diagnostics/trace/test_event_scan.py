"""The compiled event scanner reads a chunk exactly as msgspec plus ``columns()`` do, or
declines it: on every shared trace and H200 run, on every kind of event and form of value
the format allows, and on thousands of damaged copies of real chunks."""

from __future__ import annotations

import gzip
import json
import random
import resource
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import polars as pl
import pytest

from diagnostics.errors import InputError
from diagnostics.trace import decode, event_scan, loader
from diagnostics.trace.budget import Budget, Limits
from diagnostics.trace.chunk_decode import EVENTS_DECODER, RAW_LIST_DECODER
from diagnostics.trace.columns import (
    _CPU_CATS,
    _GPU_CATS,
    _RUNTIME_CATS,
    RAW_EVENT_SCHEMA,
    RAW_FLOW_SCHEMA,
    TsClock,
    columns,
)
from diagnostics.trace.event_scan import scanned_columns
from diagnostics.trace.loader import load_trace_file
from tests.diagnostics.trace.helpers import SHARED_TRACES

GPU_RUNS = SHARED_TRACES.parent / "gpu-runs"
REAL_FILES = sorted(SHARED_TRACES.glob("*.json.gz")) + sorted(GPU_RUNS.rglob("*.pt.trace.json*"))


def _python_path(text: bytes) -> tuple[pl.DataFrame, pl.DataFrame | None, list[Any]]:
    return columns(EVENTS_DECODER.decode(text), TsClock.with_base(None))


def assert_read_alike(text: bytes) -> None:
    """The scanner reads ``text`` and gives what the msgspec path gives."""
    scanned = scanned_columns(text, TsClock.with_base(None))
    assert scanned is not None, "declined"
    frame, flows, names = scanned
    want_frame, want_flows, want_names = _python_path(text)
    assert frame.schema == pl.Schema(RAW_EVENT_SCHEMA)
    assert frame.equals(want_frame), [
        c for c in frame.columns if not frame[c].equals(want_frame[c])
    ]
    if want_flows is None:
        assert flows is None
    else:
        assert flows is not None and flows.schema == pl.Schema(RAW_FLOW_SCHEMA)
        assert flows.equals(want_flows)
    assert names == want_names


def chunk(events: list[Any], indent: int | None = None) -> bytes:
    return json.dumps(events, indent=indent, ensure_ascii=False).encode()


def test_the_scanner_is_built():
    # scripts/setup.sh builds it (a C compiler is part of the machine); without it every
    # chunk takes the msgspec path, 3-4x slower, and nothing else here would be tested
    assert event_scan.BUILT


EVERY_ARG = {
    "device": 0,
    "stream": 7,
    "correlation": 11,
    "External id": 12,
    "external id": 13,
    "bytes": 4096,
    "Bytes": "512",
    "Total Allocated": 1000,
    "Total Reserved": 2000,
    "Device Type": 1,
    "Device Id": 0,
    "name": "thread 1",
    "Input type": ["float", "c10::BFloat16", "", "ScalarList"],
    "dtype": "Half",
    "Input Dims": [[256, 768], [], [[1, 2], [3]], -4],
    "Concrete Inputs": ["", "1", "[2, 2]", "False", None, True, 3],
    "Sequence number": 5,
    "Fwd thread id": "1",
    "blocks per SM": 1.5,
    "est. achieved occupancy %": 50,
    "Collective name": "allreduce",
    "In msg nelems": 1024,
    "Out msg nelems": "1024",
    "Group size": 8,
    "Process Group Name": "0",
    "Process Group Ranks": "[0, 1]",
    "grid": [1, 2, 3],
    "Call stack": 'a.py(1): f;\nb.py(2): "g"',
}

CATEGORIES = [
    *_GPU_CATS,
    *_RUNTIME_CATS,
    *_CPU_CATS,
    "Kernel",
    "CUDA_RUNTIME",
    "Operator",
    "cpu_instant_event",
    "gpu_user_annotation",
    "ac2g",
    "",
    None,
]


@pytest.mark.parametrize("indent", [None, 2])
def test_every_kind_of_event_keeps_the_args_its_kind_carries(indent):
    # a kernel's row keeps its stream, a CPU op's row its shapes, an unknown category's
    # every key; [memory] instants and nameless events are kinds of their own
    events = []
    for cat in CATEGORIES:
        for name in ("aten::mm", "[memory]", None):
            for ph in ("X", "i", "M", "s", "f", "t"):
                event = {"ph": ph, "cat": cat, "name": name, "pid": 1, "tid": 2, "ts": 10.5}
                event.update(dur=2.25, id=len(events), args=EVERY_ARG)
                events.append({k: v for k, v in event.items() if v is not None})
    assert_read_alike(chunk(events, indent))


FLOWS = [
    {"ph": "s", "id": "123", "pid": "1", "tid": 1, "ts": 2, "cat": "ac2g", "name": "ac2g"},
    {"ph": "f", "id": "flow 1", "pid": 1, "tid": 1, "ts": 3, "cat": "ac2g", "bp": "e"},
]

FORMS = [
    # timestamps and durations in every number form (all below 2^53)
    {"ph": "X", "name": "a", "ts": 1669783687759332.0, "dur": 1.7976931348623157e308},
    {"ph": "X", "name": "a", "ts": 5963378483443.470, "dur": 5e-324},
    {"ph": "X", "name": "a", "ts": 1e3, "dur": 123456789.123456789},
    {"ph": "X", "name": "a", "ts": -5.5, "dur": -0.0},
    {"ph": "X", "name": "a", "ts": 12, "dur": 0.30000000000000004},
    {"ph": "X", "name": "a", "ts": 9007199254740992, "dur": 1e-7},
    {"ph": "X", "name": "a", "ts": 0.1, "dur": 2.5e-300, "args": {"blocks per SM": 1e22}},
    # pids and tids as PyTorch 1.x and Kineto's own rows write them
    {"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": "25738", "tid": "stream 7"},
    {"ph": "i", "name": "a", "ts": 1, "pid": "Spans", "tid": "", "s": "g"},
    {"ph": "M", "name": "process_name", "pid": "Spans", "tid": 0, "args": {"name": "Spans"}},
    {"ph": "M", "name": "thread_name", "pid": 3, "tid": "7", "args": {"name": 7}},
    *FLOWS,
    {"ph": "X", "name": "a", "ts": 1, "dur": 1, "id": "not a flow"},
    # text: non-ASCII kept as it is; escapes and nesting in what is skipped
    {"ph": "X", "name": "résumé ✓ 训练 😀", "cat": "user_annotation", "ts": 1, "dur": 1},
    {"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"Call stack": 'q"\\\t\u00e9\u2028'}},
    {"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"name": {"x": [True, False, None]}}},
    {"ph": "X", "name": "a", "ts": 1, "dur": 1, "extra": [[[[1.5e-3]]], {"": {}}, [], "\u0000"]},
    # the Any-typed dtypes in each shape
    *(
        {"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1, "args": args}
        for args in (
            {"Input type": "c10::Half"},
            {"dtype": ["c10::BFloat16"]},
            {"dtype": 3},
            {"Input type": None},
            {"Input type": []},
            {"Input Dims": []},
            {"dtype": {"a": 1}},
        )
    ),
    # empty and null
    {},
    {"ph": None, "name": None, "cat": None, "ts": None, "dur": None, "pid": None, "args": {}},
    {"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {k: None for k in EVERY_ARG}},
]


def test_values_in_every_form_the_format_allows_are_read_as_msgspec_reads_them():
    assert_read_alike(chunk(FORMS))
    assert_read_alike(chunk(FORMS, indent=4).replace(b"\n", b"\r\n\t"))


def test_a_chunk_of_flows_alone_gives_an_empty_event_table():
    assert_read_alike(chunk(FLOWS))


def _one(event: str) -> bytes:
    return ("[" + event + "]").encode()


DECLINED = {
    # what the Python path reads differently from a plain copy
    "escaped name": _one('{"ph":"X","name":"a\\"b","ts":1,"dur":1}'),
    "escaped key": _one('{"p\\u0068":"X","name":"a","ts":1,"dur":1}'),
    "escaped text in dims": _one('{"ph":"X","args":{"Input Dims":["\\n"]}}'),
    "float pid": _one('{"ph":"X","pid":1.5}'),
    "signed pid string": _one('{"ph":"X","pid":"+5"}'),
    "zero-led pid string": _one('{"ph":"X","pid":"007"}'),
    "exponent pid string": _one('{"ph":"X","pid":"1e3"}'),
    "bool tid": _one('{"ph":"X","tid":true}'),
    "float in dims": _one('{"ph":"X","args":{"Input Dims":[[1.5]]}}'),
    "negative zero in dims": _one('{"ph":"X","args":{"Input Dims":[-0]}}'),
    "object in concrete inputs": _one('{"ph":"X","args":{"Concrete Inputs":[{}]}}'),
    "dims not a list": _one('{"ph":"X","args":{"Input Dims":"[1]"}}'),
    "ts int beyond 2^53": _one('{"ph":"X","ts":9007199254740993}'),
    "ts float beyond 2^53": _one('{"ph":"X","ts":1.7e16}'),
    "int beyond 18 digits": _one('{"ph":"X","args":{"device":1234567890123456789}}'),
    "string device": _one('{"ph":"X","args":{"device":"0"}}'),
    "float stream": _one('{"ph":"X","args":{"stream":7.0}}'),
    "number collective name": _one('{"ph":"X","args":{"Collective name":3}}'),
    "non-ASCII category": _one('{"ph":"X","cat":"\u212aernel","name":"k"}'),
    "args null": _one('{"ph":"X","args":null}'),
    "args a list": _one('{"ph":"X","args":[]}'),
    "name a number": _one('{"ph":"X","name":3}'),
    "key twice": _one('{"ph":"X","ph":"i"}'),
    "args key twice": _one('{"ph":"X","args":{"stream":1,"stream":2}}'),
    "begin": _one('{"ph":"B","name":"a","ts":1}'),
    "end": _one('{"ph":"E","ts":2}'),
    "lower-case complete": _one('{"ph":"x","name":"a","ts":1,"dur":1}'),
    "older instant": _one('{"ph":"I","name":"a","ts":1}'),
    "an event not an object": b'[{"ph":"X"},3]',
    "no events": b"[]",
    "too deep": _one('{"ph":"X","a":' + "[" * 100 + "]" * 100 + "}"),
    # not JSON at all
    "truncated": b'[{"ph":"X","name":"a"',
    "trailing comma": b'[{"ph":"X"},]',
    "leading zero": _one('{"ph":"X","ts":01}'),
    "bare fraction": _one('{"ph":"X","ts":.5}'),
    "empty fraction": _one('{"ph":"X","ts":1.}'),
    "NaN": _one('{"ph":"X","ts":NaN}'),
    "control character": _one('{"ph":"X","name":"a\tb"}'),
    "invalid UTF-8": b'[{"ph":"X","name":"a\xff"}]',
    "overlong UTF-8": b'[{"ph":"X","name":"\xc0\xaf"}]',
    "encoded surrogate": b'[{"ph":"X","name":"\xed\xa0\x80"}]',
    "lone surrogate escape": _one('{"ph":"X","x":"\\ud800"}'),
    "bad escape": _one('{"ph":"X","x":"\\q"}'),
    "single quotes": b"[{'ph':'X'}]",
    "missing comma": b'[{"ph":"X"} {"ph":"X"}]',
    "text after the array": b'[{"ph":"X"}] x',
    "not an array": b'{"ph":"X"}',
}


@pytest.mark.parametrize("text", DECLINED.values(), ids=DECLINED.keys())
def test_what_the_scanner_declines_is_left_to_the_msgspec_path(text):
    assert event_scan._event_scan.scan(text) is None


def _real_chunk(path: Path, count: int) -> bytes:
    with gzip.open(path) as handle:
        document = msgspec.json.decode(handle.read(), type=dict[str, msgspec.Raw])
    raws = RAW_LIST_DECODER.decode(document["traceEvents"])
    return b"[" + b",".join(bytes(raw) for raw in raws[:count]) + b"]"


_SIGNIFICANT = b'{}[]",:\\ -.0123456789eEaftnu\x00\x7f\xc3\xa9\xff'


def _mutated(text: bytes, rng: random.Random) -> bytes:
    data = bytearray(text)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data))
        kind = rng.random()
        if kind < 0.45:
            data[at] = rng.choice(_SIGNIFICANT)
        elif kind < 0.65:
            del data[at]
        elif kind < 0.85:
            data[at:at] = bytes([rng.choice(_SIGNIFICANT)])
        else:
            end = min(len(data), at + rng.randint(1, 40))
            data[at:at] = data[at:end]  # a piece repeated: keys twice, values doubled
    return bytes(data)


@pytest.mark.parametrize(
    "source",
    [
        SHARED_TRACES / "kineto_resnet50_num_workers_0.pt.trace.json.gz",  # PyTorch 1.9
        SHARED_TRACES / "tracelens_mi300x_resnet_ddp_actckpt_rank0_of_8.json.gz",  # ROCm
        next(GPU_RUNS.rglob("gpu-healthy*.pt.trace.json*")),  # this project's, H200
    ],
    ids=["pytorch-1.9", "rocm", "h200"],
)
def test_damaged_real_chunks_are_read_as_msgspec_reads_them_or_declined(source):
    # whatever the damage, the scanner never accepts what msgspec refuses and never
    # reads a value differently: it gives the same columns or declines
    text = _real_chunk(source, 120)
    assert_read_alike(text)
    rng = random.Random(20261206)
    outcomes: Counter[str] = Counter()
    for _ in range(1500):
        damaged = _mutated(text, rng)
        if event_scan._event_scan.scan(damaged) is None:
            outcomes["declined"] += 1
            continue
        outcomes["read"] += 1
        assert_read_alike(damaged)
    # both outcomes happen (a digit changed is still a valid chunk), so both are checked
    assert outcomes["read"] > 50 and outcomes["declined"] > 500, outcomes


def _load(path: Path, **kwargs: Any):
    return load_trace_file(path, max_events=10**8, max_decompressed_bytes=1 << 36, **kwargs)


@pytest.mark.parametrize("path", REAL_FILES, ids=[p.name[:60] for p in REAL_FILES])
def test_every_shared_trace_and_h200_run_loads_the_same_with_the_scanner(path, monkeypatch):
    assert len(REAL_FILES) == 24  # twelve shared traces, twelve H200 runs
    chunks: Counter[str] = Counter()

    def counted(text, clock):
        scanned = event_scan.scanned_columns(text, clock)
        chunks["scanned" if scanned is not None else "declined"] += 1
        return scanned

    monkeypatch.setattr(decode, "scanned_columns", counted)
    scanned = _load(path, parallel_decode=False)
    # every chunk of every real trace is the scanner's: none falls back to msgspec
    assert chunks["scanned"] >= 1 and chunks["declined"] == 0, chunks
    monkeypatch.setattr(event_scan, "_event_scan", None)
    plain = _load(path, parallel_decode=False)
    assert scanned.events.schema == plain.events.schema
    assert scanned.events.equals(plain.events)
    assert scanned.flows.equals(plain.flows)
    assert scanned.metadata == plain.metadata


def test_the_decode_helper_scans_its_chunks_to_the_same_table(monkeypatch):
    # the helper process scans the chunks it takes (chunk_decode.decode_chunk)
    path = SHARED_TRACES / "hta_v100_rank1_of_2_large.json.gz"
    helped = _load(path, parallel_decode=True, chunk_bytes=1 << 20)
    monkeypatch.setattr(event_scan, "_event_scan", None)
    plain = _load(path, parallel_decode=False, chunk_bytes=1 << 20)
    assert helped.events.equals(plain.events)
    assert helped.flows.equals(plain.flows)
    assert helped.metadata == plain.metadata


def _ops(n: int, start: int = 0) -> bytes:
    return chunk(
        [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"aten::op_{i % 7}",
                "pid": 1,
                "tid": 2,
                "ts": 1000.0 + i,
                "dur": 0.5,
                "args": {"External id": i},
            }
            for i in range(start, start + n)
        ]
    )


@pytest.fixture
def spares_kept():
    """Spare blocks kept as a load keeps them, given back after the test."""
    scanner = event_scan._event_scan
    assert scanner.spare() == 0
    scanner.keep_spare()
    yield scanner
    scanner.release_spare()


def test_a_dropped_chunks_column_blocks_serve_the_next_chunk(spares_kept):
    # 20,000 rows: each number column is 160 KB, a mapped block of its own. Mapped anew for
    # each chunk, its pages were faulted in again (1,400 faults a chunk); kept, they are not
    faults = []
    for start in range(4):
        text = _ops(20_000, start)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        scanned = scanned_columns(text, TsClock.with_base(None))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        assert scanned is not None
        frame = scanned[0]  # a reused block holds this chunk's values, not the last one's
        assert frame["ts"].to_list() == [1000.0 + start + i for i in range(20_000)]
        assert frame["external_id"].to_list() == list(range(start, start + 20_000))
        del scanned, frame  # polars lets go of the chunk's columns: their blocks are kept
    assert faults[0] > 1_000 and faults[-1] < 200, faults


def _scanned_and_dropped(chunks: int) -> None:
    scanned = [scanned_columns(_ops(100_000), TsClock.with_base(None)) for _ in range(chunks)]
    del scanned  # the chunks' blocks (about 8 MB each) let go of at once


def test_the_spare_blocks_are_bounded(spares_kept):
    _scanned_and_dropped(20)
    assert 16 << 20 < spares_kept.spare() <= 32 << 20


def test_blocks_freed_with_no_load_under_way_are_not_kept():
    # an event table dropped after its load, say: nothing would ever reuse them
    _scanned_and_dropped(3)
    assert event_scan._event_scan.spare() == 0


def test_spares_stay_until_the_last_overlapping_load_releases_them():
    scanner = event_scan._event_scan
    scanner.keep_spare()
    scanner.keep_spare()  # a second load, on another thread
    _scanned_and_dropped(3)
    held = scanner.spare()
    assert held > 0
    assert scanner.release_spare() == 0  # the first load ends: the second one reuses them
    assert scanner.spare() == held
    assert scanner.release_spare() == held
    assert scanner.spare() == 0


def test_the_spare_blocks_serve_a_load_and_are_given_back_when_it_ends(tmp_path, monkeypatch):
    scanner = event_scan._event_scan
    held_at_the_end: list[int] = []

    def release() -> None:
        held_at_the_end.append(scanner.spare())
        event_scan.release_spare_blocks()

    monkeypatch.setattr(loader, "release_spare_blocks", release)
    path = tmp_path / "trace.json"
    path.write_bytes(b'{"traceEvents": ' + _ops(100_000) + b"}")
    loaded = _load(path, parallel_decode=False, chunk_bytes=1 << 20)
    assert loaded.events.height == 100_000
    assert held_at_the_end[0] > 1 << 20  # the chunks' dropped blocks, kept while it ran
    assert scanner.spare() == 0


def test_a_refused_load_gives_the_spare_blocks_back_too(tmp_path):
    # refused past its event budget after a few chunks: a served app goes on to other files
    path = tmp_path / "trace.json"
    path.write_bytes(b'{"traceEvents": ' + _ops(100_000) + b"}")
    budget = Budget(Limits(1 << 36, 60_000))
    with pytest.raises(InputError, match="60,000 events"):
        load_trace_file(path, budget=budget, parallel_decode=False, chunk_bytes=1 << 20)
    assert event_scan._event_scan.spare() == 0
