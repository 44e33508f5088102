"""The memory-snapshot section of a page, without Streamlit: its key figures, the sortable
site table (MiB at the peak, stack), the categories and the growth table, and the three
figures (diagnostics.report.memory_plots). Pages only lay these out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from diagnostics.report.memory import snapshot_rows

MIB = 2**20


@dataclass(frozen=True)
class MemoryView:
    rows: tuple[tuple[str, str], ...]  # label, value
    sites_title: str  # "at the peak", or "at dump time" without trace entries
    sites: pl.DataFrame  # site, MiB, blocks, category, phase, user code, stack
    categories: pl.DataFrame  # category, MiB, blocks, share %
    growth: pl.DataFrame | None  # site, MiB before, MiB after, growth MiB, blocks
    growth_caption: str | None
    category_method: str
    figures: tuple[tuple[str, Callable[[], Any]], ...]  # (tab label, figure maker)
    warnings: tuple[str, ...]


def _sites(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select(
        pl.col("label").alias("site"),
        (pl.col("bytes") / MIB).round(2).alias("MiB"),
        "blocks",
        "category",
        "phase",
        pl.col("user_code").alias("user code"),
        pl.col("stack").str.replace_all("\n", "  <-  ").alias("stack (innermost first)"),
        pl.col("site").alias("path"),
    )


def memory_view(result: Any) -> MemoryView | None:
    """None when the result holds no memory snapshot."""
    facts = getattr(result, "snapshot", None)
    if facts is None:
        return None
    from diagnostics.report import memory_plots

    doc = (result.summary or {}).get("memory_snapshot") or facts.to_dict()
    at_peak = facts.peak is not None
    cats = facts.categories_at_peak if at_peak else facts.categories_at_dump
    growth = getattr(result, "snapshot_growth", None)
    growth_table, caption = None, None
    if growth is not None:
        growth_table = growth.sites.select(
            pl.col("label").alias("site"),
            (pl.col("bytes_before") / MIB).round(2).alias("MiB before"),
            (pl.col("bytes_after") / MIB).round(2).alias("MiB after"),
            (pl.col("growth_bytes") / MIB).round(2).alias("growth MiB"),
            pl.col("blocks_before").alias("blocks before"),
            pl.col("blocks_after").alias("blocks after"),
            pl.col("site").alias("path"),
        )
        phases = "the same phase" if growth.same_phase else "different or unknown phases"
        caption = (
            f"{growth.before} → {growth.after}, dumped in {phases} ({growth.phase_before} / "
            f"{growth.phase_after}): {growth.growth_bytes / MIB:+,.1f} MiB in all"
        )
    return MemoryView(
        rows=tuple(snapshot_rows(doc)),
        sites_title="at the peak" if at_peak else "at dump time",
        sites=_sites(facts.sites_at_peak if at_peak else facts.sites_at_dump),
        categories=cats.select(
            "category",
            (pl.col("bytes") / MIB).round(2).alias("MiB"),
            "blocks",
            pl.col("pct").round(1).alias("share %"),
        ),
        growth=growth_table,
        growth_caption=caption,
        category_method=facts.category_method,
        figures=(
            ("Timeline", lambda: memory_plots.memory_timeline_figure(facts)),
            ("Categories", lambda: memory_plots.categories_figure(facts)),
            ("Segment map", lambda: memory_plots.segment_map_figure(facts)),
        ),
        warnings=facts.warnings,
    )


def snapshot_growth_between(result_a: Any, result_b: Any) -> tuple[pl.DataFrame, str] | None:
    """Two runs that each hold a memory snapshot (Compare): growth by site from A's latest
    snapshot to B's, with a caption saying whether the dumps share a phase; None unless
    both have one."""
    from diagnostics.snapshot.compare import compare_snapshots

    a, b = getattr(result_a, "snapshot", None), getattr(result_b, "snapshot", None)
    if a is None or b is None:
        return None
    growth = compare_snapshots(a, b)
    table = growth.sites.select(
        pl.col("label").alias("site"),
        (pl.col("bytes_before") / MIB).round(2).alias("MiB in A"),
        (pl.col("bytes_after") / MIB).round(2).alias("MiB in B"),
        (pl.col("growth_bytes") / MIB).round(2).alias("B − A MiB"),
        pl.col("site").alias("path"),
    )
    phases = "the same phase" if growth.same_phase else "different or unknown phases"
    caption = (
        f"Memory snapshots at dump time, A {growth.phase_before} / B {growth.phase_after} "
        f"({phases}): {growth.growth_bytes / MIB:+,.1f} MiB in all"
    )
    return table, caption
