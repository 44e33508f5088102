"""diagnostics.views.ranks and Compare's rank rows, on real runs of the trainer: a healthy
and a straggler 2-rank run under torchrun (gloo, CPU) and one single-process run."""

from __future__ import annotations

import json
import shutil
import statistics
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

import polars as pl
import pytest

from diagnostics.analyze import analyze
from diagnostics.metrics import key_metrics
from diagnostics.report.figure_style import figure_titles
from diagnostics.result import AnalysisResult
from diagnostics.runs import RunFolder
from diagnostics.views import fmt_ms, rank_comparison_table, rank_steps_figure, rank_view
from diagnostics.views.ranks import STRAGGLER_MARK, build_rank_view, straggler_ranks
from tests.conftest import STRAGGLER_DELAY_MS, make_run

pytestmark = pytest.mark.slow

TRACE_COLUMNS = {
    "compute_ms": "compute_ms_per_step",
    "exposed_comm_ms": "exposed_comm_ms_per_step",
    "comm_wait_ms": "comm_wait_ms_per_step",
}


@dataclass(frozen=True)
class Analysed:
    folder: RunFolder
    result: AnalysisResult


@dataclass(frozen=True)
class Runs:
    healthy: Analysed
    straggler: Analysed
    single: Analysed


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, two_rank_runs) -> Runs:
    def analysed(path: Path) -> Analysed:
        return Analysed(RunFolder(path), analyze(path))

    single = make_run(tmp_path_factory.mktemp("rank-view-runs"), "healthy", "healthy-1-process", 1)
    return Runs(
        healthy=analysed(two_rank_runs.healthy),
        straggler=analysed(two_rank_runs.straggler),
        single=analysed(single),
    )


def _own_medians(folder: RunFolder, rank: int) -> tuple[int, float, float]:
    """(records, median step time, median data wait) of a rank's steady-state records, from
    its own line records read with json.loads: the steady-state steps as docs/ANALYSIS.md
    defines them (each phase less its first step when the phase has more than two),
    written out here rather than taken from diagnostics.metrics.steady_steps."""
    name = "steps.jsonl" if rank == 0 else f"steps.rank{rank}.jsonl"
    lines = (folder.path / name).read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    timed = sorted(
        (r for r in records if r.get("step_time_ms") is not None), key=itemgetter("step")
    )
    phases: dict[str, list[dict]] = {}
    for record in timed:
        phases.setdefault(record.get("phase") or "", []).append(record)
    steady = [r for phase in phases.values() for r in (phase[1:] if len(phase) > 2 else phase)]
    return (
        len(records),
        statistics.median(r["step_time_ms"] for r in steady),
        statistics.median(r["data_wait_ms"] for r in steady),
    )


@pytest.mark.parametrize("which", ["healthy", "straggler"])
def test_the_table_agrees_with_each_ranks_own_step_records(runs, which):
    run: Analysed = getattr(runs, which)
    view = rank_view(run.folder, run.result)
    assert view is not None and view.world_size == 2 == run.folder.world_size()
    assert view.table["rank"].to_list() == [0, 1]
    trace_rows = {row["rank"]: row for row in run.result.summary["ranks"]["table"]}
    for rank in (0, 1):
        row = view.rank_row(rank)
        records, step_ms, wait_ms = _own_medians(run.folder, rank)
        assert row["steps"] == records == 6
        assert row["step_time_ms"] == pytest.approx(step_ms)
        assert row["data_wait_ms"] == pytest.approx(wait_ms)
        for ours, theirs in TRACE_COLUMNS.items():
            assert row[ours] == trace_rows[rank][theirs]
    # rank 0's step time is the "median step time" card: the same records, the same median
    assert view.rank_row(0)["step_time_ms"] == pytest.approx(
        key_metrics(run.result).median_step_time_ms
    )
    assert view.median_rank_step_ms == pytest.approx(
        (view.rank_row(0)["step_time_ms"] + view.rank_row(1)["step_time_ms"]) / 2
    )
    slowest = max((0, 1), key=lambda r: view.rank_row(r)["step_time_ms"])
    assert view.slowest_rank == slowest


