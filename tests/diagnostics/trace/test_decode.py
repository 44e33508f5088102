"""The streaming decode: document shapes, chunk cuts, malformed JSON and events."""

from __future__ import annotations

import json

import pytest

from diagnostics.errors import InputError
from diagnostics.trace.decode import _Chunker, decode_trace
from tests.diagnostics.trace.helpers import cpu_op, kernel, small_events, trace_doc


def decode_text(text: str | bytes, *, chunk_bytes: int = 1 << 20, block: int = 1 << 20):
    data = text.encode() if isinstance(text, str) else text
    blocks = (data[i : i + block] for i in range(0, len(data), block))
    return decode_trace(blocks, "t.json", chunk_bytes=chunk_bytes)


def rows(decoded) -> list[tuple]:
    return decoded.frame.select("ph", "name", "ts", "dur").rows()


def test_pretty_minified_and_bare_list_decode_to_the_same_rows():
    events = small_events()
    pretty = decode_text(json.dumps(trace_doc(events), indent=2))
    minified = decode_text(json.dumps(trace_doc(events), separators=(",", ":")))
    bare = decode_text(json.dumps(events))
    assert rows(pretty) == rows(minified) == rows(bare)
    # 8 events: 2 metadata + 4 complete events as rows, the 2 flow events aside
    assert pretty.frame.height == 6 and pretty.flows.height == 2
    assert pretty.flows["ph"].to_list() == ["s", "f"]


def test_keys_before_and_after_trace_events_are_kept():
    text = (
        '{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "A100"}],'
        ' "traceEvents": ' + json.dumps(small_events()) + ","
        ' "traceName": "x.json", "displayTimeUnit": "ns"}'
    )
    decoded = decode_text(text)
    assert decoded.top == {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "A100"}],
        "traceName": "x.json",
        "displayTimeUnit": "ns",
    }


def test_trace_events_mentioned_in_a_string_or_nested_object_first_is_skipped():
    text = (
        '{"note": "the \\"traceEvents\\": [ key", "inner": {"traceEvents": [1]},'
        ' "traceEvents": ' + json.dumps(small_events()) + "}"
    )
    decoded = decode_text(text, block=7)  # tiny blocks: the key straddles block edges
    assert decoded.frame.height == 6
    assert decoded.top["inner"] == {"traceEvents": [1]}


@pytest.mark.parametrize("chunk_bytes", [64, 200, 1000])
def test_small_chunks_give_the_same_rows_even_with_cut_lookalikes_inside_events(chunk_bytes):
    # "}, {" inside a string and inside a nested list of objects look like event edges
    tricky = [
        cpu_op('lambda}, {"ph": "X"', 1.0, 2.0),
        {**cpu_op("nested", 3.0, 4.0), "args": {"shapes": [{"a": 1}, {"b": 2}], "x": "}, {"}},
        *[kernel(10.0 + i, 1.0, correlation=i) for i in range(40)],
    ]
    text = json.dumps(trace_doc(tricky), indent=1)
    reference = decode_text(text)
    chunked = decode_text(text, chunk_bytes=chunk_bytes, block=97)
    assert rows(chunked) == rows(reference)
    assert chunked.frame.height == 42


def test_some_malformed_events_are_skipped_with_msgspec_reason():
    events = [
        kernel(1.0, 2.0),
        {**kernel(3.0, 1.0), "ts": "soon"},
        {**kernel(5.0, 1.0), "args": {"device": "cuda:0"}},
        42,
        kernel(7.0, 1.0),
    ]
    decoded = decode_text(json.dumps(trace_doc(events)))
    assert decoded.frame["ts"].to_list() == [1.0, 7.0]
    assert sum(decoded.skipped.values()) == 3
    assert dict(decoded.skipped) == {
        "ts is str, expected float": 1,
        "args.device is str, expected int": 1,
        "not a JSON object": 1,
    }


