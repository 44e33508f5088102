"""The event table: the one contract between the trace loader and everything downstream.

Every trace (any Kineto version, one file or one per rank) becomes one polars DataFrame
with exactly the columns of ``EVENT_SCHEMA``, in that order. Times are microseconds as
floats (Kineto writes integers or, in newer versions, floats with ns resolution).
Categories are normalised to the modern lower-case Kineto names in ``Category`` so that
``Operator`` (PyTorch 1.9) and ``cpu_op`` (2.x) are the same thing downstream.

Flow events (ph s/f/t) and metadata events (ph M) are not rows of this table: the loader
keeps them aside in ``LoadedTrace``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import polars as pl


class Category(StrEnum):
    CPU_OP = "cpu_op"
    CUDA_RUNTIME = "cuda_runtime"
    CUDA_DRIVER = "cuda_driver"
    KERNEL = "kernel"
    GPU_MEMCPY = "gpu_memcpy"
    GPU_MEMSET = "gpu_memset"
    USER_ANNOTATION = "user_annotation"
    GPU_USER_ANNOTATION = "gpu_user_annotation"
    PYTHON_FUNCTION = "python_function"
    CPU_INSTANT = "cpu_instant_event"
    CUDA_SYNC = "cuda_sync"  # GPU-side "Stream Sync"/"Event Sync" records (Kineto 2.1+)
    MEMORY = "memory"  # "[memory]" instant events with allocation totals
    TRACE = "trace"  # e.g. "PyTorch Profiler (0)" span
    OVERHEAD = "overhead"
    # CUPTI range-profiler records (counters per range, no kernel timeline)
    CUDA_PROFILER_RANGE = "cuda_profiler_range"
    OTHER = "other"


# Lower-cased raw category -> normalised category. Anything absent maps to OTHER.
CATEGORY_ALIASES: dict[str, Category] = {
    "operator": Category.CPU_OP,
    "cpu_op": Category.CPU_OP,
    "runtime": Category.CUDA_RUNTIME,
    "cuda_runtime": Category.CUDA_RUNTIME,
    "cuda_driver": Category.CUDA_DRIVER,
    "driver": Category.CUDA_DRIVER,
    "kernel": Category.KERNEL,
    "memcpy": Category.GPU_MEMCPY,
    "gpu_memcpy": Category.GPU_MEMCPY,
    "memset": Category.GPU_MEMSET,
    "gpu_memset": Category.GPU_MEMSET,
    "user_annotation": Category.USER_ANNOTATION,
    "gpu_user_annotation": Category.GPU_USER_ANNOTATION,
    "python_function": Category.PYTHON_FUNCTION,
    "python": Category.PYTHON_FUNCTION,
    "cpu_instant_event": Category.CPU_INSTANT,
    "cuda_sync": Category.CUDA_SYNC,
    "[memory]": Category.MEMORY,
    "memory": Category.MEMORY,
    "trace": Category.TRACE,
    "overhead": Category.OVERHEAD,
    "cuda_profiler_range": Category.CUDA_PROFILER_RANGE,
}

GPU_CATEGORIES: frozenset[str] = frozenset(
    {Category.KERNEL, Category.GPU_MEMCPY, Category.GPU_MEMSET}
)

EVENT_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32,  # distributed rank of the file the event came from (0 when unknown)
    "name": pl.String,
    "cat": pl.String,  # a Category value
    "ph": pl.String,  # "X" complete, "i"/"I" instant, ...
    "ts": pl.Float64,  # start, µs
    "dur": pl.Float64,  # duration, µs; null for instants
    "pid": pl.Int64,  # process id; GPU events carry the device index here in Kineto
    "tid": pl.Int64,  # thread id; GPU events carry the stream here in Kineto
    "device": pl.Int64,  # GPU index for GPU events (args.device), else null
    "stream": pl.Int64,  # CUDA stream for GPU events (args.stream), else null
    "correlation": pl.Int64,  # links a runtime call to the GPU activity it launched
    "external_id": pl.Int64,  # args["External id"]
    "bytes": pl.Int64,  # copy/memset size, or allocation size for [memory]
    "total_allocated": pl.Int64,  # [memory]: "Total Allocated" after the event, bytes
    "total_reserved": pl.Int64,  # [memory]: "Total Reserved", bytes
    "memory_device_type": pl.Int64,  # [memory]: 0 CPU, 1 CUDA
    "memory_device_id": pl.Int64,  # [memory]: "Device Id"
    # CPU ops recorded with shapes: the 16-bit float dtypes among the op's inputs ("Input
    # type"): "c10::Half", "c10::BFloat16" or both joined by ","; else null
    "half_dtypes": pl.String,
    # operators recorded with record_shapes=True: args["Input Dims"] as JSON text, e.g.
    # "[[256, 768], [768, 3072]]"; null when the trace has no shapes
    "input_shapes": pl.String,
    "blocks_per_sm": pl.Float64,  # kernels: args["blocks per SM"] (CUPTI), else null
    "occupancy_pct": pl.Float64,  # kernels: args["est. achieved occupancy %"], else null
    # collectives (PyTorch 2.1+ writes them on NCCL kernels and record_param_comms ops):
    "collective_name": pl.String,  # args["Collective name"]: "allreduce", "broadcast", ...
    "in_msg_nelems": pl.Int64,  # args["In msg nelems"]: elements sent
    "out_msg_nelems": pl.Int64,  # args["Out msg nelems"]: elements received
    "group_size": pl.Int64,  # args["Group size"]: ranks in the process group
    "process_group_name": pl.String,  # args["Process Group Name"]: "0" is the default group
    "process_group_ranks": pl.String,  # args["Process Group Ranks"] as written: "[0, 1]"
    # operators recorded with shapes, for the FLOP model (facts.flops):
    "input_types": pl.String,  # args["Input type"] as JSON text: '["c10::BFloat16", "Scalar"]'
    "concrete_inputs": pl.String,  # args["Concrete Inputs"] as JSON text: '["", "1"]'
    "sequence_number": pl.Int64,  # args["Sequence number"]: a forward op and its backward node
    "fwd_thread_id": pl.Int64,  # args["Fwd thread id"]: the forward's thread, with the above
}

EVENT_COLUMNS: tuple[str, ...] = tuple(EVENT_SCHEMA)


def empty_event_table() -> pl.DataFrame:
    return pl.DataFrame(schema=EVENT_SCHEMA)


def normalise_category(raw: str | None) -> Category:
    if not raw:
        return Category.OTHER
    return CATEGORY_ALIASES.get(raw.strip().lower(), Category.OTHER)


# Flow events (ph s/f/t: "ac2g", "async", "fwdbwd", ...) kept aside by the loader.
FLOW_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32,
    "ph": pl.String,  # "s" start, "f" finish, "t" step
    "cat": pl.String,  # raw flow category, lower-cased ("ac2g", "async", "fwdbwd", ...)
    "name": pl.String,
    "id": pl.Int64,  # flow id; for ac2g/async flows the correlation id
    "ts": pl.Float64,  # µs
    "pid": pl.Int64,
    "tid": pl.Int64,
}


def empty_flow_table() -> pl.DataFrame:
    return pl.DataFrame(schema=FLOW_SCHEMA)


@dataclass(frozen=True)
class TraceMetadata:
    """What a trace file says about itself, beside its events (one per rank).

    ``device_properties`` is Kineto's ``deviceProperties`` list (name, totalGlobalMem,
    computeMajor/Minor, numSms, ...); ``distributed_info`` its ``distributedInfo`` (rank,
    world_size, backend). ``base_time_ns`` is ``baseTimeNanoseconds`` where Kineto wrote it
    (ts values are then relative to it); ``process_names``/``thread_names`` come from the
    ``M`` metadata events (pid -> name, (pid, tid) -> name).
    """

    path: str  # the file (or the first of several files) the trace came from
    rank: int = 0
    rank_source: str = "default"  # "distributedInfo" | "file name" | "file order" | "default"
    files: tuple[str, ...] = ()
    device_properties: tuple[dict[str, Any], ...] = ()
    distributed_info: dict[str, Any] | None = None
    pytorch_version: str | None = None
    schema_version: int | None = None
    base_time_ns: int | None = None
    # Subtracted from every ts when the file's integer timestamps pass 2^53 µs (beyond
    # float64's exact integers): ts are then exact offsets from it. None: ts as written.
    ts_base_us: int | None = None
    display_time_unit: str | None = None
    process_names: dict[int, str] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # other small top-level keys
    event_count: int = 0  # rows of the event table
    flow_count: int = 0  # flow events read (in ``flows`` unless the loader left them out)
    skipped_events: int = 0  # malformed events dropped (see warnings for why)
    unnumbered_ids: int = 0  # events whose pid or tid was a label ("Spans"), now null
    warnings: tuple[str, ...] = ()  # user-facing: defects that changed the result
    notes: tuple[str, ...] = ()  # informational: how something was interpreted

    @property
    def clock_offset_s(self) -> float:
        """Add to ``ts / 1e6`` for Unix seconds, the clock of a run's ``wall_time``.

        Kineto's ts are µs since the Unix epoch, or, when it wrote
        ``baseTimeNanoseconds`` (PyTorch 2.2+), µs since that base; plus ``ts_base_us``
        where the loader took one out to keep huge timestamps exact.
        """
        offset_s = self.base_time_ns / 1e9 if self.base_time_ns else 0.0
        return offset_s + (self.ts_base_us / 1e6 if self.ts_base_us else 0.0)


@dataclass(frozen=True)
class LoadedTrace:
    """One rank's trace: its event table (EVENT_SCHEMA), metadata and flows (FLOW_SCHEMA)."""

    events: pl.DataFrame
    metadata: TraceMetadata
    flows: pl.DataFrame

    @property
    def rank(self) -> int:
        return self.metadata.rank

    def without_flows(self) -> LoadedTrace:
        """The trace as an analysis loads it (``with_flows=False``): no flow rows, their
        count kept in the metadata."""
        return replace(self, flows=self.flows.clear())
