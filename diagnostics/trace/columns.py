"""msgspec Structs for Kineto events, and Struct lists to polars columns.

The Structs name only the keys the event table needs: msgspec skips every other key (call
stacks, input shapes, grid sizes) without making a Python object of it. Columns are then
read off the Structs with one C-level pass (``map(attrgetter)``) per column and kind of
event: no Python code runs per event.
"""

from __future__ import annotations

from itertools import compress
from operator import attrgetter
from typing import Any

import msgspec
import polars as pl


class Args(msgspec.Struct, frozen=True, gc=False):
    """The few ``args`` keys the event table keeps; all others are skipped unparsed."""

    device: int | None = None
    stream: int | None = None
    correlation: int | None = None
    external_id: int | None = msgspec.field(name="External id", default=None)
    # PyTorch 1.9 era traces spell it in lower case on runtime and GPU events
    external_id_legacy: int | None = msgspec.field(name="external id", default=None)
    bytes: int | None = None  # copy / memset size
    memory_bytes: int | None = msgspec.field(name="Bytes", default=None)  # [memory] size
    total_allocated: int | None = msgspec.field(name="Total Allocated", default=None)
    total_reserved: int | None = msgspec.field(name="Total Reserved", default=None)
    device_type: int | None = msgspec.field(name="Device Type", default=None)
    device_id: int | None = msgspec.field(name="Device Id", default=None)
    name: Any = None  # M events: the process or thread name
    # operators (record_shapes=True): the input shapes (lists of ints, nested for tensor
    # lists); a Raw would pin the decode buffer, so they are decoded and re-encoded as text
    input_dims: list[Any] | None = msgspec.field(name="Input Dims", default=None)
    # kernels: CUPTI's launch figures (absent from some CUDA versions' traces)
    blocks_per_sm: float | None = msgspec.field(name="blocks per SM", default=None)
    occupancy_pct: float | None = msgspec.field(name="est. achieved occupancy %", default=None)


NO_ARGS = Args()


class Event(msgspec.Struct, frozen=True, gc=False):
    ph: str | None = None
    name: str | None = None
    cat: str | None = None
    ts: float | None = None
    dur: float | None = None
    pid: int | str | None = None  # Kineto writes "Spans"/"Traces" for its own rows
    tid: int | str | None = None  # and "stream 7" or "25738" in PyTorch 1.9 traces
    id: int | str | None = None  # flow id
    args: Args = NO_ARGS


# Raw columns straight off the Structs (before normalisation in the loader).
RAW_SCHEMA: dict[str, pl.DataType] = {
    "ph": pl.String,
    "name": pl.String,
    "cat": pl.String,
    "ts": pl.Float64,
    "dur": pl.Float64,
    # ints and strings mixed: numeric strings ("25738") parse, other strings become null
    "pid": pl.Int64,
    "tid": pl.Int64,
    "id": pl.Int64,  # flows only
    "device": pl.Int64,
    "stream": pl.Int64,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
    "external_id_legacy": pl.Int64,
    "bytes": pl.Int64,
    "memory_bytes": pl.Int64,
    "total_allocated": pl.Int64,
    "total_reserved": pl.Int64,
    "device_type": pl.Int64,
    "device_id": pl.Int64,
    "input_dims": pl.String,
    "blocks_per_sm": pl.Float64,
    "occupancy_pct": pl.Float64,
}
_EVENT_FIELDS = ("ph", "name", "cat", "ts", "dur", "pid", "tid", "id")
RAW_EVENT_SCHEMA = {name: dtype for name, dtype in RAW_SCHEMA.items() if name != "id"}
RAW_FLOW_SCHEMA = {"ph": pl.String} | {
    name: RAW_SCHEMA[name] for name in ("name", "cat", "ts", "pid", "tid", "id")
}
_ARG_FIELDS = tuple(name for name in RAW_SCHEMA if name not in _EVENT_FIELDS)
_GETTERS = {name: attrgetter(name) for name in (*_EVENT_FIELDS, *_ARG_FIELDS)}
_GET_ARGS = attrgetter("args")
_FLOW_FIELDS = ("name", "cat", "ts", "pid", "tid", "id")
# Which args keys each kind of event carries (raw categories, lower-cased, any Kineto).
_GPU_CATS = ("kernel", "memcpy", "gpu_memcpy", "memset", "gpu_memset", "cuda_sync")
_RUNTIME_CATS = ("runtime", "cuda_runtime", "cuda_driver", "driver")
_CPU_CATS = ("operator", "cpu_op", "user_annotation", "python_function")
_GPU_ARGS = (
    "device",
    "stream",
    "correlation",
    "external_id",
    "external_id_legacy",
    "bytes",
    "blocks_per_sm",
    "occupancy_pct",
)
_RUNTIME_ARGS = ("correlation", "external_id", "external_id_legacy")
_CPU_ARGS = ("external_id", "external_id_legacy", "input_dims")
_MEMORY_ARGS = (
    "memory_bytes",
    "bytes",
    "total_allocated",
    "total_reserved",
    "device_type",
    "device_id",
)
FLOW_PHASES = ("s", "f", "t")


def _all_none(values: list[Any]) -> bool:
    # list.count(None) is quick over Nones but slow over other values (each compares
    # through __eq__): a first value present settles it without the count.
    return not values or (values[0] is None and values.count(None) == len(values))


