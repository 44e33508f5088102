"""Runs as the pages list them: status badges, filters, the runs table, live progress."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl

from diagnostics.metrics import steady_steps
from diagnostics.runs import (
    DigestFix,
    FindingsDigest,
    RunFolder,
    RunFolderError,
    RunListing,
    RunStatus,
)
from diagnostics.severity import SEVERITY_ORDER, order_findings
from diagnostics.views.fmt import fmt_seconds, fmt_when

# Streamlit markdown badges (colour and a Material icon) for statuses and severities;
# tables get the plain word, as their cells do not render markdown.
STATUS_BADGES: dict[str, str] = {
    "running": ":blue-badge[:material/sync: running]",
    "completed": ":green-badge[:material/check_circle: completed]",
    "failed": ":red-badge[:material/error: failed]",
    "cancelled": ":gray-badge[:material/stop_circle: cancelled]",
    "preempted": ":orange-badge[:material/pause_circle: preempted]",
    "dead": ":red-badge[:material/heart_broken: dead]",
    # run.json or status.json could not be read (diagnostics.runs.list_runs says why)
    "unreadable": ":red-badge[:material/broken_image: unreadable]",
}


RUN_STATES: tuple[str, ...] = tuple(STATUS_BADGES)


def status_badge(status: str) -> str:
    return STATUS_BADGES.get(status, f":gray-badge[{status}]")


def run_duration_s(status: RunStatus, now: float | None = None) -> float | None:
    if status.started_at is None:
        return None
    end = status.ended_at
    if end is None:
        end = (time.time() if now is None else now) if status.is_active else status.heartbeat
    return None if end is None else max(0.0, end - status.started_at)


def filter_runs(
    listings: Iterable[RunListing],
    *,
    statuses: Iterable[str] = (),
    scenarios: Iterable[str] = (),
) -> list[RunListing]:
    """Runs whose status and scenario (``run_label``) are among those chosen (nothing chosen
    = all)."""
    statuses, scenarios = set(statuses), set(scenarios)
    return [
        run
        for run in listings
        if (not statuses or run.status.status in statuses)
        and (not scenarios or run_label(run) in scenarios)
    ]


@dataclass(frozen=True)
class RunFigures:
    """What the runs table shows of a run's records and its last analysis."""

    median_step_ms: float | None  # over the steady steps, as the run's cards say
    findings: FindingsDigest | None  # None: not analysed since its records changed


NOT_ANALYSED = "not analysed"


def run_figures(run: RunFolder) -> RunFigures:
    """The median steady step (the Step time card's figure) and the findings digest."""
    median = None
    try:
        steady = steady_steps(run.steps())
        if steady.height:
            value = steady["step_time_ms"].cast(pl.Float64).drop_nans().median()
            median = float(value) if isinstance(value, int | float) else None
    except RunFolderError:
        pass
    return RunFigures(median_step_ms=median, findings=run.findings_digest())


def not_analysed(
    listings: Iterable[RunListing], figures: Mapping[str, RunFigures]
) -> list[RunListing]:
    """Finished, readable runs whose findings are not known since their records changed."""
    return [
        run
        for run in listings
        if run.error is None
        and run.status.is_final
        and run.run_id in figures
        and figures[run.run_id].findings is None
    ]


def findings_digest(findings: Iterable[Any]) -> FindingsDigest:
    """Counts by severity and the rule ids, worst first, of an analysis' findings."""
    ordered = order_findings(findings)  # as the pages list them: the worst one first
    counts = dict.fromkeys(SEVERITY_ORDER, 0)
    for finding in ordered:
        counts[str(finding.severity)] += 1
    fixes = tuple(
        DigestFix(f.rule, dict(f.fix.config_patch), float(f.estimated_saving_pct))
        for f in ordered
        if f.fix is not None and f.fix.config_patch and f.estimated_saving_pct is not None
    )
    return FindingsDigest(counts=counts, rules=tuple(f.rule for f in ordered), fixes=fixes)


def findings_text(digest: FindingsDigest | None) -> str:
    """'1 high, 2 low' · 'none' · 'not analysed'."""
    if digest is None:
        return NOT_ANALYSED
    parts = [f"{digest.counts[s]} {s}" for s in SEVERITY_ORDER if digest.counts.get(s)]
    return ", ".join(parts) or "none"


