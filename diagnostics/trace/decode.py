"""Chrome-trace JSON to columns: a streaming, typed decode of ``traceEvents``.

How it stays fast and small:

* Events are decoded by msgspec into ``gc=False`` Structs that name only the fields the
  event table needs; every other key (call stacks, input shapes, grid sizes, ...) is
  skipped by the parser without ever becoming a Python object.
* The file is never held whole. Decompressed blocks accumulate until about
  ``chunk_bytes`` are buffered, then the buffer is cut after the last complete event
  (a ``}`` followed by ``,`` and ``{``), that prefix is decoded as one JSON array and
  turned into polars columns, and the Structs are dropped. Peak memory is one chunk of
  text and its Structs plus the columns so far, whatever the file's size.
* A cut can land inside an event (``}, {`` inside a string or a nested list). The prefix
  is then not a valid JSON array, msgspec says so, and the next earlier candidate is
  tried: a cut is only ever accepted when the decoder agrees it is a whole array.
* The keys around ``traceEvents`` (``deviceProperties``, ``distributedInfo``, ...) are
  decoded separately: the head by closing the object right where ``"traceEvents"``
  starts, the tail by opening a fresh object just before the array's remainder.

Malformed events (a ``ts`` that is a string, ``args.device`` that is a list) make msgspec
reject the whole chunk; that chunk alone is then decoded event by event so only the bad
events are dropped, each counted with the reason msgspec gave.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import polars as pl

from diagnostics.errors import InputError
from diagnostics.trace.begin_end import PAIRED_PHASES, BeginEndPairs
from diagnostics.trace.chunk_decode import (
    EVENTS_DECODER,
    RAW_LIST_DECODER,
    DecodedChunk,
    events_one_by_one,
)
from diagnostics.trace.columns import (
    RAW_EVENT_SCHEMA,
    RAW_FLOW_SCHEMA,
    Event,
    TsClock,
    columns,
)
from diagnostics.trace.decode_helper import DecodeHelper, can_help, take_spare
from diagnostics.trace.event_scan import scanned_columns
from diagnostics.trace.helper_protocol import NORMALISE, SLOTS, STRICT, WITHOUT_FLOWS

# Text decoded per step. 4 MiB of Kineto JSON is ~15k events: big enough that per-chunk
# overhead vanishes, small enough that a chunk's Structs stay a few tens of MB.
DEFAULT_CHUNK_BYTES = 4 << 20
# The first chunk is cut at the first block (or sooner): it decides the timestamp base
# (TsClock), which the decode helper needs with every chunk it takes.
FIRST_CHUNK_BYTES = 1 << 20
# Metadata before "traceEvents" is a few KB in practice; past this the file is not a trace.
HEAD_LIMIT_BYTES = 64 << 20
# Earlier cut candidates tried before waiting for more text (a cut inside an event).
_MAX_CUT_TRIES = 16


class _Stamp(msgspec.Struct, gc=False):
    """An event's timestamp alone (Event.ts): the first chunk's decide the file's clock."""

    ts: int | float | None = None


_STAMPS_DECODER = msgspec.json.Decoder(list[_Stamp])
_RAW_DICT_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY_DECODER = msgspec.json.Decoder()

_NOT_WS = re.compile(rb"[^ \t\r\n]")
# JSON allows no raw control character anywhere (strings must escape them), so one in
# the first bytes marks binary data even when it happens to open with "[" or "{"
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
BINARY_SAMPLE_BYTES = 512
_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*')
_BYTE_POS = re.compile(r"\(byte (\d+)\)")
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_VALID_SO_FAR = re.compile(r"truncated|trailing characters")


def _outside_strings(text: bytearray, end: int) -> bool:
    """Whether position ``end`` of ``text`` (which starts between tokens) is outside every
    JSON string."""
    pos = 0
    while True:
        quote = text.find(b'"', pos, end)
        if quote < 0:
            return True
        string = _STRING.match(text, quote)
        if string is None or string.end() > end:
            return False
        pos = string.end()


