"""A distributed run's ranks side by side: Run detail's per-rank table and chart, and the
rank figures Compare quotes.

Where each figure comes from
    Step time and data wait: the median over each rank's own steady-state step records
    (``RunFolder.rank_steps()``, ``metrics.steady_steps``), so rank 0's step time is the
    "median step time" card. Compute, exposed communication and waiting in collectives: the
    analysis' per-rank table (``summary["ranks"]["table"]``, from each rank's trace over
    the profiled steps). Compute comes from the trace rather than the step records because
    a rank's forward + backward time includes its wait in DDP's gradient all-reduce: the
    fast ranks of a job with a straggler would look slow to compute.
Stragglers
    As the ``rank-stragglers`` finding names them (``evidence["straggler_ranks"]``); none
    without that finding. The view does not judge them itself: one rule decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import polars as pl

from diagnostics.metrics import steady_steps
from diagnostics.report.figure_style import integer_axis, layout, thin
from diagnostics.runs import RunFolder

STRAGGLER_RULE = "rank-stragglers"
STRAGGLER_MARK = "straggler"

# column of the per-rank table -> the analysis' rank-table column it is read from
_TRACE_COLUMNS: dict[str, str] = {
    "compute_ms": "compute_ms_per_step",
    "exposed_comm_ms": "exposed_comm_ms_per_step",
    "comm_wait_ms": "comm_wait_ms_per_step",
}

RANK_TABLE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64,
    "steps": pl.UInt32,  # the rank's step records
    "step_time_ms": pl.Float64,  # median of its steady-state step records
    "data_wait_ms": pl.Float64,  # median of the same records' data wait
    "compute_ms": pl.Float64,  # per profiled step, from its trace, communication left out
    "exposed_comm_ms": pl.Float64,  # communication with no compute beside it, per step
    "comm_wait_ms": pl.Float64,  # waiting in collectives for later ranks, per step
    "straggler": pl.String,  # "straggler" for a rank the rank-stragglers finding names
}

# what a person reads above each column (units in the name)
RANK_TABLE_LABELS: dict[str, str] = {
    "rank": "rank",
    "steps": "steps",
    "step_time_ms": "step time, median (ms)",
    "data_wait_ms": "data wait, median (ms)",
    "compute_ms": "compute per step (ms)",
    "exposed_comm_ms": "exposed communication per step (ms)",
    "comm_wait_ms": "waiting in collectives per step (ms)",
    "straggler": "straggler?",
}

SERIES_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "step_time_ms": pl.Float64,
}


@dataclass(frozen=True)
class RankView:
    world_size: int
    table: pl.DataFrame  # RANK_TABLE_SCHEMA, one row per rank, by rank
    series: pl.DataFrame  # SERIES_SCHEMA: every rank's step time per step, by rank and step
    straggler_ranks: tuple[int, ...]  # as the rank-stragglers finding names them
    slowest_rank: int | None  # the rank with the longest median step time
    median_rank_step_ms: float | None  # median over ranks of each rank's median step
    has_trace_table: bool  # whether the analysis had a per-rank table (traces of every rank)

    def rank_row(self, rank: int) -> dict[str, Any]:
        return self.table.filter(pl.col("rank") == rank).row(0, named=True)


def straggler_ranks(findings: Iterable[Any]) -> tuple[int, ...]:
    """The ranks the rank-stragglers finding names (empty without it)."""
    named: set[int] = set()
    for finding in findings:
        if getattr(finding, "rule", None) != STRAGGLER_RULE:
            continue
        evidence = getattr(finding, "evidence", None) or {}
        for rank in evidence.get("straggler_ranks") or ():
            if isinstance(rank, int) and not isinstance(rank, bool):
                named.add(rank)
    return tuple(sorted(named))


def _trace_rows(summary: Mapping[str, Any] | None) -> dict[int, Mapping[str, Any]]:
    ranks = (summary or {}).get("ranks") or {}
    rows = ranks.get("table") if isinstance(ranks, Mapping) else None
    out: dict[int, Mapping[str, Any]] = {}
    for row in rows or ():
        if isinstance(row, Mapping) and isinstance(row.get("rank"), int):
            out[row["rank"]] = row
    return out


def _median(series: pl.Series) -> float | None:
    values = series.cast(pl.Float64).drop_nulls().drop_nans()
    return float(values.median()) if values.len() else None


def build_rank_view(
    rank_steps: pl.DataFrame,
    world_size: int,
    summary: Mapping[str, Any] | None,
    stragglers: Sequence[int] = (),
) -> RankView:
    """The per-rank table and chart series from every rank's step records (with a leading
    ``rank`` column, as ``RunFolder.rank_steps()``), the analysis summary's per-rank table
    and the straggler ranks to mark."""
    trace = _trace_rows(summary)
    marked = tuple(sorted({int(r) for r in stragglers}))
    rows = []
    for rank in range(world_size):
        own = rank_steps.filter(pl.col("rank") == rank).drop("rank")
        steady = steady_steps(own)
        from_trace = trace.get(rank, {})
        rows.append(
            {
                "rank": rank,
                "steps": own.height,
                "step_time_ms": _median(steady["step_time_ms"]) if steady.height else None,
                "data_wait_ms": _median(steady["data_wait_ms"]) if steady.height else None,
                **{ours: from_trace.get(theirs) for ours, theirs in _TRACE_COLUMNS.items()},
                "straggler": STRAGGLER_MARK if rank in marked else "",
            }
        )
    table = pl.DataFrame(rows, schema=RANK_TABLE_SCHEMA)
    series = (
        rank_steps.filter(pl.col("step_time_ms").is_not_null())
        .select(pl.col("rank"), pl.col("step"), pl.col("step_time_ms"))
        .cast(SERIES_SCHEMA)  # type: ignore[arg-type]
        .sort("rank", "step")
    )
    timed = table.filter(pl.col("step_time_ms").is_not_null())
    slowest = (
        int(timed.sort("step_time_ms", descending=True, maintain_order=True)["rank"][0])
        if timed.height
        else None
    )
    return RankView(
        world_size=world_size,
        table=table,
        series=series,
        straggler_ranks=marked,
        slowest_rank=slowest,
        median_rank_step_ms=_median(table["step_time_ms"]),
        has_trace_table=bool(trace),
    )


def rank_view(
    run_folder: RunFolder, analysis_result: Any, stragglers: Sequence[int] | None = None
) -> RankView | None:
    """Run detail's per-rank view of a distributed run; None for a single-process run.
    ``stragglers`` overrides the ranks the analysis' rank-stragglers finding names."""
    world_size = run_folder.world_size()
    if world_size < 2:
        return None
    marked = (
        straggler_ranks(getattr(analysis_result, "findings", ()))
        if stragglers is None
        else stragglers
    )
    return build_rank_view(
        run_folder.rank_steps(), world_size, getattr(analysis_result, "summary", None), marked
    )


