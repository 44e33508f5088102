"""The one trace loader: a file, a folder of per-rank traces, or a run folder.

Every path into the analyser comes through here and leaves as :class:`LoadedInput`: one
:class:`~diagnostics.trace.schema.LoadedTrace` per rank (event table, metadata, flows)
plus the run's records when the input was a run folder. Any problem with the input is an
:class:`~diagnostics.errors.InputError` naming the file and what is wrong.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import polars as pl

from diagnostics.errors import InputError
from diagnostics.progress import ProgressCallback, ReadProgress
from diagnostics.runs import RunFolder, RunFolderError
from diagnostics.sources import RunData
from diagnostics.trace.budget import (
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    DEFAULT_MAX_EVENTS,
    Budget,
    BudgetExceeded,
    Limits,
)
from diagnostics.trace.chunk_decode import DecodedChunk
from diagnostics.trace.decode import DEFAULT_CHUNK_BYTES, HelperWork, decode_trace
from diagnostics.trace.event_scan import keep_spare_blocks, release_spare_blocks
from diagnostics.trace.freed_memory import give_freed_memory_back, keep_freed_memory
from diagnostics.trace.metadata_fields import checked_device_properties, checked_distributed_info
from diagnostics.trace.normalise import TableBuilder
from diagnostics.trace.schema import LoadedTrace, TraceMetadata
from diagnostics.trace.source import TRACE_SUFFIXES, BytesRead, iter_blocks, prefetch
from diagnostics.trace.validate import check_times

# "rank-3", "rank_3", "rank3" (HTA, torchrun layouts) or "worker3" (tb plugin samples)
_RANK_IN_NAME = (
    re.compile(r"rank[-_]?(\d+)", re.IGNORECASE),
    re.compile(r"worker[-_]?(\d+)", re.IGNORECASE),
)
# Top-level keys kept in metadata.extra when their value is small (not INFO log lists).
_EXTRA_MAX_ITEMS = 32


@dataclass(frozen=True)
class LoadedInput:
    """Everything read from one input path, before any analysis."""

    kind: Literal["trace", "ranks", "run"]
    path: str
    traces: tuple[LoadedTrace, ...]  # one per rank, by rank; empty for a run without traces
    run: RunData | None = None
    files: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(trace.rank for trace in self.traces)


def is_trace_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith(TRACE_SUFFIXES)


def rank_from_name(name: str) -> int | None:
    for pattern in _RANK_IN_NAME:
        match = pattern.search(name)
        if match:
            return int(match.group(1))
    return None


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _summarise(counter: Counter[str], limit: int = 5) -> str:
    parts = [f"{count:,} {reason}" for reason, count in counter.most_common(limit)]
    if len(counter) > limit:
        parts.append("...")
    return "; ".join(parts)


def _small(value: Any) -> bool:
    if isinstance(value, list | dict):
        return len(value) <= _EXTRA_MAX_ITEMS and len(repr(value)) <= 2000
    return not isinstance(value, str) or len(value) <= 2000


def _metadata(
    top: dict[str, Any],
    names: list[tuple[str, Any, Any, Any]],
    display: str,
    rank: int,
    rank_source: str,
) -> dict[str, Any]:
    device_properties = checked_device_properties(display, top.get("deviceProperties"))
    distributed = checked_distributed_info(display, top.get("distributedInfo"))
    process_names: dict[int, str] = {}
    thread_names: dict[tuple[int, int], str] = {}
    for name, pid, tid, label in names:
        if not isinstance(label, str) or not isinstance(pid, int):
            continue
        if name == "process_name":
            process_names[pid] = label
        elif name == "thread_name" and isinstance(tid, int):
            thread_names[(pid, tid)] = label
    known = {
        "deviceProperties",
        "distributedInfo",
        "schemaVersion",
        "baseTimeNanoseconds",
        "displayTimeUnit",
    }
    version = next(
        (
            str(top[key])
            for key in ("pytorch_version", "torch_version", "pytorchVersion")
            if top.get(key)
        ),
        None,
    )
    base_time = top.get("baseTimeNanoseconds")
    schema_version = top.get("schemaVersion")
    return {
        "path": display,
        "rank": rank,
        "rank_source": rank_source,
        "files": (display,),
        "device_properties": device_properties,
        "distributed_info": distributed if isinstance(distributed, dict) else None,
        "pytorch_version": version,
        "schema_version": schema_version if isinstance(schema_version, int) else None,
        "base_time_ns": base_time if isinstance(base_time, int) else None,
        "display_time_unit": top.get("displayTimeUnit")
        if isinstance(top.get("displayTimeUnit"), str)
        else None,
        "process_names": process_names,
        "thread_names": thread_names,
        "extra": {k: v for k, v in top.items() if k not in known and _small(v)},
    }


def _chosen_rank(rank: int | None, top: dict[str, Any], display: str) -> tuple[int, str]:
    """The file's rank and where it came from (see :func:`load_trace_file`)."""
    distributed = checked_distributed_info(display, top.get("distributedInfo"))
    info_rank = distributed.get("rank") if distributed is not None else None
    if rank is not None:
        return rank, "given"
    if isinstance(info_rank, int) and info_rank >= 0:
        return info_rank, "distributedInfo"
    if (named := rank_from_name(Path(display).name)) is not None:
        return named, "file name"
    return 0, "default"


