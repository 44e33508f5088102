"""The memory-snapshot sections every output shares (text, Markdown, HTML, JSON, the app),
built from ``summary.memory_snapshot`` (diagnostics.snapshot.analysis.SnapshotFacts.to_dict):
one formatting of the figures, so no two places round them differently."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIB = 2**20


@dataclass(frozen=True)
class MemoryTable:
    key: str
    title: str
    head: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric_from: int = 99  # columns from this index on are numbers (right-aligned)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "head": list(self.head),
            "rows": [list(r) for r in self.rows],
        }


def mib(n: Any) -> str:
    return "unknown" if n is None else f"{n / MIB:,.1f} MiB"


def _seconds(s: Any) -> str:
    return "unknown (no time_us)" if s is None else f"{s:,.3f} s"


def _pct(p: Any) -> str:
    return "—" if p is None else f"{p:.1f} %"


def first_frame(stack: str | None) -> str:
    lines = (stack or "").splitlines()
    return lines[0] if lines else ""


def snapshot_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    dump, peak, frag, oom = doc["dump"], doc.get("peak"), doc["fragmentation"], doc.get("oom")
    rows = [
        (
            "snapshot",
            f"{doc['source']} (schema {doc['generation']}, pickle protocol "
            f"{doc['pickle_protocol']}, device {doc['device']}, {doc['entries']:,} trace entries)",
        ),
        ("at dump: reserved", mib(dump["reserved_bytes"])),
        ("at dump: allocated", mib(dump["allocated_bytes"])),
        ("at dump: awaiting free", mib(dump["awaiting_free_bytes"])),
        ("at dump: phase", dump["phase"]),
    ]
    if peak is None and doc["entries"]:
        rows.append(
            (
                "peak",
                f"unknown: the {doc['entries']:,} trace entries and the segments disagree "
                "(see the warnings)",
            )
        )
    elif peak is None:
        rows.append(("peak", "unknown: no trace entries (_record_memory_history was off)"))
    else:
        rows.append(
            (
                "peak allocated",
                f"{mib(peak['allocated_bytes'])} at {_seconds(peak['time_s'])} "
                f"(entry {peak['seq']:,}); reserved then {mib(peak['reserved_bytes'])}",
            )
        )
        rows.append(("peak reserved", mib(peak["max_reserved_bytes"])))
    rows.append(
        (
            "fragmentation",
            f"{mib(frag['cached_free_bytes'])} cached free; "
            f"{frag['inactive_split_blocks']:,} split free blocks, {mib(frag['inactive_split_bytes'])}; "
            f"largest free block {mib(frag['largest_free_block_bytes'])}",
        )
    )
    if frag.get("expandable_segments") is not None:
        rows.append(("expandable segments", "on" if frag["expandable_segments"] else "off"))
    if oom is not None:
        rows.append(
            (
                "out of memory",
                f"{mib(oom['requested_bytes'])} requested at {_seconds(oom['time_s'])}; "
                f"CUDA free {mib(oom['device_free_bytes'])}; allocated {mib(oom['allocated_bytes'])} "
                f"of {mib(oom['reserved_bytes'])} reserved",
            )
        )
    return rows


def _site_table(key: str, title: str, sites: list[dict[str, Any]]) -> MemoryTable:
    return MemoryTable(
        key,
        title,
        ("site", "MiB", "blocks", "category", "phase", "stack (innermost first)"),
        tuple(
            (
                s["label"],
                f"{s['bytes'] / MIB:,.1f}",
                f"{s['blocks']:,}",
                s.get("category") or "unknown",
                s.get("phase") or "unknown",
                " <- ".join((s.get("stack") or "").splitlines()[:4]),
            )
            for s in sites
        ),
        numeric_from=1,
    )


def _category_table(key: str, title: str, cats: list[dict[str, Any]]) -> MemoryTable:
    return MemoryTable(
        key,
        title,
        ("category", "MiB", "blocks", "share"),
        tuple(
            (c["category"], f"{c['bytes'] / MIB:,.1f}", f"{c['blocks']:,}", _pct(c.get("pct")))
            for c in cats
        ),
        numeric_from=1,
    )


def memory_tables(doc: dict[str, Any] | None) -> tuple[MemoryTable, ...]:
    """The snapshot's tables: the figures, sites and categories at the peak (at dump time
    without trace entries), the OOM's sites, and growth by site from an earlier snapshot."""
    if not doc:
        return ()
    tables = [
        MemoryTable("memory_snapshot", "Memory snapshot", ("", ""), tuple(snapshot_rows(doc)))
    ]
    if doc.get("peak") is not None:
        tables.append(
            _site_table("sites_at_peak", "Allocation sites at the peak", doc["sites_at_peak"])
        )
        tables.append(
            _category_table("categories_at_peak", "What held the peak", doc["categories_at_peak"])
        )
    else:
        tables.append(
            _site_table("sites_at_dump", "Allocation sites at dump time", doc["sites_at_dump"])
        )
        tables.append(
            _category_table(
                "categories_at_dump", "What was held at dump time", doc["categories_at_dump"]
            )
        )
    if doc.get("oom"):
        tables.append(
            _site_table(
                "oom_sites", "What held memory at the out-of-memory error", doc["oom"]["sites"]
            )
        )
    growth = doc.get("growth")
    if growth:
        same = "same phase" if growth["same_phase"] else "different or unknown phases"
        tables.append(
            MemoryTable(
                "growth",
                f"Growth by site: {growth['before']} -> {growth['after']} ({same}: "
                f"{growth['phase_before']} / {growth['phase_after']}; total "
                f"{growth['growth_bytes'] / MIB:+,.1f} MiB)",
                ("site", "MiB before", "MiB after", "growth MiB", "blocks before", "blocks after"),
                tuple(
                    (
                        s["label"],
                        f"{s['bytes_before'] / MIB:,.1f}",
                        f"{s['bytes_after'] / MIB:,.1f}",
                        f"{s['growth_bytes'] / MIB:+,.1f}",
                        f"{s['blocks_before']:,}",
                        f"{s['blocks_after']:,}",
                    )
                    for s in growth["sites"]
                ),
                numeric_from=1,
            )
        )
    return tuple(tables)


