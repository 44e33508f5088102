"""One chunk of a trace's event array -> raw columns, the same in either process.

A chunk is a JSON array of whole events, cut from ``traceEvents`` by the loading process
(diagnostics.trace.decode). :func:`decode_chunk` is what the helper process
(diagnostics.trace.decode_helper) runs on it, and :func:`events_one_by_one` what both run
when some events are malformed. The columns travel back in polars' own serialisation (both
processes run the same polars; reading it back takes about 60 % of Arrow IPC's time),
without the columns that are null throughout (most args are absent from most kinds of
event: about two thirds of a chunk's columns), which the receiver makes again as nulls.
"""

from __future__ import annotations

import io
import os
import re
import struct
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import polars as pl

from diagnostics.trace.begin_end import PAIRED_PHASES
from diagnostics.trace.columns import EVENT_DECODER, Event, TsClock, columns, null_column
from diagnostics.trace.event_scan import keep_spare_blocks, scanned_columns
from diagnostics.trace.helper_protocol import (
    DECLINED,
    DECODED,
    HAS_BASE,
    NORMALISE,
    READY,
    REPLY,
    REQUEST,
    SLOTS,
    STRICT,
    WITHOUT_FLOWS,
    read_exactly,
)
from diagnostics.trace.normalise import NormalisedChunk, normalise_chunk, unallocated_nulls
from diagnostics.trace.schema import FLOW_SCHEMA

EVENTS_DECODER = msgspec.json.Decoder(list[Event])
RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
_META_ENCODER = msgspec.msgpack.Encoder()
_META_DECODER = msgspec.msgpack.Decoder()
# the payload's head: bytes of the metadata, of the event columns, of the flow columns
_PAYLOAD = struct.Struct("<QQQ")


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


_TYPE_ERROR = re.compile(
    r"Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`( - at `\$\.?(?P<at>[^`]*)`)?"
)


def _skip_reason(message: str) -> str:
    """msgspec's "Expected `float | null`, got `str` - at `$.ts`" -> "ts is str, expected float"."""
    message = _one_line(message)
    match = _TYPE_ERROR.fullmatch(message)
    if match is None:
        return message
    if not match["at"]:
        return "not a JSON object"
    # ts is typed int | float (ints stay exact); to a user both are just a number
    want = match["want"].replace(" | null", "").replace("int | float", "float")
    return f"{match['at']} is {match['got']}, expected {want}"


def events_one_by_one(raws: list[msgspec.Raw]) -> tuple[list[Event], Counter[str]]:
    """Each event decoded alone: the good ones, and a count of the others by reason."""
    events: list[Event] = []
    skipped: Counter[str] = Counter()
    for raw in raws:
        try:
            events.append(EVENT_DECODER.decode(raw))
        except msgspec.ValidationError as exc:
            skipped[_skip_reason(str(exc))] += 1
    return events, skipped


@dataclass
class DecodedChunk:
    """One chunk's raw columns, as the loading process would have made them itself; or,
    from the helper when asked, its rows already normalised."""

    frame: pl.DataFrame | None  # None: the chunk held no event rows, or it is normalised
    flows: pl.DataFrame | None
    names: list[tuple[str, Any, Any, Any]]
    skipped: Counter[str]
    lossy: int  # fractional timestamps beyond 2^53 (TsClock.lossy)
    normalised: NormalisedChunk | None = None  # frame and flows are then None

    @property
    def rows(self) -> int:
        """Decoded rows, flows included."""
        if self.normalised is not None:
            return self.normalised.rows
        return sum(part.height for part in (self.frame, self.flows) if part is not None)


def decode_chunk(text: bytes, base_us: int | None, strict: bool = False) -> DecodedChunk | None:
    """A chunk's text (a JSON array of whole events) -> its columns; None when it needs the
    loading process (not one valid array, B/E events, which pair across chunks, or with
    ``strict`` a malformed event)."""
    clock = TsClock.with_base(base_us)
    scanned = scanned_columns(text, clock)
    if scanned is not None:
        return DecodedChunk(*scanned, Counter(), 0)
    try:
        events = EVENTS_DECODER.decode(text)
        skipped: Counter[str] = Counter()
    except msgspec.ValidationError:
        if strict:
            return None
        try:
            raws = RAW_LIST_DECODER.decode(text)
        except (msgspec.DecodeError, RecursionError):
            return None
        events, skipped = events_one_by_one(raws)
    except (msgspec.DecodeError, RecursionError):
        return None
    if PAIRED_PHASES.intersection({event.ph for event in events}):
        return None
    if not events:
        return DecodedChunk(None, None, [], skipped, 0)
    frame, flows, names = columns(events, clock)
    return DecodedChunk(frame, flows, names, skipped, clock.lossy)


def with_rows_normalised(chunk: DecodedChunk, with_flows: bool) -> DecodedChunk:
    """``chunk`` with its rows normalised, as the loading process would normalise them."""
    if chunk.frame is None:
        return chunk
    rows = normalise_chunk(chunk.frame, chunk.flows, with_flows)
    return DecodedChunk(None, None, chunk.names, chunk.skipped, chunk.lossy, rows)