def test_label_pids_and_tids_become_null_and_numeric_strings_parse():
    events = [
        {**cpu_op("a", 1.0, 1.0), "pid": "Spans", "tid": "PyTorch Profiler"},
        {**cpu_op("b", 2.0, 1.0), "pid": 5, "tid": "25738"},
    ]
    frame = decode_text(json.dumps(events)).frame
    assert frame["pid"].to_list() == [None, 5]
    assert frame["tid"].to_list() == [None, 25738]


def test_integers_beyond_int64_become_null_not_a_crash():
    events = [{**kernel(1.0, 1.0), "args": {"correlation": 2**64 - 1, "device": 0}}]
    frame = decode_text(json.dumps(events)).frame
    assert frame["correlation"].to_list() == [None]
    assert frame["device"].to_list() == [0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "t.json: is empty"),
        ("   \n  ", "t.json: holds only whitespace"),
        ("42", "t.json: is not a Chrome trace: expected a JSON object or list, found '42'"),
        ('{"traceEvents": {"ph": "X"}}', "t.json: traceEvents is an object, expected a list"),
        ('{"traceEvents": null}', "t.json: traceEvents is null"),
        ('{"schemaVersion": 1, "other": []}', "t.json: has no traceEvents (top-level keys: "),
        ('{"schemaVersion": 1, "traceEvents": [{"ph": "X"', "t.json: is not valid JSON: it ends"),
        ('{"traceEvents": [{"ph": "X"}, {"ph": X}]}', "t.json: is not valid JSON: "),
        ('{"traceEvents": []} trailing', "t.json: is not valid JSON: "),
        ('{"a": tru', "t.json: is not valid JSON"),
        (b"\x00\x01\x02\xff\xfe binary", "t.json: is not JSON (it looks like binary data)"),
        # binary whose first byte happens to open a JSON list or object (1 in 128 of random files)
        (b"[\x9c\x07\xd1\x00\xfe", "t.json: is not JSON (it looks like binary data)"),
        (b'  {"traceEvents": [\x01\x02]}', "t.json: is not JSON (it looks like binary data)"),
    ],
)
def test_broken_documents_are_one_line_input_errors(text, message):
    with pytest.raises(InputError) as caught:
        decode_text(text)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_a_syntax_error_deep_in_a_large_file_is_reported_with_its_byte_offset():
    good = json.dumps([kernel(float(i), 1.0) for i in range(200)])
    text = good[:-1] + ', {"ph": "X", "ts": oops}]'
    offset = text.index("oops")
    with pytest.raises(InputError, match=rf"byte {offset}\)"):
        decode_text(text, chunk_bytes=512, block=300)


def test_an_escaped_control_character_in_a_name_is_text_not_binary():
    events = small_events()
    events[0]["name"] = "tab\there\u0001"
    decoded = decode_text(json.dumps(events))
    assert decoded.frame.height == 6
    assert "tab\there\u0001" in decoded.frame["name"].to_list()


def test_byte_order_mark_is_accepted():
    decoded = decode_text(b"\xef\xbb\xbf" + json.dumps(small_events()).encode())
    assert decoded.frame.height == 6


def test_the_buffer_fills_to_a_chunk_with_the_blocks_that_reach_it_and_no_more():
    blocks = iter([bytes([65 + i]) * 300 for i in range(10)])
    chunker = _Chunker("t.json", blocks, 1000, sink=lambda chunk: None)
    chunker.buf = bytearray(b"[rest,")  # what the last cut left
    assert chunker.fill(1000)
    # 4 blocks take it past 1,000 bytes; the 6 after them are not read yet
    assert bytes(chunker.buf) == b"[rest," + b"A" * 300 + b"B" * 300 + b"C" * 300 + b"D" * 300
    assert chunker.total == 1200 and len(list(blocks)) == 6


def test_the_buffer_holds_all_the_text_when_it_ends_before_a_chunk():
    chunker = _Chunker("t.json", iter([b"[1,", b"", b"2]"]), 1000, sink=lambda chunk: None)
    assert not chunker.fill(1000)
    assert bytes(chunker.buf) == b"[1,2]" and chunker.eof
    assert not chunker.more()
