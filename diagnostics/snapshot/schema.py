"""The one typed form of a CUDA memory snapshot, as every analysis reads it.

``torch.cuda.memory._snapshot()`` (pickled by ``_dump_snapshot``) is a dict of segments,
each holding its blocks, and per-device trace entries: the allocator's actions while
``_record_memory_history`` was on. The reader (diagnostics.snapshot.reader) turns it into
three polars frames and a table of distinct stacks; nothing downstream sees the raw dicts.
Sizes are bytes, times µs (the entries' ``time_us``, absent from older snapshots).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import polars as pl

# Block states as the allocator writes them ("active_pending_free", memory_snapshot.cpp) and
# as torch/cuda/memory.py documents them ("active_awaiting_free"): both read as the latter.
BLOCK_STATES = ("active_allocated", "active_awaiting_free", "inactive")
STATE_ALIASES = {"active_pending_free": "active_awaiting_free"}

# Every action memory.py's TraceEntry documents, plus the expandable-segment ones
# (segment_map/segment_unmap) the allocator writes with expandable_segments:True.
ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
)

SEGMENT_SCHEMA: dict[str, Any] = {
    "segment": pl.Int64,  # position in the snapshot's segment list
    "device": pl.Int64,
    "address": pl.Int64,
    "total_size": pl.Int64,
    # the segment header's own sums; null when the snapshot left them out
    "allocated_size": pl.Int64,
    "active_size": pl.Int64,
    "stream": pl.Int64,
    "segment_type": pl.String,  # "small" | "large"
    "is_expandable": pl.Boolean,
}

BLOCK_SCHEMA: dict[str, Any] = {
    "segment": pl.Int64,
    "device": pl.Int64,
    "address": pl.Int64,  # null in snapshots that list blocks by size only
    "size": pl.Int64,
    "requested_size": pl.Int64,
    "state": pl.String,  # BLOCK_STATES
    "stack": pl.Int64,  # index into MemorySnapshot.stacks; null: no frames recorded
}

ENTRY_SCHEMA: dict[str, Any] = {
    "device": pl.Int64,
    "seq": pl.Int64,  # order within its device's trace
    "action": pl.String,  # ACTIONS
    "addr": pl.Int64,  # null for oom
    "size": pl.Int64,
    "stream": pl.Int64,
    "time_us": pl.Int64,  # null in snapshots written before time_us existed
    "device_free": pl.Int64,  # oom only: what CUDA still reported free
    "stack": pl.Int64,
}


@dataclass(frozen=True)
class Frame:
    filename: str
    line: int
    name: str

    def label(self) -> str:
        return f"{self.filename}:{self.line} in {self.name}"


Stack = tuple[Frame, ...]  # innermost frame first, as the allocator records them


@dataclass(frozen=True)
class MemorySnapshot:
    source: str  # the file's display name
    segments: pl.DataFrame  # SEGMENT_SCHEMA
    blocks: pl.DataFrame  # BLOCK_SCHEMA
    entries: pl.DataFrame  # ENTRY_SCHEMA
    stacks: tuple[Stack, ...]
    # "new": written with allocator_settings (torch >= 2.5 or so); "old": without
    generation: Literal["old", "new"]
    allocator_settings: dict[str, Any] | None = None
    # external_annotations as written: {device, stage, name, time_us}, builtins only
    annotations: tuple[dict[str, Any], ...] = ()
    # entries that carried compile_context / user_metadata (counted, not interpreted)
    entries_with_compile_context: int = 0
    entries_with_user_metadata: int = 0
    pickle_protocol: int | None = None
    bytes_read: int = 0
    warnings: tuple[str, ...] = ()

    @property
    def has_history(self) -> bool:
        return self.entries.height > 0

    @property
    def has_times(self) -> bool:
        return self.entries.height > 0 and self.entries["time_us"].null_count() == 0

    def devices(self) -> list[int]:
        seen = set(self.segments["device"].drop_nulls().to_list())
        seen |= set(self.entries["device"].drop_nulls().to_list())
        return sorted(seen)
