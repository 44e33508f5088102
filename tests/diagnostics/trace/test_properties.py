"""Property tests: whatever the event list, the loader returns a valid table or InputError.

Two families: arbitrary JSON thrown at traceEvents (anything may happen, but only those
two outcomes), and well-formed events mixed with known-bad ones (then exactly the good
complete/instant events come out, and the warning counts exactly the bad ones).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

import polars as pl
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from diagnostics.errors import InputError
from diagnostics.trace.loader import load_trace_file
from diagnostics.trace.schema import EVENT_SCHEMA, FLOW_SCHEMA

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
keys = st.sampled_from(["ph", "name", "cat", "ts", "dur", "pid", "tid", "id", "args", "s", "bp"])
arg_keys = st.sampled_from(
    ["device", "stream", "correlation", "External id", "external id", "bytes", "Bytes",
     "Total Allocated", "Total Reserved", "Device Type", "Device Id", "name", "other"]
)  # fmt: skip
phases = st.sampled_from(["X", "i", "I", "s", "f", "t", "M", "B", "E", "C", "", "x"])
numbers = st.one_of(st.integers(-(10**18), 10**18), st.floats(allow_nan=False))
arbitrary_event = st.one_of(
    json_values,
    st.dictionaries(keys, json_values, max_size=9),
    st.fixed_dictionaries(
        {"ph": phases, "ts": numbers, "dur": numbers, "name": st.text(max_size=8)},
        optional={
            "cat": st.one_of(st.none(), st.text(max_size=8)),
            "pid": st.one_of(st.integers(-(2**65), 2**65), st.text(max_size=6)),
            "tid": st.one_of(st.integers(-(2**65), 2**65), st.text(max_size=6)),
            "args": st.dictionaries(arg_keys, json_values, max_size=4),
        },
    ),
)


def write_trace(folder: Path, doc, *, gz: bool, indent: int | None) -> Path:
    text = json.dumps(doc, indent=indent).encode()
    path = folder / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


def check_table(trace) -> None:
    events = trace.events
    assert events.schema == pl.Schema(EVENT_SCHEMA)
    assert trace.flows.schema == pl.Schema(FLOW_SCHEMA)
    assert events.height > 0
    assert events["ts"].null_count() == 0
    assert events["ts"].is_sorted()
    durations = events["dur"].drop_nulls()
    assert durations.len() == 0 or durations.min() >= 0
    assert set(events["ph"].unique()) <= {"X", "i", "I"}


@SETTINGS
@given(
    events=st.lists(arbitrary_event, max_size=25),
    wrap=st.booleans(),
    gz=st.booleans(),
    indent=st.sampled_from([None, 1]),
    chunk_bytes=st.sampled_from([48, 1 << 20]),
)
def test_arbitrary_event_lists_load_or_raise_input_error(events, wrap, gz, indent, chunk_bytes):
    doc = {"schemaVersion": 1, "traceEvents": events} if wrap else events
    with tempfile.TemporaryDirectory() as folder:
        path = write_trace(Path(folder), doc, gz=gz, indent=indent)
        try:
            trace = load_trace_file(path, chunk_bytes=chunk_bytes)
        except InputError as exc:
            message = str(exc)
            assert message.startswith(f"{path}: ") and "\n" not in message
            event("refused")
            return
    event("loaded")
    check_table(trace)


good_event = st.builds(
    lambda ph, name, ts, dur, pid, corr: {
        "ph": ph,
        "name": name,
        "cat": "kernel",
        "ts": ts,
        **({"dur": dur} if ph == "X" else {}),
        "pid": pid,
        "tid": 7,
        "args": {"correlation": corr, "device": 0, "stream": 7},
    },
    st.sampled_from(["X", "i"]),
    st.text(min_size=1, max_size=10),
    st.floats(min_value=0, max_value=2e15, allow_nan=False),
    st.floats(min_value=0, max_value=1e9, allow_nan=False),
    st.integers(0, 2**31),
    st.integers(0, 2**62),
)
bad_event = st.one_of(
    good_event.map(lambda e: {**e, "ph": "X", "dur": -1.0 - abs(e["ts"])}),  # negative dur
    good_event.map(lambda e: {k: v for k, v in e.items() if k != "ts"}),  # no ts
    good_event.map(lambda e: {**e, "ts": str(e["ts"])}),  # ts of the wrong type
    good_event.map(lambda e: {**e, "args": {"device": [0]}}),  # args of the wrong type
    st.integers(),  # not an object at all
)


@SETTINGS
@given(
    data=st.lists(st.tuples(st.booleans(), good_event, bad_event), min_size=1, max_size=30),
    chunk_bytes=st.sampled_from([64, 1 << 20]),
)
def test_exactly_the_good_events_survive_and_the_bad_are_counted(data, chunk_bytes):
    events = [good if keep else bad for keep, good, bad in data]
    n_good = sum(keep for keep, _, _ in data)
    with tempfile.TemporaryDirectory() as folder:
        path = write_trace(Path(folder), {"traceEvents": events}, gz=False, indent=1)
        if n_good == 0:
            try:
                load_trace_file(path, chunk_bytes=chunk_bytes)
            except InputError as exc:
                assert "no usable events" in str(exc)
            else:
                raise AssertionError("a trace of only malformed events must be refused")
            return
        trace = load_trace_file(path, chunk_bytes=chunk_bytes)
    check_table(trace)
    assert trace.events.height == n_good
    assert trace.metadata.skipped_events == len(events) - n_good
    expected_ts = sorted(float(good["ts"]) for keep, good, _ in data if keep)
    assert trace.events["ts"].to_list() == expected_ts


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=400), st.booleans())
def test_random_bytes_are_an_input_error_or_a_valid_table(blob, gz):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "blob.json"
        path.write_bytes(gzip.compress(blob) if gz else blob)
        try:
            trace = load_trace_file(path)
        except InputError as exc:
            assert str(exc).startswith(f"{path}: ")
            return
    check_table(trace)


def test_random_binary_file_is_refused_in_one_line(tmp_path):
    path = tmp_path / "noise.json.gz"
    path.write_bytes(os.urandom(4096))
    try:
        load_trace_file(path)
    except InputError as exc:
        assert str(exc) == f"{path}: is not JSON (it looks like binary data)" or (
            "not valid gzip" in str(exc)
        )
    else:
        raise AssertionError("random bytes must not load")