def runs_table(
    listings: Iterable[RunListing],
    now: float | None = None,
    figures: Mapping[str, RunFigures] | None = None,
) -> pl.DataFrame:
    """One row per run for the runs table; 'open' is the run-detail link. ``figures``
    (by run id) fill the step-time and findings columns."""
    now = time.time() if now is None else now
    figures = figures or {}
    rows = []
    for run in listings:
        status = run.status
        total = status.total_steps
        shown = figures.get(run.run_id)
        rows.append(
            {
                "run": run.run_id,
                "scenario": run_label(run),
                "status": status.status,
                "median step (ms)": shown.median_step_ms if shown else None,
                "findings": findings_text(shown.findings) if shown else NOT_ANALYSED,
                "worst finding": (
                    shown.findings.rules[0]
                    if shown and shown.findings and shown.findings.rules
                    else ""
                ),
                "progress": (min(1.0, status.step / total) if total else None),
                "steps": f"{status.step:,}" + (f" / {total:,}" if total else ""),
                "started": fmt_when(run.created_at, now),
                "duration": fmt_seconds(run_duration_s(status, now)),
                "re-run of": run.parent_run_id or "",
                "note": run.error or (status.reason or ""),
                "open": f"Run_detail?run={quote(run.run_id, safe='')}",
            }
        )
    schema = {
        "run": pl.String,
        "scenario": pl.String,
        "status": pl.String,
        "median step (ms)": pl.Float64,
        "findings": pl.String,
        "worst finding": pl.String,
        "progress": pl.Float64,
        "steps": pl.String,
        "started": pl.String,
        "duration": pl.String,
        "re-run of": pl.String,
        "note": pl.String,
        "open": pl.String,
    }
    return pl.DataFrame(rows, schema=schema)


def run_label(run: RunListing) -> str:
    """What ran: the trainer's scenario, ``script train.py`` for a script run, else —."""
    if run.scenario:
        return run.scenario
    return f"script {run.script}" if run.script else "—"


def run_choice_label(run: RunListing, now: float | None = None) -> str:
    """How a run reads in a picker: id · scenario (or script) · status · age."""
    label = run_label(run)
    return (
        f"{run.run_id} · {'no scenario' if label == '—' else label} · {run.status.status} · "
        f"{fmt_when(run.created_at, now)}"
    )


def find_run(listings: Iterable[RunListing], run_id: str | None) -> RunListing | None:
    if not run_id:
        return None
    return next((run for run in listings if run.run_id == run_id), None)


def children_of(listings: Iterable[RunListing], run_id: str) -> list[RunListing]:
    """Re-runs launched from this run (parent_run_id == run_id), newest first."""
    return [run for run in listings if run.parent_run_id == run_id]


def safe_run_path(runs_dir: str | Path, run_id: str) -> Path | None:
    """The run folder for an id taken from a URL; None for anything that escapes runs_dir."""
    if not run_id or not re.fullmatch(r"[A-Za-z0-9._-]+", run_id) or run_id in {".", ".."}:
        return None
    path = Path(runs_dir) / run_id
    return path if RunFolder.is_run_folder(path) else None


# The live rate follows the current pace: start-up (model build, worker spawn) drops out.
RECENT_STEPS = 20
# steady step intervals (a phase's first step and marked steps left out) before an ETA is
# given: the first intervals of a run hold its start-up, and an ETA from them was 5x long
MIN_ETA_INTERVALS = 3
# step marks (diagnostics.runs) of one-off extra time; memory_history lasts the whole run
ONE_OFF_MARKS = (
    "profiler_warmup",
    "profiler_active",
    "after_trace_export",
    "epoch_start",
    "after_evaluation",
    "after_checkpoint",
)


