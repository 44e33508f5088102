"""The merged time ranges of each role (kernel, copy, runtime, DataLoader, ...), computed
once per trace and shared by the breakdown, the idle-gap attribution and the sync facts."""

from __future__ import annotations

import polars as pl

from diagnostics.facts import selectors as sel
from diagnostics.facts.intervals import merge_intervals
from diagnostics.facts.linking import TraceIndex

ROLES: tuple[str, ...] = (
    "kernel",
    "memcpy",
    "memset",
    "runtime",
    "dataloader",
    "host_exec",
    "sync",
    "pageable_copy",
)


def _spans(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select("start_us", "end_us")


def role_spans(index: TraceIndex, role: str) -> pl.DataFrame:
    """start_us, end_us of the events of ``role`` (not merged)."""
    gpu, host = index.gpu, index.host
    if role in ("kernel", "memcpy", "memset"):
        cat = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}[role]
        return _spans(gpu.filter(pl.col("cat") == cat))
    if role == "runtime":
        return _spans(index.runtime)
    if role == "dataloader":
        return _spans(host.filter(sel.DATALOADER_NAME))
    if role == "host_exec":
        return _spans(host.filter(sel.HOST_EXEC_NAME))
    if role == "sync":
        return sync_spans(index)
    if role == "pageable_copy":
        # The host side of a copy to or from pageable memory: the call that issued it.
        return gpu.filter(
            (pl.col("cat") == "gpu_memcpy")
            & pl.col("name").str.contains("Pageable")
            & pl.col("rt_start_us").is_not_null()
        ).select(pl.col("rt_start_us").alias("start_us"), pl.col("rt_end_us").alias("end_us"))
    raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")


def sync_spans(index: TraceIndex) -> pl.DataFrame:
    """Host ranges blocked on the device: sync calls, scalar reads, copies into pageable
    memory (see syncs.py for why each counts)."""
    parts = [_spans(index.runtime.filter(pl.col("name").is_in(sorted(sel.SYNC_RUNTIME_NAMES))))]
    if index.gpu.height:
        # On a CPU-only trace aten::item reads host memory and blocks on nothing.
        parts.append(
            _spans(
                index.host.filter(
                    (pl.col("cat") == "cpu_op") & pl.col("name").is_in(sorted(sel.SYNC_OP_NAMES))
                )
            )
        )
        parts.append(
            index.gpu.filter(
                (pl.col("name") == sel.PAGEABLE_DTOH_COPY) & pl.col("rt_start_us").is_not_null()
            ).select(pl.col("rt_start_us").alias("start_us"), pl.col("rt_end_us").alias("end_us"))
        )
    return pl.concat(parts)


def merged_role(index: TraceIndex, role: str) -> pl.DataFrame:
    """The union of ``role``'s ranges, disjoint and sorted (memoised on the index)."""
    key = f"role:{role}"
    if key not in index.memo:
        index.memo[key] = merge_intervals(role_spans(index, role))
    return index.memo[key]


def prefix_unions(index: TraceIndex, roles: tuple[str, ...]) -> list[pl.DataFrame]:
    """U_k = union of roles[0..k], for k = 0..len-1 (the priority method's building block)."""
    unions: list[pl.DataFrame] = []
    for role in roles:
        ranges = merged_role(index, role)
        unions.append(ranges if not unions else merge_intervals(pl.concat([unions[-1], ranges])))
    return unions
