"""Cached loading: every analysis is keyed on its path and the files' modification time.

``st.cache_data`` pickles what it returns, so each session gets its own copy (no shared
mutable objects between users); entries are bounded by count and age so a long-running
server does not grow without limit. No widget is created inside a cached function.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from diagnostics import views
from diagnostics.analyze import analyze
from diagnostics.drilldown import DrillDown, load_drilldowns
from diagnostics.errors import InputError
from diagnostics.runs import FINDINGS_FILE, RunFolder, RunListing
from diagnostics.trace.budget import Limits
from diagnostics.views import RunFigures

CACHE_ENTRIES = 32
CACHE_TTL_S = 3600

if TYPE_CHECKING:
    from diagnostics.result import AnalysisResult


@st.cache_data(max_entries=CACHE_ENTRIES, ttl=CACHE_TTL_S, show_spinner="Analysing the run…")
def _analyse_run_cached(run_path: str, mtime_key: float) -> AnalysisResult:
    del mtime_key  # part of the cache key only: a new record or trace means a new analysis
    # Local run folders are written by our own trainer, so they are analysed in process
    # (cached, no child start-up), but under the same input budgets as uploads.
    try:
        limits = Limits.from_env()
    except ValueError as exc:  # a misconfigured server: one line on the page, as bad input
        raise InputError("server configuration", str(exc)) from None
    return analyze(
        Path(run_path),
        max_decompressed_bytes=limits.max_decompressed_bytes,
        max_events=limits.max_events,
    )


def analyse_run(run_path: Path) -> AnalysisResult:
    """The analysis of a run folder, recomputed only when one of its files changed; its
    findings in brief are kept in the folder for the runs table (diagnostics.runs).

    Raises the analyser's InputError (one line for the page) for unreadable inputs.
    """
    folder = RunFolder(run_path)
    mtime_key = folder.mtime_key()
    result = _analyse_run_cached(str(run_path), mtime_key)
    if folder.findings_digest() is None:
        # a folder we may not write (read-only, another user's) keeps its table cell empty
        with contextlib.suppress(OSError):
            folder.write_findings_digest(views.findings_digest(result.findings), mtime_key)
    return result


@st.cache_data(max_entries=1024, ttl=CACHE_TTL_S, show_spinner=False)
def _run_figures_cached(run_path: str, mtime_key: float, digest_mtime: float) -> RunFigures:
    del mtime_key, digest_mtime  # the cache key only
    return views.run_figures(RunFolder(Path(run_path)))


def run_figures(run_path: Path) -> RunFigures:
    """The runs table's figures of a run, read again only when its records or its
    findings digest changed."""
    folder = RunFolder(run_path)
    try:
        digest_mtime = (run_path / FINDINGS_FILE).stat().st_mtime
    except OSError:
        digest_mtime = 0.0
    return _run_figures_cached(str(run_path), folder.mtime_key(), digest_mtime)


def run_figures_of(run: RunListing) -> RunFigures:
    """:func:`run_figures` of a listed run (diagnostics.views.calibration reads them so)."""
    return run_figures(run.path)


@st.cache_resource(max_entries=8, ttl=CACHE_TTL_S, show_spinner="Reading the trace…")
def _run_drilldowns_cached(run_path: str, mtime_key: float) -> tuple[DrillDown, ...]:
    # a resource, not data: the event tables are large and never mutated, so every
    # session shares one copy instead of unpickling its own on each rerun
    del mtime_key
    return load_drilldowns(Path(run_path))


def run_drilldowns(run_path: Path) -> tuple[DrillDown, ...]:
    """The drill-down tables of a run's trace (one per rank), cached like the analysis."""
    return _run_drilldowns_cached(str(run_path), RunFolder(run_path).mtime_key())
