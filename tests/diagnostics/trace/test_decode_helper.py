"""The decode helper process: every input decodes to exactly what the loading process alone
makes of it, whatever the helper does (decodes, declines, dies), and no helper outlives
its decode.

Each test hands the decoder a helper that is already started and ready (a cold one takes
~0.15 s to import polars, by when a small input is decoded), and checks that the helper
really decoded chunks, or that the path named was really taken, so that no case passes
with the helper idle.
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from diagnostics.errors import InputError
from diagnostics.trace import decode as decode_module
from diagnostics.trace import decode_helper
from diagnostics.trace.chunk_decode import (
    decode_chunk,
    decode_payload,
    encode_chunk,
    with_rows_normalised,
)
from diagnostics.trace.decode import DecodedTrace, decode_trace
from diagnostics.trace.helper_protocol import STRICT
from diagnostics.trace.loader import load_trace_file
from diagnostics.trace.normalise import TableBuilder
from tests.diagnostics.trace.helpers import small_events

SHARED = Path(__file__).resolve().parents[4] / "shared"
REAL_TRACES = sorted((SHARED / "traces").glob("*.json.gz")) + sorted(
    (SHARED / "gpu-runs").glob("**/*.pt.trace.json.gz")
)
SMALL_CHUNK = 64 << 10


@pytest.fixture
def helpers(monkeypatch):
    """Makes every helper the decoder asks for ready before it is handed over; yields the
    list of helpers started, to check on them afterwards."""
    started: list[decode_helper.DecodeHelper] = []

    def ready_helper() -> decode_helper.DecodeHelper:
        helper = decode_helper.DecodeHelper()
        started.append(helper)
        deadline = time.monotonic() + 30
        while helper.free_slot() is None:
            assert helper.alive and time.monotonic() < deadline, "the helper never got ready"
            time.sleep(0.005)
        return helper

    monkeypatch.setattr(decode_module, "take_spare", ready_helper)
    return started


def _blocks(text: bytes, size: int) -> list[bytes]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def decode(text: bytes, parallel: bool, chunk: int = SMALL_CHUNK, block: int = 4096):
    return decode_trace(iter(_blocks(text, block)), "t.json", chunk_bytes=chunk, parallel=parallel)


def assert_same(helped: DecodedTrace, alone: DecodedTrace) -> None:
    assert_frame_equal(helped.frame, alone.frame)
    assert_frame_equal(helped.flows, alone.flows)
    assert helped.top == alone.top
    assert helped.names == alone.names
    assert helped.skipped == alone.skipped
    assert (helped.ts_base_us, helped.ts_lossy) == (alone.ts_base_us, alone.ts_lossy)
    assert alone.helper_chunks == 0


def spy(monkeypatch, name: str) -> list[int]:
    """Counts calls of _Chunker.<name>."""
    calls: list[int] = []
    real = getattr(decode_module._Chunker, name)

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(decode_module._Chunker, name, counted)
    return calls


def events_text(events: list[dict], **top) -> bytes:
    """Kineto's layout: one event per line."""
    lines = ",\n".join(json.dumps(event) for event in events)
    head = "".join(f"{json.dumps(k)}: {json.dumps(v)}, " for k, v in top.items())
    return ("{" + head + '"traceEvents": [\n' + lines + "\n]}").encode()


def kernels(n: int, start: int = 0) -> list[dict]:
    return [
        {
            "ph": "X",
            "cat": "kernel" if i % 3 else "cpu_op",
            "name": f"op_{i % 17}",
            "pid": 1,
            "tid": 7 + i % 2,
            "ts": 1000 + 10 * i,
            "dur": 5,
            "args": {"correlation": i, "stream": 7, "Input Dims": [[i % 5, 3]]},
        }
        for i in range(start, start + n)
    ]