def test_the_straggler_runs_slow_data_shows_on_rank_1(runs):
    view = rank_view(runs.straggler.folder, runs.straggler.result)
    # the session's straggler run adds STRAGGLER_DELAY_MS of data loading a batch on rank 1
    assert view.rank_row(1)["data_wait_ms"] > STRAGGLER_DELAY_MS - 50.0
    assert view.rank_row(0)["data_wait_ms"] < 100.0


def test_stragglers_are_the_ones_the_finding_names(runs):
    """Marked exactly as the analysis' rank-stragglers finding says."""
    result = runs.straggler.result
    view = rank_view(runs.straggler.folder, result)
    (named,) = [f for f in result.findings if f.rule == "rank-stragglers"]
    # the rule names the rank whose data path the scenario slowed, and only it
    expected = set(named.evidence["straggler_ranks"])
    assert expected == {1}
    assert set(view.straggler_ranks) == expected == set(straggler_ranks(result.findings))
    marks = dict(zip(view.table["rank"], view.table["straggler"], strict=True))
    assert {rank for rank, mark in marks.items() if mark == STRAGGLER_MARK} == expected
    assert all(mark in ("", STRAGGLER_MARK) for mark in marks.values())


def test_given_straggler_ranks_are_marked_in_the_table_and_the_chart(runs):
    view = rank_view(runs.straggler.folder, runs.straggler.result, stragglers=[1])
    assert view.straggler_ranks == (1,)
    assert view.table["straggler"].to_list() == ["", STRAGGLER_MARK]
    fig = rank_steps_figure(view)
    lines = {trace.name: trace for trace in fig.data}
    assert set(lines) == {"rank 0", "rank 1 (straggler)"}
    # marked by more than colour: a thicker dashed line as well as the name
    assert lines["rank 1 (straggler)"].line.dash == "dash"
    assert lines["rank 1 (straggler)"].line.width > lines["rank 0"].line.width


def test_the_chart_has_one_line_per_rank_with_its_step_times(runs):
    view = rank_view(runs.healthy.folder, runs.healthy.result, stragglers=[])
    fig = rank_steps_figure(view)
    assert figure_titles(fig) == ("Step time per rank", "step", "step time (ms)")
    records = runs.healthy.folder.rank_steps()
    assert len(fig.data) == 2
    for rank, line in enumerate(fig.data):
        own = records.filter(pl.col("rank") == rank).sort("step")
        assert line.name == f"rank {rank}"
        assert list(line.x) == own["step"].to_list() == [1, 2, 3, 4, 5, 6]
        assert list(line.y) == pytest.approx(own["step_time_ms"].to_list())


def test_a_single_process_run_has_no_rank_view(runs):
    assert runs.single.folder.world_size() == 1
    assert rank_view(runs.single.folder, runs.single.result) is None
    assert rank_comparison_table(runs.single.result, runs.single.result, "A", "B") is None


def _rows(table: pl.DataFrame) -> dict[str, tuple[str, str, str]]:
    return {row[0]: tuple(row[1:]) for row in table.iter_rows()}


def test_compare_puts_the_ranks_side_by_side(runs):
    table = rank_comparison_table(runs.healthy.result, runs.straggler.result, "A", "B")
    assert table is not None and table.columns == ["measure", "A", "B", "B ÷ A"]
    rows = _rows(table)
    assert rows["Ranks"] == ("2", "2", "1.00×")
    views = {
        side: rank_view(run.folder, run.result)
        for side, run in (("A", runs.healthy), ("B", runs.straggler))
    }
    for index, side in enumerate("AB"):
        view = views[side]
        assert rows["Median rank's step time"][index] == fmt_ms(view.median_rank_step_ms)
        slowest = view.rank_row(view.slowest_rank)["step_time_ms"]
        assert rows["Slowest rank's step time"][index] == (
            f"{fmt_ms(slowest)} (rank {view.slowest_rank})"
        )
        named = ", ".join(str(r) for r in view.straggler_ranks) or "none"
        assert rows["Straggler ranks (rank-stragglers)"][index] == named
    wait_b = views["B"].rank_row(1)["data_wait_ms"]
    assert rows["Longest data wait on one rank"][1] == f"{fmt_ms(wait_b)} (rank 1)"
    ratio = views["B"].median_rank_step_ms / views["A"].median_rank_step_ms
    assert rows["Median rank's step time"][2] == f"{ratio:.2f}×"


