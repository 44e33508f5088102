"""msgspec Structs for Kineto events, and Struct lists to polars columns.

The Structs name only the keys the event table needs: msgspec skips every other key (call
stacks, input shapes, grid sizes) without making a Python object of it. Columns are then
read off the Structs with one C-level pass (``map(attrgetter)``) per column and kind of
event: no Python code runs per event.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    # copy / memset size; ROCm traces write some as numeric strings ("4096"), which parse
    bytes: int | str | None = None
    memory_bytes: int | str | None = msgspec.field(name="Bytes", default=None)  # [memory] size
    total_allocated: int | None = msgspec.field(name="Total Allocated", default=None)
    total_reserved: int | None = msgspec.field(name="Total Reserved", default=None)
    device_type: int | None = msgspec.field(name="Device Type", default=None)
    device_id: int | None = msgspec.field(name="Device Id", default=None)
    name: Any = None  # M events: the process or thread name
    # CPU ops recorded with record_shapes: each input's dtype ("c10::BFloat16", "float", "");
    # Any, so that an unexpected shape is dropped rather than the whole event refused
    input_types: Any = msgspec.field(name="Input type", default=None)
    dtype: Any = None  # a few ops name one dtype instead ("Half", "BFloat16", "Float")
    # operators (record_shapes=True): the input shapes (lists of ints, nested for tensor
    # lists); a Raw would pin the decode buffer, so they are decoded and re-encoded as text
    input_dims: list[Any] | None = msgspec.field(name="Input Dims", default=None)
    # the values of scalar and list arguments as text ("1", "[2, 2]", "True"; "" for a
    # tensor): convolution strides, attention's causal flag (facts.flops)
    concrete_inputs: list[Any] | None = msgspec.field(name="Concrete Inputs", default=None)
    # autograd links a backward node to its forward op by this pair (facts.flops)
    sequence_number: Any = msgspec.field(name="Sequence number", default=None)
    fwd_thread_id: Any = msgspec.field(name="Fwd thread id", default=None)
    # kernels: CUPTI's launch figures (absent from some CUDA versions' traces)
    blocks_per_sm: float | None = msgspec.field(name="blocks per SM", default=None)
    occupancy_pct: float | None = msgspec.field(name="est. achieved occupancy %", default=None)
    # collectives (NCCL kernels, record_param_comms): Any, so that an unexpected type drops
    # the value rather than the kernel; numbers may come as numeric strings
    collective_name: Any = msgspec.field(name="Collective name", default=None)
    in_msg_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_msg_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)
    process_group_name: Any = msgspec.field(name="Process Group Name", default=None)
    process_group_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)


NO_ARGS = Args()


class Event(msgspec.Struct, frozen=True, gc=False):
    ph: str | None = None
    name: str | None = None
    cat: str | None = None
    ts: int | float | None = None  # ints stay ints: beyond 2^53 a float cannot hold them
    dur: float | None = None
    pid: int | str | None = None  # Kineto writes "Spans"/"Traces" for its own rows
    tid: int | str | None = None  # and "stream 7" or "25738" in PyTorch 1.9 traces
    id: int | str | None = None  # flow id
    args: Args = NO_ARGS


# One event alone (the events of a chunk that msgspec refused as a whole, M events' names)
EVENT_DECODER = msgspec.json.Decoder(Event)

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
    "input_types": pl.String,  # only the 16-bit float dtypes among them (see _half_dtypes)
    "dtype": pl.String,  # the same for the single "dtype" arg
    "input_dims": pl.String,
    "blocks_per_sm": pl.Float64,
    "occupancy_pct": pl.Float64,
    "collective_name": pl.String,
    "in_msg_nelems": pl.Int64,
    "out_msg_nelems": pl.Int64,
    "group_size": pl.Int64,
    "process_group_name": pl.String,
    "process_group_ranks": pl.String,
    "concrete_inputs": pl.String,
    "sequence_number": pl.Int64,
    "fwd_thread_id": pl.Int64,
    # not read off the Structs: "Input type" as JSON text, made beside input_types
    "input_type_texts": pl.String,
}
_EVENT_FIELDS = ("ph", "name", "cat", "ts", "dur", "pid", "tid", "id")
RAW_EVENT_SCHEMA = {name: dtype for name, dtype in RAW_SCHEMA.items() if name != "id"}
RAW_FLOW_SCHEMA = {"ph": pl.String} | {
    name: RAW_SCHEMA[name] for name in ("name", "cat", "ts", "pid", "tid", "id")
}
_DERIVED_FIELDS = ("input_type_texts",)
_ARG_FIELDS = tuple(
    name for name in RAW_SCHEMA if name not in _EVENT_FIELDS and name not in _DERIVED_FIELDS
)
_GETTERS = {name: attrgetter(name) for name in (*_EVENT_FIELDS, *_ARG_FIELDS)}
_GET_ARGS = attrgetter("args")
_FLOW_FIELDS = ("name", "cat", "ts", "pid", "tid", "id")
# Which args keys each kind of event carries (raw categories, lower-cased, any Kineto).
_GPU_CATS = ("kernel", "memcpy", "gpu_memcpy", "memset", "gpu_memset", "cuda_sync")
_RUNTIME_CATS = ("runtime", "cuda_runtime", "cuda_driver", "driver")
_CPU_CATS = ("operator", "cpu_op", "user_annotation", "python_function")
_COLLECTIVE_ARGS = (
    "collective_name",
    "in_msg_nelems",
    "out_msg_nelems",
    "group_size",
    "process_group_name",
    "process_group_ranks",
)
_TEXT_ARGS = frozenset({"collective_name", "process_group_name", "process_group_ranks"})
_GPU_ARGS = (
    "device",
    "stream",
    "correlation",
    "external_id",
    "external_id_legacy",
    "bytes",
    "blocks_per_sm",
    "occupancy_pct",
    *_COLLECTIVE_ARGS,
)
_RUNTIME_ARGS = ("correlation", "external_id", "external_id_legacy")
_CPU_ARGS = (
    "external_id",
    "external_id_legacy",
    "input_types",
    "dtype",
    "input_dims",
    "concrete_inputs",
    "sequence_number",
    "fwd_thread_id",
    *_COLLECTIVE_ARGS,
)
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


def null_column(name: str, n: int, schema: Mapping[str, pl.DataType] = RAW_SCHEMA) -> pl.Series:
    # new_from_index is a plain fill (µs); pl.repeat runs a query per call
    return pl.Series(name, [None], dtype=schema[name]).new_from_index(0, n)


# The op dtypes the rules read: fp16 and bf16 tell apart runs kernel names cannot.
HALF_DTYPES = ("c10::Half", "c10::BFloat16")


_HALF_NAMES = {
    (False, False): None,
    (True, False): "c10::Half",
    (False, True): "c10::BFloat16",
    (True, True): "c10::Half,c10::BFloat16",
}


_HALF_DTYPE_ARG = {
    "Half": "c10::Half",
    "c10::Half": "c10::Half",
    "torch.float16": "c10::Half",
    "BFloat16": "c10::BFloat16",
    "c10::BFloat16": "c10::BFloat16",
    "torch.bfloat16": "c10::BFloat16",
}


def _half_of(types: Any) -> str | None:
    if types.__class__ is list:
        return _HALF_NAMES[("c10::Half" in types, "c10::BFloat16" in types)]
    if types.__class__ is str:
        return _HALF_DTYPE_ARG.get(types)
    return None


def _half_dtypes(values: list[Any]) -> pl.Series:
    """Each op's "Input type" list -> the 16-bit float dtypes in it, joined by "," (null when
    none): all the rules need, one short string per op. Two list lookups per op in Python
    cost less than building polars list columns from the nested lists."""
    return pl.Series("input_types", list(map(_half_of, values)), dtype=pl.String)


def _to_series(name: str, values: list[Any]) -> pl.Series:
    dtype = RAW_SCHEMA[name]
    if name in ("input_types", "dtype") and not _all_none(values):
        return _half_dtypes(values)
    if _all_none(values):
        # all absent (legacy keys in a modern trace): polars would scan for a first value
        return null_column(name, len(values))
    try:
        # ints and nulls (nearly every chunk) take polars' typed fast path
        return pl.Series(name, values, dtype=dtype)
    except (OverflowError, TypeError, ValueError, pl.exceptions.PolarsError):
        if name in _TEXT_ARGS:
            # a number or a list where text was expected: written as text, not dropped
            return pl.Series(name, list(map(_text_of, values)), dtype=pl.String)
        # pid/tid/id: numeric strings parse, label strings ("Spans") become null; and an
        # integer beyond int64 (JSON allows any size): null rather than a crash
        return pl.Series(name, values, dtype=dtype, strict=False)


# float64 holds every integer up to 2^53 exactly; past it, neighbouring µs merge.
EXACT_FLOAT_LIMIT = 2**53


def _ts_series(name: str, values: list[Any]) -> pl.Series:
    """Timestamps as Float64: integer chunks go through Int64 (5x faster than building a
    float column from Python ints); a chunk with a float in it takes the float path."""
    if _all_none(values):
        return null_column(name, len(values))
    if values[0].__class__ is float:
        # modern Kineto writes fractional µs: the Int64 attempt would fail after a full
        # pass (6x the float path's cost)
        return _to_series(name, values)
    try:
        return pl.Series(name, values, dtype=pl.Int64).cast(pl.Float64)
    except (OverflowError, TypeError, ValueError, pl.exceptions.PolarsError):
        return _to_series(name, values)


class TsClock:
    """Keeps integer timestamps beyond 2^53 µs exact, one file at a time.

    When the file's first chunk holds such timestamps, the smallest integer among them
    becomes the file's base, subtracted from every ``ts`` in exact integer arithmetic
    before the column turns float: the table then holds small offsets, exact to the µs,
    and ``base_us`` goes into the trace's metadata. Fractional timestamps that large were
    already rounded when the JSON was read; they are counted in ``lossy`` for a warning.
    Ordinary timestamps (below 2^53) take the plain float path untouched.
    """

    def __init__(self) -> None:
        self.base_us: int | None = None
        self.decided = False
        self.lossy = 0

    @classmethod
    def with_base(cls, base_us: int | None) -> TsClock:
        """A clock already decided by the file's first chunk (in the loading process)."""
        clock = cls()
        clock.decided = True
        clock.base_us = base_us
        return clock

    def decide(self, values: list[Any]) -> None:
        """Sets the base from the file's first chunk (all its rows, flows included)."""
        if self.decided:
            return
        self.decided = True
        ints = [v for v in values if type(v) is int]
        largest = max(ints, key=abs, default=0)
        if abs(largest) > EXACT_FLOAT_LIMIT:
            self.base_us = min(ints)

    def series(self, name: str, values: list[Any]) -> pl.Series:
        self.decide(values)
        plain = _ts_series(name, values)
        if self.base_us is None:
            largest = plain.abs().max() if plain.len() else None
            if largest is not None and float(largest) > EXACT_FLOAT_LIMIT:  # type: ignore[arg-type]
                self.lossy += int((plain.abs() > EXACT_FLOAT_LIMIT).sum())
            return plain
        base = self.base_us
        exact = pl.Series(
            name,
            [v - base if type(v) is int else None for v in values],
            dtype=pl.Int64,
            strict=False,
        )
        fractional = [v for v in values if type(v) is float]
        if not fractional:
            return exact.cast(pl.Float64)
        self.lossy += sum(1 for v in fractional if abs(v) > EXACT_FLOAT_LIMIT)
        shifted = pl.Series(
            name, [v - base if type(v) is float else None for v in values], dtype=pl.Float64
        )
        return exact.cast(pl.Float64).fill_null(shifted)


