"""One snapshot analysed from itself alone: the state at dump time, the peak of the
recorded window and what held it (by allocation site and by category), fragmentation,
and the out-of-memory event when there was one.

Every figure is the snapshot's: dump-time sums are over ``segments`` (to the byte), the
timeline is the entries replayed (diagnostics.snapshot.replay). What the snapshot cannot
say is None: a snapshot recorded without history has a dump state and no peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from diagnostics.snapshot.replay import Replay, replay, requested_bytes
from diagnostics.snapshot.schema import MemorySnapshot
from diagnostics.snapshot.sites import (
    BEFORE_WINDOW,
    CATEGORIES,
    CATEGORY_METHOD,
    Site,
    category_of,
    phase_of,
    site_of,
)

SITE_SCHEMA = {
    "site": pl.String,  # path:line in function (the first frame in user code)
    "label": pl.String,  # file.py:line in function
    "user_code": pl.Boolean,
    "bytes": pl.Int64,
    "blocks": pl.Int64,
    "category": pl.String,  # the category holding most of the site's bytes
    "phase": pl.String,
    "stack": pl.String,  # the largest block's Python frames, innermost first
}
CATEGORY_SCHEMA = {"category": pl.String, "bytes": pl.Int64, "blocks": pl.Int64, "pct": pl.Float64}
SEGMENT_MAP_SCHEMA = {
    "segment": pl.Int64,
    "offset": pl.Int64,  # from the segment's start, bytes
    "size": pl.Int64,
    "state": pl.String,
    "site": pl.String,
}


@dataclass(frozen=True)
class DumpState:
    """The allocator at dump time, summed over the snapshot's segments and blocks."""

    reserved_bytes: int  # sum of segments' total_size
    allocated_bytes: int  # active_allocated blocks
    awaiting_free_bytes: int  # active_awaiting_free blocks (freed, another stream pending)
    inactive_bytes: int
    segments: int
    blocks: int
    # what the live blocks' callers asked for (the trace's unit): the timeline's level at dump
    requested_bytes: int = 0

    @property
    def active_bytes(self) -> int:
        return self.allocated_bytes + self.awaiting_free_bytes


@dataclass(frozen=True)
class Peak:
    allocated_bytes: int
    reserved_bytes: int  # at the same entry
    seq: int  # the trace entry after which it was reached
    time_s: float | None  # since the first entry; None: the snapshot has no time_us
    max_reserved_bytes: int  # the window's largest reserved, wherever it was


@dataclass(frozen=True)
class Fragmentation:
    # reserved - active at dump time; None when a segment lists blocks larger than itself
    cached_free_bytes: int | None
    inactive_split_blocks: int  # free blocks inside segments that also hold live blocks
    inactive_split_bytes: int
    largest_free_block_bytes: int
    peak_cached_free_bytes: int | None  # reserved - allocated at the peak
    failed_request_bytes: int | None  # the out-of-memory request, when there was one
    expandable_segments: bool | None  # allocator_settings' value; None: not recorded

    @property
    def request_would_fit_cached(self) -> bool | None:
        """Whether the failed request was smaller than the cached free memory in all but
        larger than any free block: memory was there, in pieces."""
        if self.failed_request_bytes is None or self.cached_free_bytes is None:
            return None
        return self.largest_free_block_bytes < self.failed_request_bytes <= self.cached_free_bytes


@dataclass(frozen=True)
class OomEvent:
    requested_bytes: int
    device_free_bytes: int | None  # what CUDA reported free
    seq: int
    time_s: float | None
    allocated_bytes: int | None  # by tensors when it happened; None: levels unknown
    reserved_bytes: int | None  # by this process's caching allocator
    sites: pl.DataFrame  # SITE_SCHEMA: what held the allocated bytes, largest first

    @property
    def cached_free_bytes(self) -> int | None:
        if self.allocated_bytes is None or self.reserved_bytes is None:
            return None
        return self.reserved_bytes - self.allocated_bytes