def load_trace_file(
    path: str | os.PathLike[str],
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    display_name: str | None = None,
    rank: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_events: int = DEFAULT_MAX_EVENTS,
    budget: Budget | None = None,
    parallel_decode: bool = True,
    with_flows: bool = True,
    read_progress: ReadProgress | None = None,
) -> LoadedTrace:
    """One Chrome-trace file -> its event table, metadata and flows.

    The rank is ``rank`` when given, else ``distributedInfo.rank``, else a number in the
    file name (``rank3``, ``rank-3``, ``worker3``), else 0 (with a note saying so).
    ``budget`` is shared by every file of one input; without it this file alone may use
    ``max_decompressed_bytes`` and ``max_events``. ``parallel_decode``: a file of more
    than one chunk is decoded on two cores (diagnostics.trace.decode_helper); off where
    the caller already runs one load per core (diagnostics.rank_pool). ``with_flows``:
    keep the flow events (ph s/f/t); only drill-downs read them, so the analysis leaves
    them out (a third of a modern trace's events: 130 MB of a 1 GB trace's table).
    ``read_progress`` hears how far the file's read has got.
    """
    path = Path(path)
    display = display_name or str(path)
    if budget is None:
        budget = Budget(Limits(max_decompressed_bytes, max_events))
    builder = TableBuilder(with_flows)

    def sink(chunk: DecodedChunk) -> None:
        # counted before the chunk is kept: a bomb stops one chunk past the limit
        budget.take_events(chunk.rows, display)
        if chunk.normalised is not None:
            builder.add_normalised(chunk.normalised)
        else:
            assert chunk.frame is not None
            builder.add(chunk.frame, chunk.flows)

    if read_progress is None:
        blocks = prefetch(iter_blocks(path, display=display, budget=budget))
    else:  # the file's bytes counted only when its read is followed
        read = BytesRead()
        blocks = read_progress.following(
            path,
            prefetch(iter_blocks(path, display=display, budget=budget, read=read)),
            lambda: read.count,
        )
    # the chunks' buffers and column blocks reuse the same pages (freed_memory, event_scan)
    keep_freed_memory()
    keep_spare_blocks()
    try:
        decoded = decode_trace(
            blocks,
            display,
            chunk_bytes=chunk_bytes,
            sink=sink,
            parallel=parallel_decode,
            helper_work=HelperWork(normalise=True, with_flows=with_flows),
        )
        rank, rank_source = _chosen_rank(rank, decoded.top, display)
        total_rows = builder.rows
        if total_rows == 0 and not decoded.skipped:
            raise InputError(display, "traceEvents is empty: there is nothing to analyse")
        table = builder.finish(rank)
    finally:
        # the raw chunks are gone, or the load failed: the scanner's spare blocks and the
        # heap's free memory go either way (a served app loads on after a refused file)
        release_spare_blocks()
        give_freed_memory_back()
    notes: list[str] = []
    skipped = decoded.skipped + table.skipped
    n_skipped = sum(skipped.values())
    if table.events.height == 0:
        if n_skipped:
            raise InputError(
                display,
                f"has no usable events: all {_plural(n_skipped, 'event')} are malformed "
                f"({_summarise(skipped)})",
            )
        raise InputError(
            display,
            "has no complete (ph X) or instant (ph i) events: nothing to analyse",
        )
    events, warnings = check_times(table.events, display)
    if events.height == 0:
        raise InputError(display, "has no event whose time can be right: " + warnings[-1])
    table = replace(table, events=events)
    if decoded.ts_lossy:
        warnings.append(
            f"{display}: {decoded.ts_lossy:,} timestamps are fractional numbers beyond 2^53 µs, "
            "where a 64-bit float cannot keep every µs: times between those events may be "
            "off by several µs (write integer or smaller timestamps to keep them exact)"
        )
    if n_skipped:
        total = total_rows + sum(decoded.skipped.values())
        warnings.append(
            f"{display}: skipped {n_skipped:,} of {total:,} events as malformed "
            f"({_summarise(skipped)})"
        )
    if table.ignored_phases:
        phases = ", ".join(f"{n:,} '{ph}'" for ph, n in sorted(table.ignored_phases.items()))
        notes.append(f"{display}: ignored events of phases the analyser does not use ({phases})")
    # Kineto's own rows ("Spans"/"Traces" span and iteration markers) have label pids
    unnumbered = int(
        table.events.select((pl.col("pid").is_null() | pl.col("tid").is_null()).sum()).item()
    )
    fields = _metadata(decoded.top, decoded.names, display, rank, rank_source)
    metadata = TraceMetadata(
        **fields,
        ts_base_us=decoded.ts_base_us,
        event_count=table.events.height,
        flow_count=table.flows.height if with_flows else builder.flow_rows,
        skipped_events=n_skipped,
        unnumbered_ids=unnumbered,
        warnings=tuple(warnings),
        notes=tuple(notes),
    )
    return LoadedTrace(events=table.events, metadata=metadata, flows=table.flows)