def _nulls(name: str, n: int) -> pl.Series:
    # new_from_index is a plain fill (µs); pl.repeat runs a query per call
    return pl.Series(name, [None], dtype=RAW_SCHEMA[name]).new_from_index(0, n)


def _to_series(name: str, values: list[Any]) -> pl.Series:
    dtype = RAW_SCHEMA[name]
    if _all_none(values):
        # all absent (legacy keys in a modern trace): polars would scan for a first value
        return _nulls(name, len(values))
    try:
        # ints and nulls (nearly every chunk) take polars' typed fast path
        return pl.Series(name, values, dtype=dtype)
    except (OverflowError, TypeError, ValueError, pl.exceptions.PolarsError):
        # pid/tid/id: numeric strings parse, label strings ("Spans") become null; and an
        # integer beyond int64 (JSON allows any size): null rather than a crash
        return pl.Series(name, values, dtype=dtype, strict=False)


def _series(name: str, items: list[Any]) -> pl.Series:
    return _to_series(name, list(map(_GETTERS[name], items)))


def columns(
    events: list[Event],
) -> tuple[pl.DataFrame, pl.DataFrame | None, list[tuple[str, Any, Any, Any]]]:
    """Struct list -> (event rows, flow rows, M-event names) as polars frames.

    One C-level pass (``map(attrgetter)``) per column: no Python code runs per event.
    Flows (a third of a modern trace) are split off first so that only their few
    columns are extracted for them.
    """
    phases = pl.Series("ph", list(map(_GETTERS["ph"], events)), dtype=pl.String)
    is_flow = phases.is_in(FLOW_PHASES)
    flows_frame = None
    if is_flow.any():
        flow_rows = list(compress(events, is_flow.to_list()))
        flows_frame = pl.DataFrame(
            [phases.filter(is_flow)] + [_series(name, flow_rows) for name in _FLOW_FIELDS]
        )
        events = list(compress(events, (~is_flow).to_list()))
        phases = phases.filter(~is_flow)
    data = [phases] + [_series(name, events) for name in _EVENT_FIELDS[1:] if name != "id"]
    frame = pl.DataFrame(data).with_columns(_arg_columns(events, data[2], data[1]))
    return frame, flows_frame, _metadata_names(events, frame)


# Kinds of event by the args keys they carry; _UNKNOWN (a category not listed, no
# category, or no name) is read for every key.
_MEMORY, _GPU, _RUNTIME, _CPU, _UNKNOWN = range(5)
_KIND_FIELDS = (
    (_MEMORY, _MEMORY_ARGS),
    (_GPU, _GPU_ARGS),
    (_RUNTIME, _RUNTIME_ARGS),
    (_CPU, _CPU_ARGS),
    (_UNKNOWN, _ARG_FIELDS),
)


def _kind_of_category(cat: str) -> int:
    lower = cat.lower()
    for kind, known in ((_GPU, _GPU_CATS), (_RUNTIME, _RUNTIME_CATS), (_CPU, _CPU_CATS)):
        if lower in known:
            return kind
    return _UNKNOWN


def _arg_columns(events: list[Event], cats: pl.Series, names: pl.Series) -> list[pl.Series]:
    """The args columns, each read only from the kinds of event that carry it.

    A kernel has a stream, a [memory] instant has totals, a CPU op has neither: reading
    every key of every event would cost a pass per key over all rows. Events of a
    category not listed here are read for every key.
    """
    n = len(events)
    # A chunk holds a handful of distinct categories: each is classified once in Python
    # and the rows get their kind in one query (string work per row was most of the cost).
    kind_of = {cat: _kind_of_category(cat) for cat in cats.unique().drop_nulls().to_list()}
    name = pl.col("name")
    kind = (
        pl.when(name == "[memory]")
        .then(pl.lit(_MEMORY, pl.Int8))
        .when(name.is_null())
        .then(pl.lit(_UNKNOWN, pl.Int8))
        .otherwise(
            pl.col("cat")
            .replace_strict(kind_of, default=_UNKNOWN, return_dtype=pl.Int8)
            .fill_null(_UNKNOWN)
        )
    )
    kinds = pl.DataFrame([cats.alias("cat"), names.alias("name")]).select(kind).to_series()
    columns = {name: _nulls(name, n) for name in _ARG_FIELDS}
    for value, fields in _KIND_FIELDS:
        mask = kinds == value
        if not mask.any():
            continue
        rows = mask.arg_true()
        args = list(map(_GET_ARGS, compress(events, mask.to_list())))
        for field in fields:
            values = list(map(_GETTERS[field], args))
            if field == "input_dims":
                values = _raw_texts(values)
            if not _all_none(values):
                columns[field] = columns[field].scatter(rows, _to_series(field, values))
    return list(columns.values())


_ENCODE = msgspec.json.Encoder().encode


def _raw_texts(values: list[list[Any] | None]) -> list[str | None]:
    # "[[256,768],[768,3072]]": compact JSON text, one string column instead of lists
    return [_ENCODE(value).decode() if value is not None else None for value in values]


def _metadata_names(events: list[Event], frame: pl.DataFrame) -> list[tuple[str, Any, Any, Any]]:
    rows = frame.select(pl.arg_where(pl.col("ph") == "M")).to_series().to_list()
    out = []
    for i in rows:
        event = events[i]
        out.append((event.name or "", event.pid, event.tid, event.args.name))
    return out