@dataclass(frozen=True)
class SnapshotFacts:
    source: str
    device: int
    generation: str
    pickle_protocol: int | None
    dump: DumpState
    # seq, time_s (null without time_us), action, allocated_bytes, reserved_bytes
    timeline: pl.DataFrame
    peak: Peak | None
    sites_at_peak: pl.DataFrame  # SITE_SCHEMA, largest first; empty without history
    categories_at_peak: pl.DataFrame  # CATEGORY_SCHEMA, every category
    sites_at_dump: pl.DataFrame  # SITE_SCHEMA over the blocks live at dump time
    categories_at_dump: pl.DataFrame
    fragmentation: Fragmentation
    oom: OomEvent | None
    segment_map: pl.DataFrame  # SEGMENT_MAP_SCHEMA
    dump_phase: str  # the phase of the last allocation before the dump
    category_method: str = CATEGORY_METHOD
    allocator_settings: dict[str, Any] | None = None
    entries: int = 0
    warnings: tuple[str, ...] = field(default=())

    def category_bytes(self, category: str, at: str = "peak") -> int:
        table = self.categories_at_peak if at == "peak" else self.categories_at_dump
        row = table.filter(pl.col("category") == category)
        return int(row["bytes"][0]) if row.height else 0

    def to_dict(self, max_sites: int = 20) -> dict[str, Any]:
        def sites(frame: pl.DataFrame) -> list[dict[str, Any]]:
            return frame.head(max_sites).to_dicts()

        frag = self.fragmentation
        oom = self.oom
        return {
            "source": self.source,
            "device": self.device,
            "generation": self.generation,
            "pickle_protocol": self.pickle_protocol,
            "entries": self.entries,
            "dump": {
                "reserved_bytes": self.dump.reserved_bytes,
                "allocated_bytes": self.dump.allocated_bytes,
                "awaiting_free_bytes": self.dump.awaiting_free_bytes,
                "active_bytes": self.dump.active_bytes,
                "inactive_bytes": self.dump.inactive_bytes,
                "requested_bytes": self.dump.requested_bytes,
                "segments": self.dump.segments,
                "blocks": self.dump.blocks,
                "phase": self.dump_phase,
            },
            "peak": None
            if self.peak is None
            else {
                "allocated_bytes": self.peak.allocated_bytes,
                "reserved_bytes": self.peak.reserved_bytes,
                "max_reserved_bytes": self.peak.max_reserved_bytes,
                "seq": self.peak.seq,
                "time_s": self.peak.time_s,
            },
            "sites_at_peak": sites(self.sites_at_peak),
            "categories_at_peak": self.categories_at_peak.to_dicts() if self.peak else None,
            "sites_at_dump": sites(self.sites_at_dump),
            "categories_at_dump": self.categories_at_dump.to_dicts(),
            "category_method": self.category_method,
            "fragmentation": {
                "cached_free_bytes": frag.cached_free_bytes,
                "inactive_split_blocks": frag.inactive_split_blocks,
                "inactive_split_bytes": frag.inactive_split_bytes,
                "largest_free_block_bytes": frag.largest_free_block_bytes,
                "peak_cached_free_bytes": frag.peak_cached_free_bytes,
                "failed_request_bytes": frag.failed_request_bytes,
                "expandable_segments": frag.expandable_segments,
            },
            "oom": None
            if oom is None
            else {
                "requested_bytes": oom.requested_bytes,
                "device_free_bytes": oom.device_free_bytes,
                "allocated_bytes": oom.allocated_bytes,
                "reserved_bytes": oom.reserved_bytes,
                "cached_free_bytes": oom.cached_free_bytes,
                "seq": oom.seq,
                "time_s": oom.time_s,
                "sites": sites(oom.sites),
            },
            "allocator_settings": self.allocator_settings,
            "warnings": list(self.warnings),
        }


def _dump_state(blocks: pl.DataFrame, segments: pl.DataFrame) -> DumpState:
    def total(state: str) -> int:
        return int(blocks.filter(pl.col("state") == state)["size"].sum() or 0)

    live = blocks.filter(pl.col("state") != "inactive")
    return DumpState(
        reserved_bytes=int(segments["total_size"].sum() or 0),
        allocated_bytes=total("active_allocated"),
        awaiting_free_bytes=total("active_awaiting_free"),
        inactive_bytes=total("inactive"),
        segments=segments.height,
        blocks=blocks.height,
        requested_bytes=int(live.select(requested_bytes())["requested_size"].sum() or 0)
        if live.height
        else 0,
    )


