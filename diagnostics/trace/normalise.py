"""Raw decoded columns -> the event table (EVENT_SCHEMA) and the flow table (FLOW_SCHEMA).

All of it is polars expressions over whole columns: validation (which rows are usable
and why the others are not), category normalisation across Kineto versions, and the
legacy spellings of args keys folded into one column each.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import polars as pl

from diagnostics.trace.schema import EVENT_SCHEMA, FLOW_SCHEMA, Category, normalise_category

EVENT_PHASES = ("X", "i", "I")  # complete events and instants: the rows of the table
META_PHASE = "M"


@dataclass(frozen=True)
class Normalised:
    events: pl.DataFrame
    flows: pl.DataFrame
    skipped: Counter[str]  # reason -> events dropped as malformed
    ignored_phases: Counter[str]  # phase -> events of a kind the table does not hold


def _skip_reason() -> pl.Expr:
    """Why an event row cannot be used (null when it can)."""
    ph, ts, dur = pl.col("ph"), pl.col("ts"), pl.col("dur")
    return (
        pl.when(ts.is_null())
        .then(pl.lit("no ts"))
        .when(ts.is_nan() | ts.is_infinite())
        .then(pl.lit("ts is not a finite number"))
        .when((ph == "X") & dur.is_null())
        .then(pl.lit("complete event (ph X) without dur"))
        .when(dur < 0)
        .then(pl.lit("negative dur"))
        .when(dur.is_nan() | dur.is_infinite())
        .then(pl.lit("dur is not a finite number"))
        .when(pl.col("name").is_null())
        .then(pl.lit("no name"))
        .otherwise(pl.lit(None, dtype=pl.String))
    )


def _category(raw_categories: pl.Series) -> pl.Expr:
    """Normalised category: the few distinct raw spellings are mapped once, in Python."""
    mapping = {raw: str(normalise_category(raw)) for raw in raw_categories.unique().drop_nulls()}
    normalised = pl.col("cat").replace_strict(
        mapping, default=str(Category.OTHER), return_dtype=pl.String
    )
    # "[memory]" instants carry cat "cpu_instant_event" (2.x) or none at all (1.9)
    return (
        pl.when(pl.col("name") == "[memory]")
        .then(pl.lit(str(Category.MEMORY)))
        .otherwise(normalised)
        .alias("cat")
    )


@dataclass
class NormalisedChunk:
    """One decoded chunk (or a few, normalised at once) in the tables' schemas; rank 0."""

    events: pl.DataFrame  # EVENT_SCHEMA
    flows: pl.DataFrame | None  # FLOW_SCHEMA; None: none, or left out (flow_rows says how many)
    skipped: Counter[str]  # reason -> rows dropped as malformed
    ignored: Counter[str]  # phase -> rows of a kind the table does not hold
    rows: int  # decoded rows, flows included (what the event budget counts)
    flow_rows: int  # decoded flow rows, kept or not


