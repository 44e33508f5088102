"""The recorded window replayed: allocated and reserved after every trace entry, and
each allocation's lifetime.

Entries record changes, not levels: the level is anchored at dump time, where the
segments give it exactly, and walked back (level before entry i = level at dump minus the
changes from i on). So a trace whose ring buffer dropped its oldest entries still gives
true levels. ``allocated`` counts a block from ``alloc`` to ``free_completed`` (a block
awaiting another stream's use still holds its memory), as memory_viz's trace does;
``reserved`` moves with ``segment_alloc``/``segment_map`` (+) and
``segment_free``/``segment_unmap`` (-).

The allocator records an ``alloc`` or ``free_*`` entry with the size the caller asked for,
not the block's (a real 2,000,000,000-byte request is a 2,000,683,008-byte block, a 4-byte
one a 512-byte block): so ``allocated`` is replayed in requested bytes, anchored at the
live blocks' ``requested_size``. A segment's entries carry the segment's own size, so
``reserved`` is in the segments' bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from diagnostics.snapshot.schema import MemorySnapshot
from diagnostics.snapshot.sites import phase_of

TIMELINE_SCHEMA = {
    "seq": pl.Int64,
    "time_us": pl.Int64,
    "action": pl.String,
    "allocated_bytes": pl.Int64,  # after the entry
    "reserved_bytes": pl.Int64,
}
# one row per block that was live at some point of the window, or at dump time
ALLOCATION_SCHEMA = {
    "addr": pl.Int64,
    "size": pl.Int64,
    "alloc_seq": pl.Int64,  # null: allocated before the recording began
    "free_seq": pl.Int64,  # free_completed; null: still live at dump time
    "stack": pl.Int64,
    "phase": pl.String,  # sites.PHASES
    # the stretch (run of allocs/frees in one phase) it was allocated and freed in
    "alloc_stretch": pl.Int64,
    "free_stretch": pl.Int64,
    "phase_by_position": pl.Boolean,  # phase read from its neighbours, not its frames
    "live_at_dump": pl.Boolean,  # one of the blocks live at dump time
    "block_size": pl.Int64,  # the block's size at dump time; null when not live then
}

_ALLOC_DELTA = {"alloc": 1, "free_completed": -1}
_RESERVE_DELTA = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


@dataclass(frozen=True)
class Replay:
    timeline: pl.DataFrame  # TIMELINE_SCHEMA, one row per entry
    allocations: pl.DataFrame  # ALLOCATION_SCHEMA
    start_allocated_bytes: int  # before the first entry
    start_reserved_bytes: int


def replay(
    snapshot: MemorySnapshot, device: int, dump_requested: int, dump_reserved: int
) -> Replay:
    """``dump_requested``: the live blocks' requested bytes, the level the trace's sizes
    reach at dump time."""
    entries = snapshot.entries.filter(pl.col("device") == device).sort("seq")
    actions = entries["action"].to_list()
    sizes = entries["size"].to_list()
    d_alloc = [_ALLOC_DELTA.get(a, 0) * s for a, s in zip(actions, sizes, strict=True)]
    d_res = [_RESERVE_DELTA.get(a, 0) * s for a, s in zip(actions, sizes, strict=True)]
    start_alloc = dump_requested - sum(d_alloc)
    start_res = dump_reserved - sum(d_res)
    timeline = entries.select("seq", "time_us", "action").with_columns(
        (pl.Series(d_alloc, dtype=pl.Int64).cum_sum() + start_alloc).alias("allocated_bytes"),
        (pl.Series(d_res, dtype=pl.Int64).cum_sum() + start_res).alias("reserved_bytes"),
    )
    return Replay(
        timeline.cast(TIMELINE_SCHEMA) if timeline.height else pl.DataFrame(schema=TIMELINE_SCHEMA),
        _allocations(snapshot, entries, device),
        start_alloc,
        start_res,
    )


def _phases(stacks: list[int | None], snapshot: MemorySnapshot) -> tuple[list[str], list[bool]]:
    """Each alloc's or free's phase from its frames; an entry with no frames at all after
    a forward or backward stretch is taken as backward (autograd's device threads run no
    Python, so with stacks="python" the backward pass records empty stacks)."""
    phases, by_position = [], []
    last_framed = "unknown"
    cache: dict[int, str] = {}
    for stack in stacks:
        if stack is None:
            phase = "unknown"
        else:
            phase = cache.get(stack) or cache.setdefault(stack, phase_of(snapshot.stacks[stack]))
        guessed = False
        if stack is None and last_framed in ("forward", "backward"):
            phase, guessed = "backward", True
        elif phase != "unknown":
            last_framed = phase
        phases.append(phase)
        by_position.append(guessed)
    return phases, by_position


def _allocations(snapshot: MemorySnapshot, entries: pl.DataFrame, device: int) -> pl.DataFrame:
    """Every allocation's lifetime, and whether it outlived the stretch of its phase: a
    stretch is a run of allocs and frees in one phase, so a forward tensor freed in the
    forward pass is a temporary, one freed in backward (or never) was saved for it."""
    rows = entries.filter(pl.col("action").is_in(["alloc", "free_completed"])).select(
        "seq", "action", "addr", "size", "stack"
    )
    phases, by_position = _phases(rows["stack"].to_list(), snapshot)
    stretches, stretch = [], 0
    for i, phase in enumerate(phases):
        if i and phase != phases[i - 1]:
            stretch += 1
        stretches.append(stretch)

    out: dict[str, list] = {k: [] for k in ALLOCATION_SCHEMA}
    open_by_addr: dict[int, int] = {}  # addr -> row index of its live allocation

    def add(addr, size, alloc_seq, stack, phase, stretch_id, guessed):
        out["addr"].append(addr)
        out["size"].append(size)
        out["alloc_seq"].append(alloc_seq)
        out["free_seq"].append(None)
        out["stack"].append(stack)
        out["phase"].append(phase)
        out["alloc_stretch"].append(stretch_id)
        out["free_stretch"].append(None)
        out["phase_by_position"].append(guessed)
        out["live_at_dump"].append(False)
        out["block_size"].append(None)
        return len(out["addr"]) - 1

    for i, (seq, action, addr, size, stack) in enumerate(rows.iter_rows()):
        if action == "alloc":
            open_by_addr[addr] = add(
                addr, size, seq, stack, phases[i], stretches[i], by_position[i]
            )
            continue
        row = open_by_addr.pop(addr, None)
        if row is None:  # allocated before the window: its site is unknown
            row = add(addr, size, None, None, "unknown", None, False)
        out["free_seq"][row] = seq
        out["free_stretch"][row] = stretches[i]
    # blocks live at dump that no alloc of the window made: allocated before it
    live = snapshot.blocks.filter(
        (pl.col("device") == device) & (pl.col("state") != "inactive")
    ).select("address", "size", requested_bytes(), "stack")
    for addr, size, requested, stack in live.iter_rows():
        row = open_by_addr.pop(addr, None) if addr is not None else None
        if row is not None:
            if out["stack"][row] is None:
                out["stack"][row] = stack
        else:
            phase = phase_of(snapshot.stacks[stack]) if stack is not None else "unknown"
            row = add(addr, requested, None, stack, phase, None, False)
        out["live_at_dump"][row] = True
        out["block_size"][row] = size
    return pl.DataFrame(out, schema=ALLOCATION_SCHEMA)


def requested_bytes() -> pl.Expr:
    """A block's requested size, its own size where the snapshot left it out (0 or null on
    a live block: older snapshots)."""
    requested = pl.col("requested_size")
    return (
        pl.when(requested.is_null() | (requested <= 0))
        .then(pl.col("size"))
        .otherwise(requested)
        .alias("requested_size")
    )