def snapshot_text_lines(doc: dict[str, Any]) -> list[str]:
    """The CLI's text lines for a snapshot: its figures, the top sites and categories."""
    lines = [f"{label}: {value}" for label, value in snapshot_rows(doc)]
    at_peak = doc.get("peak") is not None
    sites = doc["sites_at_peak"] if at_peak else doc["sites_at_dump"]
    where = "at the peak" if at_peak else "at dump time"
    if sites:
        lines.append(f"allocation sites {where}:")
        lines.extend(
            f"  {s['bytes'] / MIB:>10,.1f} MiB  {s['blocks']:>6,} blocks  {s.get('category') or 'unknown':<15} {s['label']}"
            for s in sites[:8]
        )
    cats = doc["categories_at_peak"] if at_peak else doc["categories_at_dump"]
    if cats:
        lines.append(
            f"categories {where}: "
            + " · ".join(f"{c['category']} {mib(c['bytes'])}" for c in cats if c["bytes"])
        )
    growth = doc.get("growth")
    if growth:
        lines.append(
            f"growth {growth['before']} -> {growth['after']}: {growth['growth_bytes'] / MIB:+,.1f} MiB"
            f" ({'same phase' if growth['same_phase'] else 'different or unknown phases'})"
        )
        lines.extend(
            f"  {s['growth_bytes'] / MIB:>+10,.1f} MiB  {s['label']}"
            for s in growth["sites"][:5]
            if s["growth_bytes"]
        )
    oom = doc.get("oom")
    if oom and oom.get("sites"):
        lines.append("held at the out-of-memory error:")
        lines.extend(
            f"  {s['bytes'] / MIB:>10,.1f} MiB  {s['blocks']:>6,} blocks  "
            f"{s.get('category') or 'unknown':<15} {s['label']}"
            for s in oom["sites"][:8]
        )
    # the snapshot's warnings are the result's too: the CLI prints them once, at the end
    return lines