@dataclass(frozen=True)
class Progress:
    status: str
    reason: str | None
    step: int
    total_steps: int | None
    fraction: float  # 0..1 for the progress bar
    steps_per_s: float | None  # recent: over the last RECENT_STEPS steps
    eta_s: float | None
    elapsed_s: float | None
    overall_steps_per_s: float | None = None  # first to last step record
    recent_steps: int = 0  # how many step intervals the recent rate spans

    @property
    def text(self) -> str:
        parts = [f"step {self.step:,}" + (f" of {self.total_steps:,}" if self.total_steps else "")]
        if self.steps_per_s is not None:
            parts.append(f"{self.steps_per_s:.2f} steps/s recent (last {self.recent_steps} steps)")
        if self.overall_steps_per_s is not None:
            parts.append(f"{self.overall_steps_per_s:.2f} steps/s overall")
        if self.status == "running" and self.total_steps and self.step < self.total_steps:
            parts.append(
                f"about {fmt_seconds(self.eta_s)} left"
                if self.eta_s is not None
                else "estimating time left…"
            )
        if self.elapsed_s is not None:
            parts.append(f"{fmt_seconds(self.elapsed_s)} elapsed")
        return " · ".join(parts)


def progress(status: RunStatus, steps: pl.DataFrame, now: float | None = None) -> Progress:
    """Progress of a run from its status and the step records written so far.

    The step rate is measured over the last (up to) 20 steps' wall times so it follows the
    current pace rather than including start-up (model build, worker spawn).
    """
    step = max(status.step, int(steps.height and steps.get_column("step").max() or 0))
    total = status.total_steps
    fraction = min(1.0, step / total) if total else 0.0
    if status.status == "completed":
        fraction = 1.0
    rate = overall = None
    recent_steps = 0
    wall = steps.get_column("wall_time").drop_nulls() if steps.height else None
    if wall is not None and wall.len() >= 2:
        recent = wall.tail(RECENT_STEPS + 1)
        span = float(recent.max()) - float(recent.min())
        if span > 0:
            rate = (recent.len() - 1) / span
            recent_steps = recent.len() - 1
        whole = float(wall.max()) - float(wall.min())
        if whole > 0:
            overall = (wall.len() - 1) / whole
    eta = None
    steady_rate = _steady_rate(steps)
    if steady_rate and total and step < total:
        eta = (total - step) / steady_rate
    return Progress(
        status=status.status,
        reason=status.reason,
        step=step,
        total_steps=total,
        fraction=fraction,
        steps_per_s=rate,
        eta_s=eta,
        elapsed_s=run_duration_s(status, now),
        overall_steps_per_s=overall,
        recent_steps=recent_steps,
    )


def _steady_rate(steps: pl.DataFrame) -> float | None:
    """Steps a second over the last RECENT_STEPS steady intervals: those ending at a step
    that is neither its phase's first (worker start-up, the model's first pass) nor marked
    with a known cause of extra time (profiler warm-up, evaluation, a checkpoint); None
    until MIN_ETA_INTERVALS of them are recorded."""
    if steps.height < 2 or "wall_time" not in steps.columns:
        return None
    frame = steps.filter(pl.col("wall_time").is_not_null()).sort("step")
    interval = pl.col("wall_time").diff()
    consecutive = pl.col("step").diff() == 1
    steady = consecutive & (interval > 0)
    if "phase" in frame.columns:
        steady = steady & (pl.col("phase").fill_null("") == pl.col("phase").fill_null("").shift())
    if "marks" in frame.columns:
        transient = "|".join(ONE_OFF_MARKS)
        steady = steady & ~pl.col("marks").fill_null("").str.contains(transient)
    intervals = frame.select(interval.filter(steady).alias("s")).to_series().tail(RECENT_STEPS)
    if intervals.len() < MIN_ETA_INTERVALS:
        return None
    return intervals.len() / float(intervals.sum())


def default_pair(listings: Sequence[RunListing]) -> tuple[str | None, str | None]:
    """The pair to compare when none is asked for: the newest re-run and its parent,
    else the two newest runs (older as A)."""
    readable = [run for run in listings if run.error is None]
    listings = readable if len(readable) >= 2 else listings  # an unreadable run is no default
    ids = {run.run_id for run in listings}
    for run in listings:
        if run.parent_run_id and run.parent_run_id in ids:
            return run.parent_run_id, run.run_id
    if len(listings) >= 2:
        return listings[1].run_id, listings[0].run_id
    return (listings[0].run_id, None) if listings else (None, None)