def result_rank_view(analysis_result: Any) -> RankView | None:
    """The rank view of an analysis of a run folder (None: not a run, or single-process)."""
    run = getattr(analysis_result, "run", None)
    folder = getattr(run, "folder", None)
    return rank_view(folder, analysis_result) if folder is not None else None


def rank_label(rank: int, stragglers: Sequence[int]) -> str:
    return f"rank {rank} ({STRAGGLER_MARK})" if rank in stragglers else f"rank {rank}"


def rank_steps_figure(view: RankView) -> go.Figure:
    """Step time per rank over steps, one line per rank; a straggler's line is thicker,
    dashed and named so (never colour alone)."""
    fig = go.Figure()
    for rank in range(view.world_size):
        own = thin(view.series.filter(pl.col("rank") == rank))
        if own.height == 0:
            continue
        straggler = rank in view.straggler_ranks
        fig.add_trace(
            go.Scatter(
                x=own["step"].to_list(),
                y=own["step_time_ms"].to_list(),
                mode="lines+markers",
                name=rank_label(rank, view.straggler_ranks),
                line={"width": 4 if straggler else 2, "dash": "dash" if straggler else "solid"},
                hovertemplate="%{y:.1f} ms",
            )
        )
    layout(fig, "Step time per rank", "step", "step time (ms)")
    integer_axis(fig, view.series["step"].unique().sort().to_list())
    return fig


def rank_table_text(view: RankView) -> pl.DataFrame:
    """The per-rank table with people's column names (numbers stay numbers)."""
    return view.table.rename(RANK_TABLE_LABELS)