def _worker_name(name: str) -> str:
    """tensorboard_trace_handler names files "<worker>.<time>.pt.trace.json[.gz]"."""
    return name.split(".", 1)[0]


def _merge_same_rank(traces: list[LoadedTrace]) -> LoadedTrace:
    """Several files of one rank (profiler windows, ``repeat`` > 1): one clock, one table."""
    if len(traces) == 1:
        return traces[0]
    first = traces[0].metadata
    events = pl.concat([t.events for t in traces]).sort("ts", maintain_order=True)
    flows = pl.concat([t.flows for t in traces])
    metas = [t.metadata for t in traces]
    metadata = replace(
        first,
        files=tuple(f for m in metas for f in m.files),
        event_count=events.height,
        flow_count=flows.height,
        skipped_events=sum(m.skipped_events for m in metas),
        process_names={k: v for m in metas for k, v in m.process_names.items()},
        thread_names={k: v for m in metas for k, v in m.thread_names.items()},
        warnings=tuple(w for m in metas for w in m.warnings),
        notes=tuple(n for m in metas for n in m.notes),
    )
    return LoadedTrace(events=events, metadata=metadata, flows=flows)


def load_trace_files(
    paths: list[Path],
    *,
    display_names: list[str] | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    on_error: Callable[[InputError], None] | None = None,
    max_events: int = DEFAULT_MAX_EVENTS,
    with_flows: bool = True,
    progress: ProgressCallback | None = None,
) -> tuple[tuple[LoadedTrace, ...], tuple[str, ...]]:
    """Loads each file and groups them by rank: (traces by rank, notes).

    All files draw on one budget of ``max_decompressed_bytes`` and ``max_events``. A file
    that cannot be read raises its InputError, or, with ``on_error``, is handed to it and
    left out; going over the budget always raises (leaving out one file would hide it).
    ``progress`` hears how many MB of the files have been read.
    """
    if display_names is not None and len(display_names) != len(paths):
        raise ValueError("display_names must name every path")
    names = display_names or [str(p) for p in paths]
    budget = Budget(Limits(max_decompressed_bytes, max_events))
    read_progress = ReadProgress(paths, progress) if progress is not None else None
    if read_progress is not None:
        read_progress.start()
    loaded = []
    for path, name in zip(paths, names, strict=True):
        try:
            loaded.append(
                load_trace_file(
                    path,
                    display_name=name,
                    chunk_bytes=chunk_bytes,
                    budget=budget,
                    with_flows=with_flows,
                    read_progress=read_progress,
                )
            )
        except InputError as exc:
            if on_error is None or isinstance(exc, BudgetExceeded):
                raise
            on_error(exc)
    return as_ranks(loaded)


def as_ranks(loaded: list[LoadedTrace]) -> tuple[tuple[LoadedTrace, ...], tuple[str, ...]]:
    """Loaded files as the ranks of one job: (traces by rank, notes). The files are put on
    one clock, those without a rank numbered (windows of one process share one), and the
    windows of one rank merged."""
    loaded = _on_one_clock(loaded)
    notes: list[str] = []
    unknown = [t for t in loaded if t.metadata.rank_source == "default"]
    if len(loaded) > 1 and unknown:
        # Without rank information, files of one process (same worker name: profiler
        # windows) share a rank; different processes get the next free ranks in name order.
        taken = {t.rank for t in loaded if t.metadata.rank_source != "default"}
        workers = sorted({_worker_name(Path(t.metadata.path).name) for t in unknown})
        free = (r for r in range(len(loaded) + len(taken) + 1) if r not in taken)
        rank_of = {worker: next(free) for worker in workers}
        renumbered = []
        for trace in loaded:
            if trace.metadata.rank_source != "default":
                renumbered.append(trace)
                continue
            rank = rank_of[_worker_name(Path(trace.metadata.path).name)]
            meta = replace(
                trace.metadata,
                rank=rank,
                rank_source="file order",
            )
            events = trace.events.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank"))
            flows = trace.flows.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank"))
            renumbered.append(LoadedTrace(events=events, metadata=meta, flows=flows))
        loaded = renumbered
        notes.append(
            "no distributedInfo.rank and no rank in the file names of "
            + ", ".join(workers)
            + ": ranks given in file-name order ("
            + ", ".join(f"{w} -> {r}" for w, r in rank_of.items())
            + ")"
        )
    elif unknown:
        notes.append(
            f"{unknown[0].metadata.path}: no distributedInfo.rank and no rank in the file "
            "name; read as rank 0"
        )
    by_rank: dict[int, list[LoadedTrace]] = {}
    for trace in loaded:
        by_rank.setdefault(trace.rank, []).append(trace)
    merged = tuple(_merge_same_rank(by_rank[rank]) for rank in sorted(by_rank))
    return merged, tuple(notes)