def _series(name: str, items: list[Any], clock: TsClock | None = None) -> pl.Series:
    values = list(map(_GETTERS[name], items))
    if name == "ts":
        return clock.series(name, values) if clock is not None else _ts_series(name, values)
    return _to_series(name, values)


def columns(
    events: list[Event],
    clock: TsClock | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame | None, list[tuple[str, Any, Any, Any]]]:
    """Struct list -> (event rows, flow rows, M-event names) as polars frames.

    One C-level pass (``map(attrgetter)``) per column: no Python code runs per event.
    Flows (a third of a modern trace) are split off first so that only their few
    columns are extracted for them. ``clock`` (one per file) keeps huge integer
    timestamps exact; without it ``ts`` is read as plain floats.
    """
    if clock is not None and not clock.decided:
        clock.decide(list(map(_GETTERS["ts"], events)))
    phases = pl.Series("ph", list(map(_GETTERS["ph"], events)), dtype=pl.String)
    # an event without ph is no flow: it stays a row, which normalise counts as "no ph"
    is_flow = phases.is_in(FLOW_PHASES).fill_null(False)
    flows_frame = None
    if is_flow.any():
        flow_rows = list(compress(events, is_flow.to_list()))
        flows_frame = pl.DataFrame(
            [phases.filter(is_flow)] + [_series(name, flow_rows, clock) for name in _FLOW_FIELDS]
        )
        events = list(compress(events, (~is_flow).to_list()))
        phases = phases.filter(~is_flow)
    data = [phases] + [_series(name, events, clock) for name in _EVENT_FIELDS[1:] if name != "id"]
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
    columns = {name: null_column(name, n) for name in (*_ARG_FIELDS, *_DERIVED_FIELDS)}
    for value, fields in _KIND_FIELDS:
        mask = kinds == value
        if not mask.any():
            continue
        rows = mask.arg_true()
        args = list(map(_GET_ARGS, compress(events, mask.to_list())))
        for field in fields:
            values = list(map(_GETTERS[field], args))
            if field in ("input_dims", "concrete_inputs"):
                values = _raw_texts(values)
            elif field == "input_types":
                texts = _raw_texts([v if v.__class__ is list else None for v in values])
                if not _all_none(texts):
                    columns["input_type_texts"] = columns["input_type_texts"].scatter(
                        rows, pl.Series("input_type_texts", texts, dtype=pl.String)
                    )
            if not _all_none(values):
                columns[field] = columns[field].scatter(rows, _to_series(field, values))
    return list(columns.values())


_ENCODE = msgspec.json.Encoder().encode


def _text_of(value: Any) -> str | None:
    if value is None or value.__class__ is str:
        return value
    if value.__class__ in (int, float, bool):
        return str(value)
    return _ENCODE(value).decode()  # a list of ranks written as a list, not as text


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