def test_a_chunk_comes_back_from_the_helper_as_it_left_raw_or_normalised():
    # what the helper writes into its memory file and the loading process reads back: the
    # frames whole (the columns null throughout left out and made again), counts and names
    events = [*kernels(40), *small_events(), {"ph": "X", "name": "bad", "ts": 1.0}]
    chunk = decode_chunk(json.dumps(events).encode(), None)
    assert chunk is not None and chunk.frame is not None and chunk.flows is not None
    assert chunk.frame["memory_bytes"].null_count() == chunk.frame.height  # one left out
    back = decode_payload(encode_chunk(chunk))
    assert_frame_equal(back.frame, chunk.frame)
    assert_frame_equal(back.flows, chunk.flows)
    assert (back.names, back.skipped, back.lossy) == (chunk.names, chunk.skipped, chunk.lossy)

    normalised = with_rows_normalised(chunk, with_flows=True)
    rows, back_rows = normalised.normalised, decode_payload(encode_chunk(normalised)).normalised
    assert rows is not None and back_rows is not None
    assert_frame_equal(back_rows.events, rows.events)
    assert_frame_equal(back_rows.flows, rows.flows)
    assert rows.skipped == {"complete event (ph X) without dur": 1}
    assert (back_rows.skipped, back_rows.ignored) == (rows.skipped, rows.ignored)
    assert (back_rows.rows, back_rows.flow_rows) == (rows.rows, rows.flow_rows)


def test_a_chunk_of_no_rows_comes_back_with_its_columns():
    chunk = decode_chunk(json.dumps(kernels(3)).encode(), None)
    assert chunk is not None and chunk.frame is not None
    empty = replace(chunk, frame=chunk.frame.clear(), flows=None)
    back = decode_payload(encode_chunk(empty))
    assert_frame_equal(back.frame, empty.frame)
    assert back.flows is None