def _header_warnings(blocks: pl.DataFrame, segments: pl.DataFrame) -> tuple[list[str], int]:
    """Segments whose own allocated_size or block sizes disagree with their blocks: the
    warnings, and how many segments list blocks larger than themselves (overfull)."""
    sums = blocks.group_by("segment").agg(
        pl.col("size").sum().alias("blocks_size"),
        pl.col("size").filter(pl.col("state") == "active_allocated").sum().alias("alloc"),
    )
    joined = segments.join(sums, on="segment", how="left").with_columns(
        pl.col("blocks_size").fill_null(0), pl.col("alloc").fill_null(0)
    )
    out = []
    over = joined.filter(pl.col("blocks_size") > pl.col("total_size"))
    if over.height:
        out.append(
            f"{over.height} segment(s) list blocks larger than the segment itself, so the "
            "cached free memory is unknown"
        )
    header = joined.filter(
        pl.col("allocated_size").is_not_null() & (pl.col("allocated_size") != pl.col("alloc"))
    )
    if header.height:
        out.append(
            f"{header.height} segment(s) state an allocated_size that differs from the sum "
            "of their allocated blocks; the blocks' sums are used"
        )
    return out, over.height


def _pick_device(snapshot: MemorySnapshot) -> tuple[int, list[str]]:
    devices = snapshot.devices()
    if not devices:
        return 0, []
    reserved = {
        d: int(snapshot.segments.filter(pl.col("device") == d)["total_size"].sum() or 0)
        for d in devices
    }
    entries = {d: snapshot.entries.filter(pl.col("device") == d).height for d in devices}
    device = max(devices, key=lambda d: (reserved[d], entries[d], -d))
    notes = []
    if len(devices) > 1:
        notes.append(
            f"the snapshot holds devices {', '.join(map(str, devices))}; device {device} "
            "(the most memory reserved) is analysed"
        )
    return device, notes


class _SiteCache:
    """site_of once per distinct stack of one snapshot (thousands of blocks share one)."""

    def __init__(self, snapshot: MemorySnapshot):
        self.snapshot = snapshot
        self.sites: dict[int | None, Site] = {}

    def __call__(self, stack: int | None) -> Site:
        site = self.sites.get(stack)
        if site is None:
            site = site_of(self.snapshot.stacks[stack] if stack is not None else None)
            self.sites[stack] = site
        return site


def _categorise(
    snapshot: MemorySnapshot, alloc: pl.DataFrame, site_for: _SiteCache
) -> pl.DataFrame:
    """Adds site, label, user_code, stack_text and category to replay allocations."""
    stacks = alloc["stack"].to_list()
    sites = []
    for stack, before in zip(stacks, alloc["alloc_seq"].is_null().to_list(), strict=True):
        site = site_for(stack)
        # with no trace at all there was no recording to be before: just no frames
        sites.append(BEFORE_WINDOW if before and stack is None and snapshot.has_history else site)
    categories = []
    for stack, phase, free_seq, born, died in alloc.select(
        "stack", "phase", "free_seq", "alloc_stretch", "free_stretch"
    ).iter_rows():
        if free_seq is None:
            outlived: bool | None = True  # live at dump
        elif born is None or died is None:
            outlived = None
        else:
            outlived = died != born
        categories.append(
            category_of(snapshot.stacks[stack] if stack is not None else None, phase, outlived)
        )
    return alloc.with_columns(
        pl.Series("site", [s.key for s in sites], dtype=pl.String),
        pl.Series("label", [s.label for s in sites], dtype=pl.String),
        pl.Series("user_code", [s.user_code for s in sites], dtype=pl.Boolean),
        pl.Series("stack_text", [s.stack_text for s in sites], dtype=pl.String),
        pl.Series("category", categories, dtype=pl.String),
    )


def group_sites(live: pl.DataFrame) -> pl.DataFrame:
    """Live allocations (with site columns) by site, largest first."""
    if live.height == 0:
        return pl.DataFrame(schema=SITE_SCHEMA)
    by_cat = (
        live.group_by("site", "category")
        .agg(pl.col("size").sum().alias("cat_bytes"))
        .sort(["site", "cat_bytes", "category"], descending=[False, True, False])
        .group_by("site", maintain_order=True)
        .agg(pl.col("category").first())
    )
    grouped = (
        live.sort("size", descending=True)
        .group_by("site", maintain_order=True)
        .agg(
            pl.col("label").first(),
            pl.col("user_code").first(),
            pl.col("size").sum().alias("bytes"),
            pl.len().cast(pl.Int64).alias("blocks"),
            pl.col("phase").first(),
            pl.col("stack_text").first().alias("stack"),
        )
        .join(by_cat, on="site", how="left")
    )
    return (
        grouped.select(list(SITE_SCHEMA))
        .cast(SITE_SCHEMA)
        .sort(["bytes", "site"], descending=[True, False])
    )


