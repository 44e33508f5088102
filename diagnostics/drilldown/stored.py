"""A trace's event table kept on disk, read one step's window at a time.

An uploaded trace's drill-down lives in the server for as long as the browser session
looks at it. Its tables (operators, kernels, memory, steps) are small; the event table is
not (~0.2 KB per event, so ~1 GB at the default 5 million-event budget). So the analysis
child writes each trace's events and flows as Arrow IPC files, sorted by ``ts`` and cut
into parts of ``BATCH_ROWS`` (one file each), with each part's first start and last end.
The server then reads only the parts that overlap the chosen step: its
memory is the small tables plus one step.

``pl.scan_ipc(...).filter(...)`` on one file would be the obvious reader, but polars 2.1
maps and touches the whole file for it (a 35 MiB table added 46 MiB to the reader's RSS
for a 5% window), and polars writes one record batch per file, so Arrow's random access
to batches would need pyarrow in the child, whose numpy/OpenBLAS start-up alone fails
under a small address-space limit. One file per part avoids both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from diagnostics.errors import InputError
from diagnostics.trace.schema import LoadedTrace, TraceMetadata

# Rows per part: ~2 MB of events, so a step's read overshoots by a few MB at most, and the
# default 5 million-event budget makes ~600 small files.
BATCH_ROWS = 8_192
_ROW = "_row"


@dataclass(frozen=True)
class _Batches:
    folder: str  # part i is <folder>/<i>.arrow
    starts_us: tuple[float, ...]  # per batch: the smallest ts
    ends_us: tuple[float, ...]  # per batch: the largest ts + dur


def _write(frame: pl.DataFrame, folder: Path) -> _Batches:
    # sorted for the parts' bounds; _row restores the loader's order on the way back, so a
    # step's views see exactly the rows, in the order, that the in-memory trace gives them
    frame = frame.with_row_index(_ROW).sort("ts", maintain_order=True)
    end = pl.col("ts") + (pl.col("dur").fill_null(0.0) if "dur" in frame.columns else 0.0)
    folder.mkdir(parents=True, exist_ok=True)
    starts, ends = [], []
    for n, offset in enumerate(range(0, frame.height, BATCH_ROWS)):
        part = frame.slice(offset, BATCH_ROWS)
        bounds = part.select(pl.col("ts").min().alias("s"), end.max().alias("e")).row(0)
        starts.append(float(bounds[0]) if bounds[0] is not None else float("inf"))
        ends.append(float(bounds[1]) if bounds[1] is not None else float("-inf"))
        # lz4: 42 MB -> 5.6 MB for the 151k-event V100 trace, at no visible cost
        part.write_ipc(folder / f"{n}.arrow", compression="lz4")
    return _Batches(str(folder), tuple(starts), tuple(ends))


def _read(
    batches: _Batches, empty: pl.DataFrame, start_us: float, end_us: float, label: str
) -> pl.DataFrame:
    wanted = [
        i
        for i, (s, e) in enumerate(zip(batches.starts_us, batches.ends_us, strict=True))
        if s <= end_us and e >= start_us
    ]
    if not wanted:
        return empty.with_row_index(_ROW)
    try:
        parts = [pl.read_ipc(Path(batches.folder) / f"{i}.arrow") for i in wanted]
    except OSError:
        raise InputError(
            label,
            "this upload's step data is no longer on the server (uploads are kept for a "
            "while, then removed); upload the trace again",
        ) from None
    return pl.concat(parts).cast(dict(empty.schema))


@dataclass(frozen=True)
class StoredTrace:
    """Stands in for a LoadedTrace whose events and flows are in IPC files."""

    metadata: TraceMetadata
    events: _Batches
    flows: _Batches
    event_schema: dict[str, pl.DataType]
    flow_schema: dict[str, pl.DataType]

    @property
    def rank(self) -> int:
        return self.metadata.rank

    def window(self, start_us: float, end_us: float, label: str = "") -> LoadedTrace:
        """The events and flows that overlap [start_us, end_us] (a superset: whole batches
        filtered to the window, as the drill-down's views filter again)."""
        end = pl.col("ts") + pl.col("dur").fill_null(0.0)
        where = label or os.path.basename(self.metadata.path)
        events = _read(
            self.events, pl.DataFrame(schema=self.event_schema), start_us, end_us, where
        ).filter((pl.col("ts") <= end_us) & (end >= start_us))
        flows = _read(
            self.flows, pl.DataFrame(schema=self.flow_schema), start_us, end_us, where
        ).filter(pl.col("ts").is_between(start_us, end_us))
        events = events.sort(_ROW).drop(_ROW)
        flows = flows.sort(_ROW).drop(_ROW)
        return LoadedTrace(events=events, metadata=self.metadata, flows=flows)


def store_trace(trace: LoadedTrace, folder: Path, stem: str) -> StoredTrace:
    """Writes the trace's events and flows under ``folder``, in ``<stem>.events/`` and
    ``<stem>.flows/``."""
    folder.mkdir(parents=True, exist_ok=True)
    return StoredTrace(
        metadata=trace.metadata,
        events=_write(trace.events, folder / f"{stem}.events"),
        flows=_write(trace.flows, folder / f"{stem}.flows"),
        event_schema=dict(trace.events.schema),
        flow_schema=dict(trace.flows.schema),
    )


def window(
    trace: LoadedTrace | StoredTrace, start_us: float, end_us: float, label: str = ""
) -> LoadedTrace:
    """The part of either kind of trace that a step's views read (an in-memory trace is
    handed over whole: the views filter it themselves)."""
    if isinstance(trace, StoredTrace):
        return trace.window(start_us, end_us, label)
    return trace