def test_compare_of_a_single_process_run_and_a_distributed_one(runs):
    table = rank_comparison_table(runs.single.result, runs.healthy.result, "A", "B")
    rows = _rows(table)
    assert rows["Ranks"] == ("1", "2", "2.00×")
    single_ms = key_metrics(runs.single.result).median_step_time_ms
    # one process is its own median and slowest rank
    assert rows["Median rank's step time"][0] == fmt_ms(single_ms)
    assert rows["Slowest rank's step time"][0] == f"{fmt_ms(single_ms)} (rank 0)"
    assert rows["Straggler ranks (rank-stragglers)"][0] == "—"


@pytest.mark.parametrize(("which", "world"), [("single", 1), ("healthy", 2)])
def test_throughput_counts_every_rank(runs, which, world):
    run: Analysed = getattr(runs, which)
    metrics = key_metrics(run.result)
    assert metrics.batch_size == 8  # one rank's batch
    expected = 8 * world / (metrics.median_step_time_ms / 1000.0)
    assert metrics.samples_per_s == pytest.approx(expected)


def test_a_trace_table_missing_leaves_the_trace_columns_empty(runs):
    """Step records alone (no per-rank trace table in the analysis): the table still has
    every rank, the trace's columns empty rather than invented."""
    folder = runs.healthy.folder
    view = build_rank_view(folder.rank_steps(), folder.world_size(), summary={})
    assert not view.has_trace_table and view.table.height == 2
    assert view.table["step_time_ms"].null_count() == 0
    for column in TRACE_COLUMNS:
        assert view.table[column].null_count() == 2


def _rank_section_app(run_path: str, stragglers: list[int]) -> None:
    from app_ui.ranks import rank_section
    from diagnostics.analyze import analyze
    from diagnostics.runs import RunFolder
    from diagnostics.views import rank_view

    view = rank_view(RunFolder(run_path), analyze(run_path), stragglers=stragglers)
    rank_section(view, key_prefix="test")


def test_the_section_marks_a_straggler_in_words_and_names_it(runs):
    """Run detail's section, drawn by Streamlit, with rank 1 given as the straggler."""
    from streamlit.testing.v1 import AppTest

    path = str(runs.straggler.folder.path)
    at = AppTest.from_function(_rank_section_app, args=(path, [1]), default_timeout=120).run()
    assert not at.exception
    assert [s.value for s in at.subheader] == ["Ranks"]
    assert [w.value for w in at.warning] == [
        "Straggler rank: **1** (the rank-stragglers finding below says why)."
    ]
    shown = at.table[0].value
    assert list(shown.columns)[-1] == "straggler?"
    assert list(shown["straggler?"]) == ["", "straggler"]
    assert list(shown["rank"]) == [0, 1]
    # and tinted: the styler's rules name rank 1's row only
    styles = at.table[0].proto.arrow_data.styler.styles
    assert "row1_col0" in styles and "row0_" not in styles


def test_a_rank_without_records_yet_is_listed_empty(runs, tmp_path):
    """A live run whose rank 1 has not written a step yet: both ranks listed, rank 1's
    figures empty, nothing invented for it in the chart."""
    copy = tmp_path / "live"
    shutil.copytree(runs.healthy.folder.path, copy)
    for name in ("steps.rank1.jsonl", "steps.rank1.parquet"):
        (copy / name).unlink(missing_ok=True)
    view = rank_view(RunFolder(copy), runs.healthy.result)
    assert view.table["rank"].to_list() == [0, 1]
    assert view.rank_row(1)["steps"] == 0 and view.rank_row(1)["step_time_ms"] is None
    assert view.rank_row(0)["step_time_ms"] is not None
    assert view.slowest_rank == 0
    # one line, rank 0's (named a straggler too when the healthy run's analysis says so:
    # two ranks on two cores, rank 0 checkpointing every 2 steps)
    lines = [line.name for line in rank_steps_figure(view).data]
    assert [name.split(" (")[0] for name in lines] == ["rank 0"]