def group_categories(live: pl.DataFrame) -> pl.DataFrame:
    total = int(live["size"].sum() or 0) if live.height else 0
    rows = []
    for category in CATEGORIES:
        part = live.filter(pl.col("category") == category) if live.height else live
        size = int(part["size"].sum() or 0) if part.height else 0
        rows.append(
            {
                "category": category,
                "bytes": size,
                "blocks": part.height,
                "pct": 100.0 * size / total if total else None,
            }
        )
    return pl.DataFrame(rows, schema=CATEGORY_SCHEMA)


def _live_at(alloc: pl.DataFrame, seq: int) -> pl.DataFrame:
    return alloc.filter(
        (pl.col("alloc_seq").is_null() | (pl.col("alloc_seq") <= seq))
        & (pl.col("free_seq").is_null() | (pl.col("free_seq") > seq))
    )


def _time_s(timeline: pl.DataFrame, seq: int) -> float | None:
    times = timeline["time_us"]
    if times.null_count():
        return None
    first = int(times[0])
    row = timeline.filter(pl.col("seq") == seq)
    return (int(row["time_us"][0]) - first) / 1e6 if row.height else None


def _segment_map(blocks: pl.DataFrame, segments: pl.DataFrame, site_for: _SiteCache):
    joined = blocks.join(
        segments.select("segment", pl.col("address").alias("seg_address")), on="segment"
    )
    offsets = joined.with_columns(
        pl.when(pl.col("address").is_not_null() & pl.col("seg_address").is_not_null())
        .then(pl.col("address") - pl.col("seg_address"))
        .otherwise(pl.col("size").cum_sum().over("segment") - pl.col("size"))
        .alias("offset")
    )
    labels = [site_for(s).label for s in offsets["stack"].to_list()]
    return offsets.with_columns(pl.Series("site", labels, dtype=pl.String)).select(
        list(SEGMENT_MAP_SCHEMA)
    )


def _fragmentation(
    blocks: pl.DataFrame,
    overfull: int,
    dump: DumpState,
    peak: Peak | None,
    request: int | None,
    settings,
) -> Fragmentation:
    split = blocks.group_by("segment").agg(
        (pl.col("state") != "inactive").any().alias("has_live"), pl.len().alias("n")
    )
    split_ids = split.filter(pl.col("has_live") & (pl.col("n") > 1))["segment"]
    inactive = blocks.filter(pl.col("state") == "inactive")
    split_inactive = inactive.filter(pl.col("segment").is_in(split_ids.implode()))
    expandable = None
    if isinstance(settings, dict) and "expandable_segments" in settings:
        expandable = bool(settings["expandable_segments"])
    return Fragmentation(
        cached_free_bytes=None if overfull else dump.reserved_bytes - dump.active_bytes,
        inactive_split_blocks=split_inactive.height,
        inactive_split_bytes=int(split_inactive["size"].sum() or 0),
        largest_free_block_bytes=int(inactive["size"].max() or 0) if inactive.height else 0,
        peak_cached_free_bytes=peak.reserved_bytes - peak.allocated_bytes
        if peak and not overfull
        else None,
        failed_request_bytes=request,
        expandable_segments=expandable,
    )