def _on_one_clock(traces: list[LoadedTrace]) -> list[LoadedTrace]:
    """Files whose huge timestamps were rebased on different bases: one base for all.

    The shift between two bases is an exact integer and the offsets stay small, so the
    times stay exact while the files line up as written.
    """
    bases = {t.metadata.ts_base_us for t in traces} - {None}
    if len(bases) <= 1:
        return traces
    common = min(b for b in bases if b is not None)
    aligned = []
    for trace in traces:
        base = trace.metadata.ts_base_us
        if base is None or base == common:
            aligned.append(trace)
            continue
        shift = pl.col("ts") + float(base - common)
        aligned.append(
            LoadedTrace(
                events=trace.events.with_columns(shift),
                metadata=replace(trace.metadata, ts_base_us=common),
                flows=trace.flows.with_columns(shift),
            )
        )
    return aligned


def trace_files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if is_trace_file(p))


def load(
    path: str | os.PathLike[str],
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_events: int = DEFAULT_MAX_EVENTS,
    with_flows: bool = True,
    progress: ProgressCallback | None = None,
) -> LoadedInput:
    """A trace file, a folder of per-rank traces, or a run folder (with or without traces).

    The budgets hold for the input as a whole: every file of a folder draws on them.
    ``with_flows``: see :func:`load_trace_file`; ``progress``: :func:`load_trace_files`.
    """
    path = Path(path)
    display = str(path)
    if not path.exists():
        raise InputError(display, "no such file or folder")
    if path.is_file():
        traces, notes = load_trace_files(
            [path],
            max_decompressed_bytes=max_decompressed_bytes,
            chunk_bytes=chunk_bytes,
            max_events=max_events,
            with_flows=with_flows,
            progress=progress,
        )
        return LoadedInput(
            kind="trace",
            path=display,
            traces=traces,
            files=(display,),
            warnings=traces[0].metadata.warnings,
            notes=notes + traces[0].metadata.notes,
        )
    if not path.is_dir():
        raise InputError(display, "is neither a file nor a folder")
    run: RunData | None = None
    if RunFolder.is_run_folder(path):
        folder = RunFolder(path)
        try:
            run = RunData.read(folder)
        except RunFolderError as exc:
            raise InputError(display, f"is not a readable run folder ({exc})") from None
        files = folder.trace_files()
        kind: Literal["trace", "ranks", "run"] = "run"
    else:
        files = trace_files_in(path)
        if not files:
            raise InputError(
                display, "holds no trace files (*.json, *.json.gz) and is not a run folder"
            )
        kind = "ranks"
    skipped: list[str] = []
    # A run's traces are written while it runs: a window still being written (or cut
    # short by a crash) is left out with a warning rather than hiding the run's records.
    traces, notes = load_trace_files(
        files,
        max_decompressed_bytes=max_decompressed_bytes,
        chunk_bytes=chunk_bytes,
        max_events=max_events,
        on_error=(lambda exc: skipped.append(f"trace left out: {exc}")) if run else None,
        with_flows=with_flows,
        progress=progress,
    )
    if run is not None and RunFolder(path).world_size() <= 1:
        # a single-process run: every profiler window is rank 0's, whatever the names (a
        # distributed run's files carry distributedInfo, so they group by rank above)
        traces = _as_one_rank(traces)
        notes = ()
    return LoadedInput(
        kind=kind,
        path=display,
        traces=traces,
        run=run,
        files=tuple(str(f) for f in files),
        warnings=tuple(skipped) + tuple(w for t in traces for w in t.metadata.warnings),
        notes=notes + tuple(n for t in traces for n in t.metadata.notes),
    )


def _as_one_rank(traces: tuple[LoadedTrace, ...]) -> tuple[LoadedTrace, ...]:
    if len(traces) <= 1:
        return traces
    rank = traces[0].rank
    relabelled = [
        LoadedTrace(
            events=t.events.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank")),
            metadata=replace(t.metadata, rank=rank),
            flows=t.flows.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank")),
        )
        for t in traces
    ]
    return (_merge_same_rank(relabelled),)
