"""Export: one step of a trace as a Chrome-trace JSON that Perfetto and chrome://tracing open.

Written from the event table (not by copying the input file): the step's duration events,
the instants inside it ([memory] included), the flow arrows that start or end inside it
(so Perfetto links each launch to its kernel), process/thread names, and the metadata
Perfetto reads (deviceProperties, distributedInfo, baseTimeNanoseconds).
"""

from __future__ import annotations

from typing import Any

import msgspec
import polars as pl

from diagnostics.trace.schema import LoadedTrace

# event-table category -> the Kineto category written back (the loader normalised them)
_CATEGORY_OUT = {"memory": "cpu_instant_event"}
# event-table column -> args key (Kineto's spelling)
_ARGS = (
    ("device", "device"),
    ("stream", "stream"),
    ("correlation", "correlation"),
    ("external_id", "External id"),
    ("blocks_per_sm", "blocks per SM"),
    ("occupancy_pct", "est. achieved occupancy %"),
)
_MEMORY_ARGS = (
    ("bytes", "Bytes"),
    ("total_allocated", "Total Allocated"),
    ("total_reserved", "Total Reserved"),
    ("memory_device_type", "Device Type"),
    ("memory_device_id", "Device Id"),
)
_DECODE = msgspec.json.Decoder()


def _event(row: dict[str, Any]) -> dict[str, Any]:
    cat = row["cat"]
    out: dict[str, Any] = {
        "ph": row["ph"],
        "cat": _CATEGORY_OUT.get(cat, cat),
        "name": row["name"] or "",
        "pid": row["pid"] if row["pid"] is not None else 0,
        "tid": row["tid"] if row["tid"] is not None else 0,
        "ts": row["ts"],
    }
    if row["ph"] == "X":
        out["dur"] = row["dur"] or 0.0
    else:
        out["s"] = "t"  # an instant on its thread
    pairs = _MEMORY_ARGS if cat == "memory" else (*_ARGS, ("bytes", "bytes"))
    args = {key: row[col] for col, key in pairs if row[col] is not None}
    if row["input_shapes"]:
        args["Input Dims"] = _DECODE.decode(row["input_shapes"])
    if args:
        out["args"] = args
    return out


def _flow(row: dict[str, Any]) -> dict[str, Any]:
    out = {key: row[key] for key in ("ph", "cat", "name", "id", "ts", "pid", "tid")}
    out["pid"] = out["pid"] if out["pid"] is not None else 0
    out["tid"] = out["tid"] if out["tid"] is not None else 0
    if row["ph"] == "f":
        out["bp"] = "e"  # bind to the enclosing slice, as Kineto writes it
    return out


def step_slice(trace: LoadedTrace, start_us: float, end_us: float) -> dict[str, Any]:
    """The Chrome-trace document (a dict) of everything in [start_us, end_us]."""
    events = trace.events
    inside = events.filter(
        (pl.col("ts") <= end_us)
        & (pl.col("ts") + pl.col("dur").fill_null(0.0) >= start_us)
        & pl.col("ph").is_in(["X", "i", "I"])
    ).sort("ts")
    flows = trace.flows.filter(
        pl.col("ts").is_between(start_us, end_us) & pl.col("id").is_not_null()
    )
    meta = trace.metadata
    names: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
        for pid, name in meta.process_names.items()
    ]
    names += [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
        for (pid, tid), name in meta.thread_names.items()
    ]
    document: dict[str, Any] = {
        "schemaVersion": meta.schema_version or 1,
        "traceEvents": names
        + [_event(row) for row in inside.iter_rows(named=True)]
        + [_flow(row) for row in flows.iter_rows(named=True)],
        "displayTimeUnit": "ms",
    }
    if meta.device_properties:
        document["deviceProperties"] = list(meta.device_properties)
    if meta.distributed_info:
        document["distributedInfo"] = meta.distributed_info
    if meta.base_time_ns:
        document["baseTimeNanoseconds"] = meta.base_time_ns
    return document


def step_slice_json(trace: LoadedTrace, start_us: float, end_us: float) -> bytes:
    """step_slice as JSON bytes (the download)."""
    return msgspec.json.encode(step_slice(trace, start_us, end_us))


PERFETTO_STEPS: tuple[str, ...] = (
    "Download the step's trace below (a .json file; it never leaves your machine).",
    "Open https://ui.perfetto.dev in Chrome or Firefox and choose *Open trace file*, or drag "
    "the file onto the page. Perfetto loads it in the browser; nothing is uploaded.",
    "Press W/S to zoom and A/D to pan; click a kernel and follow its flow arrow to the CPU "
    "call that launched it.",
    "For the whole trace, open the original file the same way (Perfetto handles traces up "
    "to about 2 GB; chrome://tracing also opens these files).",
)