# Receives each decoded chunk with event rows, in file order: its raw columns (non-flow
# rows in RAW_EVENT_SCHEMA, flow rows or None), or, where the helper was asked to
# (HelperWork.normalise), its rows normalised.
ChunkSink = Callable[[DecodedChunk], None]


@dataclass(frozen=True)
class HelperWork:
    """What the decode helper does beyond decoding: ``normalise`` its chunks (the sink then
    gets them normalised), and then leave out their flows (``with_flows`` false)."""

    normalise: bool = False
    with_flows: bool = True

    @property
    def flags(self) -> int:
        if not self.normalise:
            return 0
        return NORMALISE | (0 if self.with_flows else WITHOUT_FLOWS)


@dataclass
class DecodedTrace:
    """The other top-level keys, the M-event names, what was dropped; and the raw columns
    of every event when no sink took them chunk by chunk."""

    frame: pl.DataFrame  # every non-flow event, RAW_SCHEMA less "id" (empty with a sink)
    flows: pl.DataFrame  # flow events (ph s/f/t): RAW_FLOW_SCHEMA (empty with a sink)
    top: dict[str, Any]
    names: list[tuple[str, Any, Any, Any]]  # M events: (name, pid, tid, args.name)
    skipped: Counter[str] = field(default_factory=Counter)
    ts_base_us: int | None = None  # subtracted from every ts (integers beyond 2^53)
    ts_lossy: int = 0  # fractional timestamps beyond 2^53: already rounded by float64
    helper_chunks: int = 0  # chunks the helper process decoded (diagnostics.trace.decode_helper)


class _InTurnOnly(Exception):
    """The chunk just decoded here, out of turn, would change what the chunks before it
    (still with the helper) lead to: an error, the array's end, B/E pairing. It is done
    again once they are settled."""


@dataclass
class _OutOfTurn:
    """A chunk decoded (or being decoded by the helper) before the chunks ahead of it have
    reached the sink; it keeps its text, so that it can be taken back."""

    offset: int  # the position of its "[" in the decompressed text
    text: bytes  # its events' text, between the "[" and the cut (b"" while with the helper)
    chunk: DecodedChunk | None = None  # None while the helper has it
    seq: int = 0
    slot: int = 0  # the helper's slot holding its text, and the text's size there
    size: int = 0


# Chunks held out of turn before the loading process waits for the helper: bounds memory
# when the helper falls behind (another process on its core).
_MAX_OUT_OF_TURN = SLOTS + 2


class _ArrayEnded(Exception):
    """The events array closed inside a chunk, before byte ``at`` of the buffer."""

    def __init__(self, at: int):
        self.at = at