def normalise_chunk(
    raw: pl.DataFrame, raw_flows: pl.DataFrame | None, with_flows: bool = True
) -> NormalisedChunk:
    """Decoded rows -> the tables' rows, rank 0; ``with_flows`` false: the flows are only
    counted.

    The common case (every row fine) costs one query; the counting queries run only when
    the rows hold a malformed one or a phase the table does not hold.
    """
    ph = pl.col("ph")
    is_event = ph.is_in(EVENT_PHASES).fill_null(False)
    checked = raw.with_columns(_is_event=is_event, _reason=pl.when(is_event).then(_skip_reason()))
    kinds = checked.select(
        events=pl.col("_is_event").sum(),
        usable=(pl.col("_is_event") & pl.col("_reason").is_null()).sum(),
        meta=(ph == META_PHASE).sum(),
        missing_ph=ph.null_count(),
    ).row(0, named=True)

    skipped: Counter[str] = Counter()
    if kinds["usable"] < kinds["events"]:
        bad = checked.filter(pl.col("_reason").is_not_null())
        skipped.update(dict(bad["_reason"].value_counts().iter_rows()))
    if kinds["missing_ph"]:
        skipped["no ph"] += kinds["missing_ph"]
    ignored: Counter[str] = Counter()
    if kinds["events"] + kinds["meta"] + kinds["missing_ph"] < raw.height:
        other = checked.filter(~pl.col("_is_event") & ph.is_not_null() & (ph != META_PHASE))
        ignored.update(dict(other["ph"].value_counts().iter_rows()))

    # in memory: a lazy query's default engine is the streaming one, whose start-up is
    # most of a chunk's cost (37 -> 31 ms over the 54 MB trace's 14 chunks)
    events = (
        checked.lazy()
        .filter(pl.col("_is_event") & pl.col("_reason").is_null())
        .select(
            pl.lit(0, dtype=pl.Int32).alias("rank"),
            pl.col("name"),
            _category(raw["cat"]),
            ph,
            pl.col("ts"),
            pl.col("dur"),
            pl.col("pid"),
            # GPU rows of PyTorch 1.9 traces have tid "stream 7": the stream is the tid
            pl.coalesce(pl.col("tid"), pl.col("stream")).alias("tid"),
            pl.col("device"),
            pl.col("stream"),
            pl.col("correlation"),
            pl.coalesce(pl.col("external_id"), pl.col("external_id_legacy")).alias("external_id"),
            pl.coalesce(pl.col("bytes"), pl.col("memory_bytes")).alias("bytes"),
            pl.col("total_allocated"),
            pl.col("total_reserved"),
            pl.col("device_type").alias("memory_device_type"),
            pl.col("device_id").alias("memory_device_id"),
            pl.coalesce(pl.col("input_types"), pl.col("dtype")).alias("half_dtypes"),
            pl.col("input_dims").alias("input_shapes"),
            pl.col("blocks_per_sm"),
            pl.col("occupancy_pct"),
            pl.col("collective_name"),
            pl.col("in_msg_nelems"),
            pl.col("out_msg_nelems"),
            pl.col("group_size"),
            pl.col("process_group_name"),
            pl.col("process_group_ranks"),
            pl.col("input_type_texts").alias("input_types"),
            pl.col("concrete_inputs"),
            pl.col("sequence_number"),
            pl.col("fwd_thread_id"),
        )
        .cast(EVENT_SCHEMA)  # type: ignore[arg-type]
        .collect(engine="in-memory")
    )
    events = _with_empty_columns_unallocated(events)

    flow_rows = raw_flows.height if raw_flows is not None else 0
    flows = None
    if with_flows and raw_flows is not None and raw_flows.height:
        flows = (
            raw_flows.filter(pl.col("ts").is_not_null())
            .select(
                pl.lit(0, dtype=pl.Int32).alias("rank"),
                ph,
                pl.col("cat").str.to_lowercase(),
                pl.col("name"),
                pl.col("id"),
                pl.col("ts"),
                pl.col("pid"),
                pl.col("tid"),
            )
            .cast(FLOW_SCHEMA)  # type: ignore[arg-type]
        )
    return NormalisedChunk(events, flows, skipped, ignored, raw.height + flow_rows, flow_rows)


def _empty_columns(frame: pl.DataFrame) -> list[str]:
    """The columns null on every row (most args columns of most chunks)."""
    if frame.height == 0:
        return []
    nulls = frame.null_count().row(0)
    return [name for name, n in zip(frame.columns, nulls, strict=True) if n == frame.height]


def unallocated_nulls(names: list[str]) -> list[pl.Expr]:
    return [pl.lit(None, dtype=EVENT_SCHEMA[name]).alias(name) for name in names]


