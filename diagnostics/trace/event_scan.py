"""Chunks of events read by the compiled scanner (diagnostics/trace/event_scan.c).

The scanner turns a chunk's JSON text straight into the event table's raw columns, the
ones :func:`diagnostics.trace.columns.columns` makes from msgspec's Structs, without a
Python object per event: a quarter of the time or less. It reads the usual chunk of every
Kineto version here (numeric-string pids and tids included) and declines anything it would
not read exactly as msgspec does (an escaped string it would keep, a float in re-encoded
shapes, B/E events, ...), which the msgspec path then reads as before; a chunk is read by
one path or the other, whole. Where the extension was not built (no C compiler), every chunk takes
the msgspec path.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from diagnostics.arrow_capsules import series
from diagnostics.trace.columns import EVENT_DECODER, TsClock

try:
    from diagnostics.trace import _event_scan
except ImportError:  # not built: the msgspec path reads every chunk
    _event_scan = None

BUILT = _event_scan is not None


def _frame(columns: list[tuple[object, object]]) -> pl.DataFrame:
    return pl.DataFrame([series(capsules) for capsules in columns])


def keep_spare_blocks() -> None:
    """The scanner keeps the column blocks polars lets go of for the next chunks (up to 32
    MiB), until the matching :func:`release_spare_blocks`."""
    if _event_scan is not None:
        _event_scan.keep_spare()


def release_spare_blocks() -> None:
    """Gives back the column blocks the scanner kept for reuse, once no load keeps them."""
    if _event_scan is not None:
        _event_scan.release_spare()


def scanned_columns(
    text: bytes | bytearray | memoryview, clock: TsClock
) -> tuple[pl.DataFrame, pl.DataFrame | None, list[tuple[str, Any, Any, Any]]] | None:
    """A chunk's text (a JSON array of whole events) -> what ``columns(events, clock)``
    gives for its events; None when the scanner declines it (or is not built), or when
    the file's clock keeps a base (TsClock: timestamps beyond 2^53)."""
    if _event_scan is None or clock.base_us is not None:
        return None
    scanned = _event_scan.scan(text)
    if scanned is None:
        return None
    # the scanner declines timestamps beyond 2^53, so a first chunk it reads sets no base
    clock.decided = True
    event_table, flow_table, spans = scanned
    frame = _frame(event_table)
    flows = _frame(flow_table) if flow_table is not None else None
    names = []
    if spans:
        offsets = memoryview(spans).cast("q")
        view = memoryview(text)
        for at in range(0, len(offsets), 2):
            event = EVENT_DECODER.decode(view[offsets[at] : offsets[at + 1]])
            names.append((event.name or "", event.pid, event.tid, event.args.name))
    return frame, flows, names