class _Chunker:
    """Holds the undecoded text and turns complete events into column frames."""

    def __init__(
        self,
        display: str,
        blocks: Iterator[bytes],
        chunk_bytes: int,
        sink: ChunkSink,
        parallel: bool = False,
        helper_work: HelperWork = HelperWork(),
    ):
        self.sink = sink
        self.helper_work = helper_work
        self.display = display
        self.blocks = blocks
        self.chunk_bytes = chunk_bytes
        self.buf = bytearray()
        self.offset = 0  # position of buf[0] in the decompressed text
        self.total = 0
        self.eof = False
        self.names: list[tuple[str, Any, Any, Any]] = []
        self.skipped: Counter[str] = Counter()
        self.clock = TsClock()
        self.pairs = BeginEndPairs()
        self.array_done = False  # the events array has ended; the rest is for tail()
        # diagnostics.trace.decode_helper: started at the second chunk, when allowed
        self.parallel = parallel
        self.helper: DecodeHelper | None = None
        self.out_of_turn: deque[_OutOfTurn] = deque()
        self.seq = 0
        self.helper_chunks = 0
        # the clock was decided from the first chunk's timestamps alone, and that chunk went
        # to the helper: if it comes back undecoded, the decision is made again here
        self.clock_from_stamps = False

    # -- reading ---------------------------------------------------------------------
    def more(self) -> bool:
        block = self.next_block()
        if block is None:
            return False
        self.buf += block
        return True

    def next_block(self) -> bytes | None:
        """The next block of text (None: the text has ended)."""
        if self.eof:
            return None
        for block in self.blocks:
            if block:
                self.total += len(block)
                return block
        self.eof = True
        return None

    def fill(self, target: int) -> bool:
        """Reads text until the buffer holds ``target`` bytes; False when it ends first.

        The blocks are joined to the buffer at once: appended one at a time, each growth of
        the buffer copies it whole (0.6 s per GB of text, against 0.07 s joined).
        """
        parts, size = [self.buf], len(self.buf)
        while size < target:
            block = self.next_block()
            if block is None:
                break
            parts.append(block)
            size += len(block)
        if len(parts) > 1:
            self.buf = bytearray().join(parts)
        return size >= target

    def invalid_json(self, message: str, base: int | None = None) -> InputError:
        base = self.offset if base is None else base

        def absolute(match: re.Match[str]) -> str:
            return f"(byte {int(match.group(1)) + base})"

        return InputError(self.display, f"is not valid JSON: {_BYTE_POS.sub(absolute, message)}")

    # -- the document's start ----------------------------------------------------------
    def start(self) -> str:
        """Skips to the first value; returns "list" or "object"."""
        while True:
            if self.buf.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte order mark
                self.offset += 3
                del self.buf[:3]
            first = _NOT_WS.search(self.buf)
            if first is not None:
                self.offset += first.start()
                del self.buf[: first.start()]
                if not self.buf.startswith(b"\xef\xbb\xbf"):
                    break
                continue
            # whitespace only so far: dropped, so a file of padding costs one block, not
            # its size (and one search per block, not one over all of it)
            self.offset += len(self.buf)
            del self.buf[:]
            if not self.more():
                if self.total == 0:
                    raise InputError(self.display, "is empty")
                raise InputError(
                    self.display, f"holds only whitespace ({self.total:,} bytes), no JSON value"
                )
        if _CONTROL.search(self.buf, 0, BINARY_SAMPLE_BYTES):
            raise InputError(self.display, "is not JSON (it looks like binary data)")
        first = self.buf[0]
        if first == ord("["):
            return "list"
        if first == ord("{"):
            return "object"
        sample = bytes(self.buf[:16])
        if all(32 <= b < 127 or b in b"\t\r\n" for b in sample):
            raise InputError(
                self.display,
                f"is not a Chrome trace: expected a JSON object or list, found "
                f"{sample.decode('ascii')[:12]!r}",
            )
        raise InputError(self.display, "is not JSON (it looks like binary data)")

    def head(self) -> dict[str, Any]:
        """Finds the top-level "traceEvents" key; returns the keys before it.

        Leaves the buffer starting at the array's "[".
        """
        search_from = 0
        while True:
            k = self.buf.find(b'"traceEvents"', search_from)
            if k < 0:
                if len(self.buf) > HEAD_LIMIT_BYTES:
                    raise InputError(
                        self.display,
                        f"has no top-level traceEvents in its first {HEAD_LIMIT_BYTES >> 20} MiB; "
                        "is it a Chrome trace?",
                    )
                search_from = max(0, len(self.buf) - 16)
                if not self.more():
                    self.raise_without_events()
                continue
            match = _KEY.match(self.buf, k)
            if match is None or match.end() >= len(self.buf):
                # the key's colon or value may still be in the next block
                if match is None and len(self.buf) - k > 64:
                    search_from = k + 1
                    continue
                if self.more():
                    continue
                self.raise_without_events()
            try:
                head = _ANY_DECODER.decode(bytes(self.buf[:k]) + b'"traceEvents":null}')
            except msgspec.DecodeError:
                search_from = k + 1  # inside a string or a nested object: keep looking
                continue
            value = self.buf[match.end()]
            if value != ord("["):
                kind = {ord("{"): "an object", ord("n"): "null", ord('"'): "a string"}.get(
                    value, "not a list"
                )
                raise InputError(self.display, f"traceEvents is {kind}, expected a list of events")
            self.offset += match.end()
            del self.buf[: match.end()]
            return head if isinstance(head, dict) else {}

    def raise_without_events(self) -> None:
        """At EOF with no traceEvents found: say precisely what the document is."""
        try:
            doc = _ANY_DECODER.decode(self.buf)
        except msgspec.DecodeError as exc:
            raise self.invalid_json(str(exc)) from None
        if isinstance(doc, dict):
            keys = ", ".join(sorted(map(str, doc))[:8]) or "none"
            raise InputError(
                self.display, f"has no traceEvents (top-level keys: {keys}); not a Chrome trace"
            )
        raise InputError(self.display, "is JSON but not a Chrome trace (no traceEvents)")

    # -- the events ----------------------------------------------------------------------
    def body(self) -> None:
        """Decodes complete events chunk by chunk while more text keeps arriving."""
        while not self.array_done:
            target = self.chunk_bytes
            if not self.clock.decided:
                target = min(target, FIRST_CHUNK_BYTES)
            if self.fill(target):
                if self.decode_prefix() or self.array_done:
                    continue
                if self.out_of_turn:  # what follows judges the text: in turn only
                    self.settle(wait=True)
                    continue
                self.squeeze_whitespace()
                if len(self.buf) > self.stuck_bytes:
                    self.diagnose_stuck()
                if self.more():
                    continue
            if not self.out_of_turn:
                return
            # the text has ended: the chunks out of turn are settled (one taken back
            # refills the buffer, and the loop decodes it here)
            self.settle(wait=True)

    @property
    def stuck_bytes(self) -> int:
        """Text held with no event boundary in it before the decode gives up."""
        return 4 * self.chunk_bytes + HEAD_LIMIT_BYTES

    def squeeze_whitespace(self) -> None:
        """Drops a run of whitespace longer than a chunk at the buffer's end, between
        tokens: 100 MB of padding inside the array is valid JSON, and holding it whole was
        reported as "Input data was truncated"."""
        if _NOT_WS.search(self.buf, max(0, len(self.buf) - self.chunk_bytes - 1)):
            return  # no long run at the end (the common case: checked in one chunk)
        keep = len(self.buf.rstrip(b" \t\r\n")) + 1
        if _outside_strings(self.buf, keep):
            del self.buf[keep:]

    def find_cut(self, end: int) -> int | None:
        """Position of the comma after the last complete-looking event before ``end``."""
        pos = end
        while True:
            close = self.buf.rfind(b"}", 1, pos)
            if close < 0:
                return None
            match = _CUT.match(self.buf, close)
            if match is not None:
                return self.buf.index(b",", close, match.end())
            pos = close

    def decode_prefix(self) -> bool:
        """Decodes events up to the last good cut (or hands them to the helper); False when
        no cut was found yet."""
        if self.out_of_turn:
            self.settle(wait=len(self.out_of_turn) >= _MAX_OUT_OF_TURN)
        if self.hand_over():
            return True
        end = len(self.buf)
        try:
            for _ in range(_MAX_CUT_TRIES):
                cut = self.find_cut(end)
                if cut is None:
                    return False
                try:
                    decoded = self.decode_until(cut)
                except _ArrayEnded as ended:
                    self.end_array(ended.at)
                    return True
                if decoded:
                    self.advance(cut)
                    return True
                end = cut
        except _InTurnOnly:
            self.settle(wait=True)
            return True
        return False

    def advance(self, cut: int) -> None:
        self.buf[cut] = ord("[")  # the rest becomes a JSON array again
        self.offset += cut
        del self.buf[:cut]

    def decode_until(self, cut: int) -> bool:
        self.buf[cut] = ord("]")
        view = memoryview(self.buf)[: cut + 1]
        skipped: Counter[str] = Counter()
        scanned = None
        try:
            scanned = scanned_columns(view, self.clock)
            events = None if scanned is not None else EVENTS_DECODER.decode(view)
        except msgspec.ValidationError:
            events = None
        except msgspec.DecodeError as exc:
            # A cut inside an event fails at the "]" put at the cut or runs out of text;
            # a failure before the cut is a real syntax error in the file.
            position = _BYTE_POS.search(str(exc))
            if position is not None and int(position.group(1)) < cut:
                if self.out_of_turn:
                    raise _InTurnOnly from None
                if "trailing characters" in str(exc):
                    # the events array closed before the cut: what follows is the rest of
                    # the document (its other keys), not events
                    # (msgspec reports the byte after the first trailing one)
                    raise _ArrayEnded(int(position.group(1)) - 1) from None
                raise self.invalid_json(str(exc)) from None
            return False
        except RecursionError:
            if self.out_of_turn:
                raise _InTurnOnly from None
            raise
        finally:
            view.release()
            self.buf[cut] = ord(",")
        kept = None
        if self.out_of_turn:
            with memoryview(self.buf) as whole:  # one copy (a slice of the bytearray is two)
                kept = bytes(whole[1:cut])
        if scanned is not None:
            frame, flows, names = scanned
            self.place(DecodedChunk(frame, flows, names, skipped, 0), kept)
            return True
        if events is None:  # valid JSON? then only some events are bad
            text = bytes(self.buf[:cut]) + b"]"
            try:
                raws = RAW_LIST_DECODER.decode(text)
            except msgspec.DecodeError:
                return False
            events, skipped = events_one_by_one(raws)
        self.add(events, skipped, kept)
        return True

    def add_text(self, text: bytes | msgspec.Raw) -> None:
        """Decodes the events array's last part (valid JSON) into columns, in turn."""
        scanned = scanned_columns(text, self.clock)
        if scanned is not None:
            self.place(DecodedChunk(*scanned, Counter(), 0), None)
            return
        skipped: Counter[str] = Counter()
        try:
            events = EVENTS_DECODER.decode(text)
        except msgspec.ValidationError:
            events, skipped = events_one_by_one(RAW_LIST_DECODER.decode(text))
        self.add(events, skipped)

    def add(self, events: list[Event], skipped: Counter[str], kept: bytes | None = None) -> None:
        """Turns a chunk's events into columns here; ``kept``: its text, when chunks ahead
        of it are still with the helper (it then waits for them, out of turn)."""
        if PAIRED_PHASES.intersection({event.ph for event in events}):
            self.parallel = False  # B/E pair across chunks: the helper would decline them
            if kept is not None:
                raise _InTurnOnly
        events = self.pairs.pair(events)
        chunk = DecodedChunk(None, None, [], skipped, 0)
        if events:
            lossy = self.clock.lossy
            chunk.frame, chunk.flows, chunk.names = columns(events, self.clock)
            chunk.lossy, self.clock.lossy = self.clock.lossy - lossy, lossy
        self.place(chunk, kept)

    def place(self, chunk: DecodedChunk, kept: bytes | None) -> None:
        """A chunk's columns to the sink, or held out of turn with its text (``kept``)."""
        if kept is None:
            self.to_sink(chunk)
        else:
            self.out_of_turn.append(_OutOfTurn(self.offset, kept, chunk))

    def to_sink(self, chunk: DecodedChunk) -> None:
        self.names.extend(chunk.names)
        self.skipped.update(chunk.skipped)
        self.clock.lossy += chunk.lossy
        if chunk.frame is not None or chunk.normalised is not None:
            self.sink(chunk)

    # -- the helper process ----------------------------------------------------------
    def hand_over(self) -> bool:
        """Gives the next chunk to the helper if it can take one now.

        The first chunk decides the file's clock. When the helper is ready for it, the
        clock is decided here from the chunk's timestamps alone (a decode of one field, a
        fifth of the chunk's full decode) and the chunk goes to the helper, strictly: a
        malformed event in it (which a full decode here would have left out of the
        decision) or B/E events send it back, and it is decoded here as if never handed.
        """
        if not self.parallel:
            return False
        first = not self.clock.decided
        if self.helper is None:
            self.helper = take_spare()
        if self.helper is None:
            if first:
                return False  # a helper started now could not take it before it is decoded
            if not can_help():
                self.parallel = False
                return False
            try:
                self.helper = DecodeHelper()
            except OSError:
                self.parallel = False
                return False
        slot = self.helper.free_slot()
        if slot is None:
            return False
        cut = self.find_cut(len(self.buf))
        if cut is None:
            return False
        self.buf[cut] = ord("]")
        view = memoryview(self.buf)[: cut + 1]
        try:
            if first and not self.decide_clock(view):
                return False
            flags = self.helper_work.flags | (STRICT if first else 0)
            handed = self.helper.submit(slot, self.seq + 1, view, self.clock.base_us, flags)
        finally:
            view.release()
            self.buf[cut] = ord(",")
        if not handed:
            if first:
                self.clock = TsClock()
            return False
        self.clock_from_stamps |= first
        self.seq += 1
        self.out_of_turn.append(_OutOfTurn(self.offset, b"", None, self.seq, slot, cut + 1))
        self.advance(cut)
        return True

    def decide_clock(self, chunk: memoryview) -> bool:
        """Decides the clock from the first chunk's timestamps; False if the chunk is not
        one valid array of events (a cut inside a string): it is then decoded here."""
        try:
            stamps = _STAMPS_DECODER.decode(chunk)
        except (msgspec.DecodeError, RecursionError):
            return False
        self.clock.decide([stamp.ts for stamp in stamps])
        return True

    def settle(self, wait: bool) -> None:
        """Sinks, in file order, the chunks out of turn whose turn has come (with ``wait``,
        all of them); a chunk the helper declined is taken back with all after it."""
        while self.out_of_turn:
            first = self.out_of_turn[0]
            if first.chunk is None:
                assert self.helper is not None
                result = self.helper.next_result(wait)
                if result is None:
                    return
                seq, chunk = result
                assert seq == first.seq, (seq, first.seq)
                if chunk is None:
                    self.take_back()
                    return
                first.chunk = chunk
                self.helper_chunks += 1
            self.out_of_turn.popleft()
            self.to_sink(first.chunk)

    def take_back(self) -> None:
        """The chunks out of turn, from the first, go back into the buffer and are decoded
        here, in turn, with no helper for the rest of the file."""
        first = self.out_of_turn[0]
        assert self.helper is not None
        texts = [  # a helper's chunk still has its text in its slot
            self.helper.text_in(part.slot, part.size)[1:-1] if part.size else part.text
            for part in self.out_of_turn
        ]
        self.out_of_turn.clear()
        self.parallel = False
        self.stop_helper()
        if self.clock_from_stamps and first.seq == 1:
            self.clock = TsClock()  # the first chunk again: it decides the clock here
        # the buffer starts with the "[" put at the last cut, where a "," was
        self.buf[0] = ord(",")
        self.buf[:0] = b"[" + b",".join(texts)
        self.offset = first.offset

    def stop_helper(self) -> None:
        if self.helper is not None:
            self.helper.close()
            self.helper = None

    def diagnose_stuck(self) -> None:
        """No cut decodes across several chunks: the JSON itself is broken; say where."""
        cut = self.find_cut(len(self.buf))
        text = bytes(self.buf[:cut]) + b"]" if cut is not None else bytes(self.buf)
        try:
            RAW_LIST_DECODER.decode(text)
        except msgspec.DecodeError as exc:
            # still open (truncated) or closed with the document's rest after it (trailing
            # characters): the text is valid so far, one event is just that large
            if not _VALID_SO_FAR.search(str(exc)):
                raise self.invalid_json(str(exc)) from None
        raise InputError(
            self.display,
            f"has a single event larger than {self.stuck_bytes >> 20} MiB (from byte "
            f"{self.offset}), the most one event may take",
        )

    def twice(self) -> InputError:
        return InputError(
            self.display,
            "has the top-level key traceEvents twice; refused rather than read in part",
        )

    def end_array(self, at: int) -> None:
        """The events array ends before ``at``: its last events are decoded, and the
        buffer keeps what follows it for :meth:`tail`."""
        self.add_text(bytes(self.buf[:at]))
        self.offset += at
        del self.buf[:at]
        self.array_done = True

    def tail(self, mode: str) -> dict[str, Any]:
        """Decodes what is left: the last events and the keys after the array."""
        opening = b'{"traceEvents":'
        if self.array_done:  # the buffer starts after the array: read the rest, bounded
            opening = b'{"traceEvents":[]'
            while self.more():
                if len(self.buf) > HEAD_LIMIT_BYTES:
                    if b'"traceEvents"' in self.buf:
                        raise self.twice()
                    raise InputError(
                        self.display,
                        f"has more than {HEAD_LIMIT_BYTES >> 20} MiB after its traceEvents; "
                        "is it a Chrome trace?",
                    )
        base = self.offset - len(opening)
        text = opening + bytes(self.buf) + (b"}" if mode == "list" else b"")
        self.buf = bytearray()
        try:
            parts = _RAW_DICT_DECODER.decode(text)
        except msgspec.DecodeError as exc:
            message = str(exc)
            if "truncated" in message:
                raise InputError(
                    self.display, "is not valid JSON: it ends early (truncated)"
                ) from None
            raise self.invalid_json(message, base) from None
        raw_events = parts.pop("traceEvents")
        if bytes(raw_events) != text[15 : 15 + len(raw_events)]:
            raise self.twice()  # a later key replaced the list being read: half the events
        self.add_text(raw_events)
        return {key: _ANY_DECODER.decode(raw) for key, raw in parts.items()}