def _with_empty_columns_unallocated(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with each all-null column held as one null value, not a value per row.

    An all-null column still costs its full width in polars (8 bytes a row for Int64, a
    16-byte view a row for String), and most args columns are null on every row of a
    trace: 8 text and 3 count columns of the 1 GB trace's 3.9 M-row table held 580 MB of
    nulls. A column made from a literal stays one value through filters, sorts and
    concatenation, and is only laid out in full where a query reads it.
    """
    empty = _empty_columns(frame)
    return frame.with_columns(unallocated_nulls(empty)) if empty else frame


# Up to this many rows the table is sorted whole, on every core (216k rows: 14 ms against 33
# column by column); above, column by column, to hold one table and a column a thread at most.
SORT_WHOLE_MAX_ROWS = 1_000_000
SORT_THREADS = 2


def _sorted_by_ts(chunks: list[pl.DataFrame]) -> pl.DataFrame:
    """The chunks as one table in time order (stable); ``chunks`` is emptied.

    ``DataFrame.sort`` would hold the unsorted and the sorted table at once. Here the
    caller hands over its only references (the list), and each unsorted column is dropped
    as soon as its sorted copy exists: the peak is one table plus the columns being sorted
    (SORT_THREADS at once), hundreds of MB less at 1 GB of JSON. A table of up to
    SORT_WHOLE_MAX_ROWS is sorted whole.
    """
    empty = set(_empty_columns(chunks[0]))
    for chunk in chunks[1:]:
        empty.intersection_update(_empty_columns(chunk))
    # sorted without the all-null columns, which are added back unallocated
    names = [name for name in EVENT_SCHEMA if name not in empty]
    if sum(chunk.height for chunk in chunks) <= SORT_WHOLE_MAX_ROWS:
        table = pl.concat([chunk.select(names) for chunk in chunks], rechunk=True)
        chunks.clear()
        return _with_nulls_added(table.sort("ts", maintain_order=True), empty)
    columns = pl.concat([chunk.select(names) for chunk in chunks], rechunk=False).get_columns()
    chunks.clear()
    ts_index = names.index("ts")
    order = (
        pl.DataFrame([columns[ts_index]])
        .with_row_index("row")
        .sort("ts", maintain_order=True)  # stable: equal times keep file order
        .get_column("row")
    )

    def sort_column(i: int) -> None:
        # gather over one contiguous chunk is ~20x faster than over the per-chunk pieces
        # (string columns most of all); the extra copy is one column a thread
        column = columns[i].rechunk()
        columns[i] = (
            _texts_stored_once(column, order)
            if names[i] in REPEATED_TEXTS
            else column.gather(order)
        )

    # polars lets go of the interpreter while it gathers, so the columns are sorted on
    # SORT_THREADS threads (the decode helper is done by now: both cores are free)
    with ThreadPoolExecutor(SORT_THREADS) as pool:
        list(pool.map(sort_column, range(len(names))))
    return _with_nulls_added(pl.DataFrame(columns), empty)


# Text columns whose values are long (past the 12 bytes polars keeps inside a row's view)
# and repeat: an operator's name, its shapes, its argument values.
REPEATED_TEXTS = frozenset({"name", "input_shapes", "input_types", "concrete_inputs"})


def _texts_stored_once(column: pl.Series, order: pl.Series) -> pl.Series:
    """``column.gather(order)``, each distinct text stored once.

    polars keeps a row's text beside its 16-byte view when it is longer than 12 bytes, so
    "aten::convolution_backward" on a million rows is a million copies. Gathering the
    distinct texts by each row's code gives views that all point into one copy: the 1 GB
    trace's name column went from 214 to 61 MB (3.9 M rows, 0.17 s).
    """
    distinct = column.drop_nulls().unique()
    codes = column.cast(pl.Enum(distinct)).to_physical()
    return distinct.gather(codes.gather(order))


def _with_nulls_added(table: pl.DataFrame, empty: set[str]) -> pl.DataFrame:
    """The table with its all-null columns back, unallocated, in EVENT_SCHEMA's order."""
    if not empty:
        return table
    return table.with_columns(unallocated_nulls(sorted(empty))).select(list(EVENT_SCHEMA))


# Raw rows normalised at once: a chunk's normalisation is mostly the fixed cost of its few
# queries, so consecutive chunks decoded here are normalised together (below).
NORMALISE_BATCH_ROWS = 100_000


class TableBuilder:
    """Builds the event and flow tables chunk by chunk, in file order, as the decoder
    hands them over: raw chunks (decoded here), or chunks the decode helper has already
    normalised.

    Raw chunks wait until about NORMALISE_BATCH_ROWS rows have arrived and are then
    normalised at once and dropped (the 1 GB trace's chunks: 4 at once take half the time
    of 4 one by one), so raw columns never pile up: at the end the only large objects are
    the normalised chunks and, while sorting, their sorted copy. ``with_flows`` false: the
    flow events are counted (``flow_rows``) and left out.
    """

    def __init__(self, with_flows: bool = True) -> None:
        self.with_flows = with_flows
        self._events: list[pl.DataFrame] = []
        self._flows: list[pl.DataFrame] = []
        self._raw: list[pl.DataFrame] = []
        self._raw_flows: list[pl.DataFrame] = []
        self._raw_rows = 0
        self.skipped: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()
        self.rows = 0  # decoded rows, flows included
        self.flow_rows = 0  # decoded flow rows, kept or not

    def add(self, raw: pl.DataFrame, raw_flows: pl.DataFrame | None) -> None:
        """A chunk's raw columns (RAW_EVENT_SCHEMA; flows RAW_FLOW_SCHEMA or None)."""
        flow_rows = raw_flows.height if raw_flows is not None else 0
        self.rows += raw.height + flow_rows
        self.flow_rows += flow_rows
        self._raw.append(raw)
        if self.with_flows and raw_flows is not None and flow_rows:
            self._raw_flows.append(raw_flows)
        self._raw_rows += raw.height
        if self._raw_rows >= NORMALISE_BATCH_ROWS:
            self._normalise_waiting()

    def add_normalised(self, chunk: NormalisedChunk) -> None:
        """A chunk normalised elsewhere (the decode helper), after those before it."""
        self._normalise_waiting()
        self.rows += chunk.rows
        self.flow_rows += chunk.flow_rows
        self._keep(chunk)

    def _normalise_waiting(self) -> None:
        if not self._raw:
            return
        raw = self._raw[0] if len(self._raw) == 1 else pl.concat(self._raw, rechunk=False)
        flows = None
        if self._raw_flows:
            flows = pl.concat(self._raw_flows, rechunk=False)
        self._raw, self._raw_flows, self._raw_rows = [], [], 0
        self._keep(normalise_chunk(raw, flows))

    def _keep(self, chunk: NormalisedChunk) -> None:
        if chunk.events.height:
            self._events.append(chunk.events)
        if self.with_flows and chunk.flows is not None and chunk.flows.height:
            self._flows.append(chunk.flows)
        self.skipped.update(chunk.skipped)
        self.ignored.update(chunk.ignored)

    def finish(self, rank: int) -> Normalised:
        """The tables, rows in time order, every row labelled with ``rank``."""
        self._normalise_waiting()
        events = _sorted_by_ts(self._events) if self._events else pl.DataFrame(schema=EVENT_SCHEMA)
        flows = pl.concat(self._flows, rechunk=False) if self._flows else None
        self._flows = []
        label = pl.lit(rank, dtype=pl.Int32).alias("rank")
        events = events.with_columns(label)
        flows = pl.DataFrame(schema=FLOW_SCHEMA) if flows is None else flows.with_columns(label)
        return Normalised(events, flows, self.skipped, self.ignored)


def normalise(raw: pl.DataFrame, raw_flows: pl.DataFrame | None, rank: int) -> Normalised:
    """Decoded rows (all at once) -> the event and flow tables."""
    builder = TableBuilder()
    builder.add(raw, raw_flows)
    return builder.finish(rank)