@pytest.mark.skipif(not decode_helper.can_help(), reason="needs two cores and memfd (Linux)")
class TestSameResult:
    def test_real_traces_exist(self):
        # nine real traces from other projects and the twelve H200 runs: no silent skip
        assert len(REAL_TRACES) >= 20, REAL_TRACES

    @pytest.mark.parametrize("path", REAL_TRACES, ids=lambda p: p.name[:48])
    def test_every_real_trace_decodes_the_same_with_the_helper(self, path, helpers):
        text = gzip.decompress(path.read_bytes())
        chunk = max(SMALL_CHUNK, len(text) // 24)  # a few dozen chunks each
        helped = decode(text, parallel=True, chunk=chunk, block=1 << 16)
        alone = decode(text, parallel=False, chunk=chunk, block=1 << 16)
        assert_same(helped, alone)
        assert helped.helper_chunks > 0
        assert all(h.proc.poll() is not None for h in helpers)  # none left running

    def test_the_loader_with_the_helper_builds_the_same_table(self, helpers):
        large = SHARED / "traces" / "hta_v100_rank1_of_2_large.json.gz"
        helped = load_trace_file(large, parallel_decode=True)
        alone = load_trace_file(large, parallel_decode=False)
        assert_frame_equal(helped.events, alone.events)
        assert_frame_equal(helped.flows, alone.flows)
        assert helped.metadata == alone.metadata
        assert len(helpers) == 1 and helpers[0].proc.poll() is not None

    @pytest.mark.parametrize("with_flows", [True, False], ids=["flows", "no-flows"])
    @pytest.mark.parametrize("path", REAL_TRACES, ids=lambda p: p.name[:48])
    def test_chunks_the_helper_normalises_make_the_same_tables(
        self, path, with_flows, helpers, monkeypatch
    ):
        # the loader asks the helper to normalise its chunks (and, for the analysis, to
        # leave their flows out): the tables and counts are those of a load without it
        normalised_there = []
        real_add = TableBuilder.add_normalised

        def add_normalised(self, chunk):
            normalised_there.append(chunk.rows)
            real_add(self, chunk)

        monkeypatch.setattr(TableBuilder, "add_normalised", add_normalised)
        chunk = max(SMALL_CHUNK, len(gzip.decompress(path.read_bytes())) // 24)
        helped, alone = (
            load_trace_file(
                path, parallel_decode=parallel, chunk_bytes=chunk, with_flows=with_flows
            )
            for parallel in (True, False)
        )
        assert_frame_equal(helped.events, alone.events)
        assert_frame_equal(helped.flows, alone.flows)
        assert helped.metadata == alone.metadata
        assert len(normalised_there) > 0

    def test_malformed_events_in_a_helpers_chunk_are_skipped_as_here(self, helpers):
        events = kernels(3000)
        for i in range(50, 3000, 97):
            events[i]["ts"] = "soon"  # a string: the chunk is decoded event by event
        text = events_text(events)
        helped, alone = decode(text, True), decode(text, False)
        assert_same(helped, alone)
        assert helped.helper_chunks > 0
        assert alone.skipped == {"ts is str, expected float": 31}

    def test_timestamps_beyond_2_53_keep_the_files_base_in_the_helper(self, helpers):
        events = kernels(3000)
        for i, event in enumerate(events):
            event["ts"] = 2**60 + 10 * i + (0.5 if i % 500 == 7 else 0)
        text = events_text(events)
        helped, alone = decode(text, True), decode(text, False)
        assert_same(helped, alone)
        assert helped.helper_chunks > 0
        assert alone.ts_base_us == 2**60 and alone.ts_lossy == 6

    def test_the_first_chunk_goes_to_a_ready_helper_with_the_clock_decided_here(
        self, helpers, monkeypatch
    ):
        decided = spy(monkeypatch, "decide_clock")
        handed: list[tuple[int, int | None, bool]] = []
        real_submit = decode_helper.DecodeHelper.submit

        def submit(self, slot, seq, text, base_us, flags=0):
            handed.append((seq, base_us, bool(flags & STRICT)))
            return real_submit(self, slot, seq, text, base_us, flags)

        monkeypatch.setattr(decode_helper.DecodeHelper, "submit", submit)
        events = kernels(3000)
        for i, event in enumerate(events):
            event["ts"] = 2**60 + 10 * i
        text = events_text(events)
        helped, alone = decode(text, True), decode(text, False)
        assert_same(helped, alone)
        assert decided == [1]
        # the first chunk went first, strictly, with the base its timestamps decided
        assert handed[0] == (1, 2**60, True)
        assert all(not strict for _, _, strict in handed[1:])
        assert helped.ts_base_us == 2**60

    def test_a_malformed_event_sends_the_first_chunk_back_and_the_clock_is_decided_again(
        self, helpers, monkeypatch
    ):
        taken_back = spy(monkeypatch, "take_back")
        events = kernels(3000)
        for i, event in enumerate(events):
            event["ts"] = 2**60 + 10 * i
        # the first event has the smallest timestamp and a malformed field: a full decode
        # leaves it out, so the file's base is the second event's; its timestamp alone
        # would have made the base its own
        events[0]["dur"] = "long"
        text = events_text(events)
        helped, alone = decode(text, True), decode(text, False)
        assert_same(helped, alone)
        assert taken_back
        assert alone.ts_base_us == 2**60 + 10
        assert alone.skipped == {"dur is str, expected float": 1}

    def test_begin_end_events_send_the_first_chunk_back(self, helpers, monkeypatch):
        taken_back = spy(monkeypatch, "take_back")
        events = [{"ph": "B", "name": "range", "pid": 1, "tid": 3, "ts": 2**60 + 5}]
        events += [{"ph": "E", "pid": 1, "tid": 3, "ts": 2**60 + 9}]
        events += kernels(3000)
        for i, event in enumerate(events[2:]):
            event["ts"] = 2**60 + 10 * i
        text = events_text(events)
        helped, alone = decode(text, True), decode(text, False)
        assert_same(helped, alone)
        assert taken_back
        assert alone.frame.filter(alone.frame["name"] == "range").height == 1

    def test_a_chunk_with_begin_end_events_is_taken_back(self, helpers, monkeypatch):
        taken_back = spy(monkeypatch, "take_back")
        # ~155 bytes an event, 64 KiB chunks: the first ~420 events are decoded here, the
        # next two chunks go to the helper (both its slots are free): B/E pairs in them
        events = kernels(600)
        for i in range(600, 700, 2):
            events.append({"ph": "B", "name": f"range_{i}", "pid": 1, "tid": 3, "ts": 10 * i})
            events.append({"ph": "E", "pid": 1, "tid": 3, "ts": 10 * i + 4})
        events += kernels(2400, start=700)
        text = events_text(events)
        helped, alone = decode(text, True), decode(text, False)
        assert_same(helped, alone)
        assert taken_back
        assert alone.frame.filter(alone.frame["name"].str.starts_with("range_")).height == 50

    def test_a_cut_inside_a_string_is_taken_back(self, helpers, monkeypatch):
        taken_back = spy(monkeypatch, "take_back")
        events = kernels(3000)
        for event in events:
            event["name"] = 'a"}, {"b'  # a cut candidate inside every name
        text = events_text(events)
        helped, alone = decode(text, True, block=997), decode(text, False, block=997)
        assert_same(helped, alone)
        assert taken_back

    def test_the_array_ending_inside_a_helpers_chunk(self, helpers):
        # ~600 KB after the array, full of "},{": the helper is handed the array's end
        props = [{"id": i, "name": "H100", "padding": "x" * 64} for i in range(6000)]
        text = events_text(kernels(3000))[:-1] + b', "deviceProperties": '
        text += json.dumps(props).encode() + b"}"
        helped, alone = decode(text, True), decode(text, False)
        assert_same(helped, alone)
        assert len(alone.top["deviceProperties"]) == 6000

    def test_a_syntax_error_in_a_helpers_chunk_gives_the_same_message(self, helpers):
        text = bytearray(events_text(kernels(3000)))
        at = text.index(b'"dur": ', len(text) * 3 // 4)
        text[at : at + 7] = b'"dur"# '  # a stray character where the colon was
        with pytest.raises(InputError) as alone:
            decode(bytes(text), False)
        with pytest.raises(InputError) as helped:
            decode(bytes(text), True)
        assert str(helped.value) == str(alone.value)
        assert "is not valid JSON" in str(alone.value)
        assert helpers and all(h.proc.poll() is not None for h in helpers)

    def test_a_helper_that_dies_leaves_the_result_unchanged(self, helpers, monkeypatch):
        taken_back = spy(monkeypatch, "take_back")
        real_submit = decode_helper.DecodeHelper.submit

        def submit_then_die(self, slot, seq, text, base_us, flags=0):
            handed = real_submit(self, slot, seq, text, base_us, flags)
            if seq == 2:
                self.proc.kill()  # killed (out of memory, a signal) with chunks in hand
                self.proc.wait()
            return handed

        monkeypatch.setattr(decode_helper.DecodeHelper, "submit", submit_then_die)
        text = events_text(kernels(4000))
        helped, alone = decode(text, True), decode(text, False)
        assert_same(helped, alone)
        assert taken_back


def test_a_spare_starts_only_for_a_large_trace_file(tmp_path, monkeypatch):
    monkeypatch.setattr(decode_helper, "can_help", lambda: True)
    started: list[str] = []
    monkeypatch.setattr(decode_helper, "DecodeHelper", lambda: started.append("x") or "helper")
    small = tmp_path / "small.json.gz"
    small.write_bytes(gzip.compress(b"[]"))
    large_plain = tmp_path / "large.json"
    large_plain.write_bytes(b" " * (decode_helper.SPARE_MIN_BYTES[False] + 1))
    snapshot = tmp_path / "memory.pickle"
    snapshot.write_bytes(b" " * (decode_helper.SPARE_MIN_BYTES[False] + 1))
    for path in (small, snapshot, tmp_path, tmp_path / "missing.json"):
        decode_helper.start_spare(path)
        assert decode_helper.take_spare() is None, path
    decode_helper.start_spare(large_plain)
    assert decode_helper.take_spare() == "helper" and started == ["x"]
    assert decode_helper.take_spare() is None  # handed out once