def analyse_snapshot(snapshot: MemorySnapshot) -> SnapshotFacts:
    device, warnings = _pick_device(snapshot)
    warnings = list(snapshot.warnings) + warnings
    segments = snapshot.segments.filter(pl.col("device") == device)
    blocks = snapshot.blocks.filter(pl.col("device") == device)
    dump = _dump_state(blocks, segments)
    header_warnings, overfull = _header_warnings(blocks, segments)
    warnings += header_warnings
    run = replay(snapshot, device, dump.requested_bytes, dump.reserved_bytes)
    site_for = _SiteCache(snapshot)
    alloc = _categorise(snapshot, run.allocations, site_for)
    timeline = run.timeline
    if run.start_allocated_bytes < 0 or run.start_reserved_bytes < 0:
        # levels below zero before the first entry: the trace holds changes the segments do
        # not (or the reverse), so no level of the window can be trusted
        warnings.append(
            "replaying the trace back from the dump state gives a negative level: the "
            "trace and the segments disagree, so the timeline and the peak are left unknown"
        )
        timeline = timeline.clear()
    peak = _peak(run, timeline)
    if peak is not None:
        live = _live_at(alloc, peak.seq)
        if int(live["size"].sum() or 0) != peak.allocated_bytes:
            warnings.append(
                "the blocks live at the peak do not add up to the replayed peak: the trace "
                "and the segments disagree (entries lost from the trace?)"
            )
        sites_at_peak, cats_at_peak = group_sites(live), group_categories(live)
    else:
        sites_at_peak, cats_at_peak = (
            pl.DataFrame(schema=SITE_SCHEMA),
            group_categories(alloc.clear()),
        )
    # what was held at dump time is the dump's own live blocks, at their block sizes (the
    # sums of the segments); a trace alloc never freed yet not live at dump is the trace
    # disagreeing with the segments
    at_dump = alloc.filter(pl.col("live_at_dump")).with_columns(pl.col("block_size").alias("size"))
    unmatched = alloc.filter(pl.col("free_seq").is_null() & ~pl.col("live_at_dump"))
    if unmatched.height:
        warnings.append(
            f"{unmatched.height:,} allocation(s) of the trace "
            f"({int(unmatched['size'].sum() or 0) / 2**20:,.1f} MiB) are never freed in it "
            "yet are not live at dump time: the trace and the segments disagree, so they "
            "are left out of what was held at dump time"
        )
    oom = _oom(snapshot, device, timeline, alloc)
    entries = snapshot.entries.filter(pl.col("device") == device)
    last_alloc = entries.filter(pl.col("action") == "alloc").tail(1)["stack"].to_list()
    dump_phase = (
        phase_of(snapshot.stacks[last_alloc[0]])
        if last_alloc and last_alloc[0] is not None
        else "unknown"
    )
    return SnapshotFacts(
        source=snapshot.source,
        device=device,
        generation=snapshot.generation,
        pickle_protocol=snapshot.pickle_protocol,
        dump=dump,
        timeline=timeline.with_columns(
            ((pl.col("time_us") - pl.col("time_us").first()) / 1e6).alias("time_s")
        ).select("seq", "time_s", "action", "allocated_bytes", "reserved_bytes"),
        peak=peak,
        sites_at_peak=sites_at_peak,
        categories_at_peak=cats_at_peak,
        sites_at_dump=group_sites(at_dump),
        categories_at_dump=group_categories(at_dump),
        fragmentation=_fragmentation(
            blocks,
            overfull,
            dump,
            peak,
            oom.requested_bytes if oom else None,
            snapshot.allocator_settings,
        ),
        oom=oom,
        segment_map=_segment_map(blocks, segments, site_for),
        dump_phase=dump_phase,
        allocator_settings=snapshot.allocator_settings,
        entries=entries.height,
        warnings=tuple(warnings),
    )


def _peak(run: Replay, timeline: pl.DataFrame) -> Peak | None:
    if timeline.height == 0:
        return None
    top = timeline.sort(["allocated_bytes", "seq"], descending=[True, False]).row(0, named=True)
    return Peak(
        allocated_bytes=int(top["allocated_bytes"]),
        reserved_bytes=int(top["reserved_bytes"]),
        seq=int(top["seq"]),
        time_s=_time_s(timeline, int(top["seq"])),
        max_reserved_bytes=int(timeline["reserved_bytes"].max() or 0),
    )


def _oom(
    snapshot: MemorySnapshot, device: int, timeline: pl.DataFrame, alloc: pl.DataFrame
) -> OomEvent | None:
    ooms = snapshot.entries.filter((pl.col("device") == device) & (pl.col("action") == "oom"))
    if ooms.height == 0:
        return None
    last = ooms.tail(1).row(0, named=True)
    levels = timeline.filter(pl.col("seq") == last["seq"])
    known = levels.height > 0
    level = levels.row(0, named=True) if known else {}
    return OomEvent(
        requested_bytes=int(last["size"]),
        device_free_bytes=last["device_free"],
        seq=int(last["seq"]),
        time_s=_time_s(timeline, int(last["seq"])) if known else None,
        allocated_bytes=int(level["allocated_bytes"]) if known else None,
        reserved_bytes=int(level["reserved_bytes"]) if known else None,
        sites=group_sites(_live_at(alloc, int(last["seq"])))
        if known
        else pl.DataFrame(schema=SITE_SCHEMA),
    )