def decode_trace(
    blocks: Iterator[bytes],
    display: str,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    sink: ChunkSink | None = None,
    parallel: bool = False,
    helper_work: HelperWork = HelperWork(),
) -> DecodedTrace:
    """Decodes a Chrome trace (an object with ``traceEvents`` or a bare event list).

    Each chunk goes to ``sink`` as soon as it is decoded, in file order; without a sink
    the raw columns are collected into the returned ``frame`` and ``flows``. ``parallel``:
    from the second chunk on, a helper process (diagnostics.trace.decode_helper) decodes
    chunks beside this one, on another core, and does ``helper_work`` too (a sink's); the
    result is the same.
    """
    frames: list[pl.DataFrame] = []
    flow_frames: list[pl.DataFrame] = []

    def collect(chunk: DecodedChunk) -> None:
        assert chunk.frame is not None  # the helper normalises for a sink only
        frames.append(chunk.frame)
        if chunk.flows is not None:
            flow_frames.append(chunk.flows)

    if sink is None:
        sink, helper_work = collect, HelperWork()
    chunker = _Chunker(display, iter(blocks), chunk_bytes, sink, parallel, helper_work)
    try:
        mode = chunker.start()
        top = chunker.head() if mode == "object" else {}
        chunker.body()
        chunker.stop_helper()
        top.update(chunker.tail(mode))
    except RecursionError:
        # msgspec stops at a fixed nesting depth; a trace never nests more than a few levels
        raise InputError(
            display,
            "nests JSON arrays or objects deeper than the decoder's recursion limit; "
            "not a Chrome trace",
        ) from None
    finally:
        chunker.stop_helper()
    top.pop("traceEvents", None)
    chunker.skipped.update(chunker.pairs.finish())
    return DecodedTrace(
        frame=pl.concat(frames, rechunk=False) if frames else pl.DataFrame(schema=RAW_EVENT_SCHEMA),
        flows=(
            pl.concat(flow_frames, rechunk=False)
            if flow_frames
            else pl.DataFrame(schema=RAW_FLOW_SCHEMA)
        ),
        top=top,
        names=chunker.names,
        skipped=chunker.skipped,
        ts_base_us=chunker.clock.base_us,
        ts_lossy=chunker.clock.lossy,
        helper_chunks=chunker.helper_chunks,
    )