def _serialised(frame: pl.DataFrame | None) -> tuple[bytes, list[str]]:
    if frame is None:
        return b"", []
    # a frame of no rows keeps its columns: made again, they would be one row long
    nulls = (
        [s.name for s in frame.iter_columns() if s.null_count() == s.len()] if frame.height else []
    )
    return frame.drop(nulls).serialize(), nulls


# The all-null columns left out of a payload, made again on its height (serialised, a
# null-only column still takes its full width): raw ones in full, the event table's as one
# null each.
def _raw_nulls(names: list[str], height: int) -> list[pl.Series]:
    return [null_column(name, height) for name in names]


def _event_nulls(names: list[str], height: int) -> list[pl.Expr]:
    return unallocated_nulls(names)  # one value whatever the height


def _flow_nulls(names: list[str], height: int) -> list[pl.Series]:
    return [null_column(name, height, FLOW_SCHEMA) for name in names]


def _frame(
    data: memoryview,
    order: list[str],
    nulls: list[str],
    made_again: Callable[[list[str], int], list[Any]] = _raw_nulls,
) -> pl.DataFrame:
    frame = pl.DataFrame.deserialize(io.BytesIO(data))
    if nulls:
        frame = frame.with_columns(made_again(nulls, frame.height))
    return frame.select(order)


def encode_chunk(chunk: DecodedChunk) -> bytes:
    rows = chunk.normalised
    frame, flows = (chunk.frame, chunk.flows) if rows is None else (rows.events, rows.flows)
    frame_bytes, frame_nulls = _serialised(frame)
    flow_bytes, flow_nulls = _serialised(flows)
    counts = None
    if rows is not None:
        counts = [dict(rows.skipped), dict(rows.ignored), rows.rows, rows.flow_rows]
    meta = _META_ENCODER.encode(
        [
            [list(n) for n in chunk.names],
            dict(chunk.skipped),
            chunk.lossy,
            frame.columns if frame is not None else None,
            frame_nulls,
            flows.columns if flows is not None else None,
            flow_nulls,
            counts,
        ]
    )
    return (
        _PAYLOAD.pack(len(meta), len(frame_bytes), len(flow_bytes))
        + meta
        + frame_bytes
        + flow_bytes
    )


def decode_payload(payload: bytes) -> DecodedChunk:
    view = memoryview(payload)
    meta_len, frame_len, flows_len = _PAYLOAD.unpack_from(view)
    at = _PAYLOAD.size
    names, skipped, lossy, frame_order, frame_nulls, flow_order, flow_nulls, counts = (
        _META_DECODER.decode(view[at : at + meta_len])
    )
    at += meta_len
    frame = None
    if frame_order is not None:
        made_again = _raw_nulls if counts is None else _event_nulls
        frame = _frame(view[at : at + frame_len], frame_order, frame_nulls, made_again)
    at += frame_len
    flows = None
    if flow_order is not None:
        made_again = _raw_nulls if counts is None else _flow_nulls
        flows = _frame(view[at : at + flows_len], flow_order, flow_nulls, made_again)
    names = [tuple(n) for n in names]
    if counts is None:
        return DecodedChunk(frame, flows, names, Counter(skipped), lossy)
    assert frame is not None
    rows_skipped, ignored, rows, flow_rows = counts
    normalised_rows = NormalisedChunk(
        frame, flows, Counter(rows_skipped), Counter(ignored), rows, flow_rows
    )
    return DecodedChunk(None, None, names, Counter(skipped), lossy, normalised_rows)


def main() -> None:
    """The helper process: decode each chunk it is sent, until its input closes."""
    from diagnostics.process_limits import die_with_parent
    from diagnostics.trace.freed_memory import keep_freed_memory

    die_with_parent(int(sys.argv[1]))
    # for good: this process only decodes chunks
    keep_freed_memory()
    keep_spare_blocks()
    fds = [int(fd) for fd in sys.argv[2:]]
    texts, results = fds[:SLOTS], fds[SLOTS:]
    requests, replies = sys.stdin.fileno(), sys.stdout.fileno()
    os.write(replies, READY)
    while True:
        header = read_exactly(requests, REQUEST.size)
        if header is None:
            return
        seq, slot, size, flags, base_us = REQUEST.unpack(header)
        status, size_out = DECLINED, 0
        try:
            chunk = decode_chunk(
                os.pread(texts[slot], size, 0),
                base_us if flags & HAS_BASE else None,
                strict=bool(flags & STRICT),
            )
            if chunk is not None and flags & NORMALISE:
                chunk = with_rows_normalised(chunk, with_flows=not flags & WITHOUT_FLOWS)
            if chunk is not None:
                payload = encode_chunk(chunk)
                if os.pwrite(results[slot], payload, 0) == len(payload):
                    status, size_out = DECODED, len(payload)
        except Exception:  # noqa: BLE001 - whatever it is, the loading process decodes it
            status, size_out = DECLINED, 0
        os.write(replies, REPLY.pack(seq, slot, status, size_out))
