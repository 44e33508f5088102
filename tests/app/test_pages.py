"""AppTest: every page renders without an exception; the launch form validates its fields.

Pages are run in-process against real run folders written by the real trainer
(``trained_runs``) and against an empty runs folder.
"""

from __future__ import annotations

import gzip
import time

import polars as pl
import pytest
from streamlit.testing.v1 import AppTest

from app_ui.safe_text import shown
from diagnostics.runs import FINAL_STATES, RunFolder, RunWriter, list_runs
from tests.app.conftest import QUICK_RUN, REPO_ROOT
from trainer import launch

PAGES = (
    "app.py",
    "pages/1_Launch.py",
    "pages/2_Runs.py",
    "pages/3_Run_detail.py",
    "pages/4_Upload_trace.py",
    "pages/5_Compare.py",
    "pages/6_Rules.py",
)
TIMEOUT_S = 120


def open_page(page: str, query: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(str(REPO_ROOT / "app.py"), default_timeout=TIMEOUT_S)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    if page != "app.py":
        at.switch_page(page)
    return at.run()


def texts(at: AppTest) -> str:
    """Everything a person reads on the page, as one string."""
    parts = []
    for kind in (
        "title",
        "subheader",
        "markdown",
        "caption",
        "error",
        "warning",
        "info",
        "success",
    ):
        parts.extend(str(element.value) for element in getattr(at, kind))
    parts.extend(expander.label for expander in at.expander)
    return "\n".join(parts)


@pytest.fixture
def runs_env(monkeypatch, trained_runs):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(trained_runs.runs_dir))
    return trained_runs


@pytest.fixture
def empty_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_page_renders_with_runs(runs_env, page):
    at = open_page(page)
    assert not at.exception, at.exception
    assert at.title, f"{page} has no title"


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_with_no_runs(empty_env, page):
    at = open_page(page)
    assert not at.exception, at.exception
    assert at.title, f"{page} has no title"


@pytest.mark.slow
def test_run_detail_shows_cards_findings_and_lineage(runs_env):
    at = open_page("pages/3_Run_detail.py", {"run": runs_env.slow.name})
    assert not at.exception
    labels = [metric.label for metric in at.metric]
    for card in (
        "Median step time",
        "Samples/s",
        "GPU utilisation",
        "GPU busy",
        "Data-wait share",
        "Peak host RSS",  # a CPU run: its RSS over all steps, as its Memory chart shows
    ):
        assert card in labels
    page_text = texts(at)
    assert "`too-few-workers`" in page_text  # the finding's header names its rule
    assert f"tensorboard --logdir {runs_env.slow / 'trace'}" in [code.value for code in at.code]
    rerun_buttons = [b for b in at.button if b.label == "Re-run with fix"]
    assert rerun_buttons, "a finding with a config patch offers a re-run"
    # the re-run links back to the original and to the comparison
    child = open_page("pages/3_Run_detail.py", {"run": runs_env.fixed.name})
    assert f"Re-run of **{runs_env.slow.name}**" in texts(child)


def test_run_detail_unknown_run_says_so(runs_env):
    at = open_page("pages/3_Run_detail.py", {"run": "no-such-run"})
    assert not at.exception
    assert any("`no-such-run` was not found" in e.value for e in at.error)


def test_unreadable_and_failed_runs_get_one_line(empty_env):
    failed = RunWriter.create(empty_env, {"scenario": "healthy"}, {}, run_id="failed-run")
    failed.finalise("failed", "CUDA out of memory")
    newer = RunWriter.create(empty_env, {"scenario": "healthy"}, {}, run_id="newer-version")
    newer.finalise("completed")
    newer.update_manifest(version=99)  # a run folder from a future version
    at = open_page("pages/3_Run_detail.py", {"run": "newer-version"})
    assert not at.exception
    # shown(): the path is escaped for markdown (a folder name is not markup)
    assert [shown(e.value) for e in at.error] == [
        f"{empty_env / 'newer-version' / 'run.json'}: run folder version 99 is not supported "
        "(this reader knows 1)"
    ]
    at = open_page("pages/3_Run_detail.py", {"run": "failed-run"})
    assert not at.exception
    assert "CUDA out of memory" in texts(at)
    for page in ("app.py", "pages/2_Runs.py", "pages/5_Compare.py"):
        assert not open_page(page).exception


@pytest.mark.slow
def test_runs_filter_by_scenario_and_status(runs_env):
    at = open_page("pages/2_Runs.py")
    assert "2 of 2 runs" in texts(at)
    status_filter = next(m for m in at.multiselect if m.label == "Status")
    status_filter.set_value(["running"]).run()
    assert not at.exception
    assert "0 of 2 runs" in texts(at)
    status_filter.set_value(["completed", "cancelled"]).run()
    assert "2 of 2 runs" in texts(at)


@pytest.mark.slow
def test_runs_table_shows_step_time_and_findings_after_analyse(monkeypatch, tmp_path, trained_runs):
    import shutil

    runs_dir = tmp_path / "runs"
    shutil.copytree(trained_runs.runs_dir, runs_dir)
    for run in list_runs(runs_dir):
        (run.path / "findings.json").unlink(missing_ok=True)  # as if never opened
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(runs_dir))

    at = open_page("pages/2_Runs.py")
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["median step (ms)"].notna()) == [True, True]
    assert (table["median step (ms)"] > 0).all()
    assert list(table["findings"]) == ["not analysed", "not analysed"]
    button = next(b for b in at.button if b.label == "Analyse 2 runs not analysed yet")

    button.click().run()
    assert not at.exception
    table = at.dataframe[0].value
    slow = table[table["run"] == trained_runs.slow.name].iloc[0]
    # the slow-loader run's worst finding is the one it exists to show
    assert slow["worst finding"] == "too-few-workers"
    assert "high" in slow["findings"] or "medium" in slow["findings"]
    assert "not analysed" not in list(table["findings"])
    assert not [b for b in at.button if b.label.startswith("Analyse ")]
    # the Home page's recent runs read the same figures
    home = open_page("app.py")
    assert list(home.dataframe[0].value["findings"]) == list(table["findings"])


@pytest.mark.slow
def test_compare_shows_ratios_and_the_gone_finding(runs_env):
    at = open_page("pages/5_Compare.py", {"a": runs_env.slow.name, "b": runs_env.fixed.name})
    assert not at.exception
    page_text = texts(at)
    # the headline is the median step-time ratio, recomputed here from the two runs' own
    # step records (steady state: the first step of each phase left out, docs/METRICS.md)
    medians = [_steady_median_step_ms(run) for run in (runs_env.slow, runs_env.fixed)]
    speedup = medians[0] / medians[1]
    expected = f"B is {speedup:.2f}× faster" if speedup >= 1 else f"B is {1 / speedup:.2f}× slower"
    assert expected in shown(page_text), (medians, page_text[:600])
    assert "Gone in B" in page_text


def _steady_median_step_ms(path) -> float:
    steps = RunFolder(path).steps().filter(pl.col("step_time_ms").is_not_null()).sort("step")
    firsts = steps.group_by("phase").agg(pl.col("step").min(), pl.len())
    skipped = firsts.filter(pl.col("len") > 2)["step"].to_list()
    return float(steps.filter(~pl.col("step").is_in(skipped))["step_time_ms"].median())


# --- launch form validation --------------------------------------------------------------


def _field(at: AppTest, label: str):
    return next(w for w in at.number_input if w.label == label)


def test_launch_form_shows_errors_next_to_the_fields_and_starts_nothing(empty_env):
    at = open_page("pages/1_Launch.py")
    assert not at.exception
    _field(at, "Batch size").set_value(0)
    _field(at, "DataLoader workers").set_value(-1)
    next(b for b in at.button if b.label == "Start run").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(e.startswith("train.batch_size: 0 is out of range") for e in errors), errors
    assert any(e.startswith("data.num_workers: -1 is out of range") for e in errors), errors
    assert any("2 settings need fixing" in e for e in errors), errors
    assert list_runs(empty_env) == []  # nothing was launched


def test_launch_form_size_preset_sets_the_fields_and_is_validated(empty_env):
    at = open_page("pages/1_Launch.py")
    size = next(s for s in at.selectbox if s.label == "Model size")
    assert size.value == "auto" and list(size.options) == ["auto", "cpu", "gpu"]
    assert (_field(at, "Batch size").value, _field(at, "DataLoader workers").value) == (32, 1)
    size.set_value("gpu").run()
    assert not at.exception
    # the form now starts at the gpu preset (the H200-measured size)
    assert (_field(at, "Batch size").value, _field(at, "DataLoader workers").value) == (256, 4)
    _field(at, "Batch size").set_value(0)
    next(b for b in at.button if b.label == "Start run").click().run()
    errors = [e.value for e in at.error]
    assert any(e.startswith("train.batch_size: 0 is out of range") for e in errors), errors
    assert list_runs(empty_env) == []
    # what was typed stays for the correction (the preset is loaded only on a switch)
    assert (_field(at, "Batch size").value, _field(at, "DataLoader workers").value) == (0, 4)


def test_launch_form_refuses_while_a_run_uses_the_device(empty_env):
    writer = RunWriter.create(
        empty_env, {"scenario": "healthy"}, {}, run_id="busy-run", total_steps=50
    )
    writer.append_step({"step": 3, "wall_time": time.time(), "step_time_ms": 10.0})
    writer.heartbeat()
    at = open_page("pages/1_Launch.py")
    assert not at.exception
    start = next(b for b in at.button if b.label == "Start run")
    assert start.disabled
    assert any("busy-run" in w.value and "using the device" in w.value for w in at.warning)
    # the busy run is found again from the runs folder and shown live
    assert any("busy-run" in m.value for m in at.markdown)
    writer.finalise("cancelled")


# --- upload ------------------------------------------------------------------------------


def test_upload_bad_file_shows_the_one_line_error(empty_env):
    at = open_page("pages/4_Upload_trace.py")
    assert "200 MB per file" in texts(at)
    at.file_uploader[0].set_value(
        ("broken.json.gz", gzip.compress(b"{not json"), "application/gzip")
    )
    at.run()
    assert not at.exception
    assert len(at.error) == 1
    message = shown(at.error[0].value)
    assert message.startswith("broken.json.gz: ") and "\n" not in message


@pytest.mark.slow
def test_upload_real_trace_shows_findings(empty_env, shared_traces_dir):
    trace = shared_traces_dir / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
    at = open_page("pages/4_Upload_trace.py")
    at.file_uploader[0].set_value((trace.name, trace.read_bytes(), "application/gzip"))
    at.run()
    assert not at.exception
    assert not at.error
    assert [m.label for m in at.metric][:6] == [
        "Median step time",
        "Steps/s",  # a trace has no batch size
        "GPU utilisation",
        "GPU busy",
        "Data-wait share",
        "Peak CUDA allocated",  # the V100's, in the profiled window (the help says so)
    ]
    assert "Findings" in [s.value for s in at.subheader]
    # nothing is kept unless the user saves it
    assert not (empty_env / "uploads").exists()
    next(b for b in at.button if b.label == "Save upload").click().run()
    saved = list((empty_env / "uploads").glob("*/*"))
    assert [p.name for p in saved] == [trace.name]


@pytest.mark.slow
def test_cancel_stops_a_live_run_cleanly(empty_env):
    overrides = {**QUICK_RUN, "train.steps": 500}  # far more than it will get to run
    launched = launch.start_run(
        scenario="slow-loader", overrides=overrides, runs_dir=empty_env, device="cpu"
    )
    at = open_page("pages/1_Launch.py")  # no ?run=: the live run is found in the runs folder
    assert not at.exception
    assert any(launched.run_id in m.value for m in at.markdown)
    next(b for b in at.button if b.label == "Cancel run").click().run()
    assert (launched.run_dir / "cancel.request").exists()
    deadline = time.monotonic() + 180
    while RunFolder(launched.run_dir).status().status not in FINAL_STATES:
        assert time.monotonic() < deadline, "the trainer did not stop"
        time.sleep(0.5)
    status = RunFolder(launched.run_dir).status()
    assert status.status == "cancelled"
    assert status.step < 500  # stopped early, its records kept
    at.run()
    assert any("cancelled" in w.value for w in at.warning)


@pytest.mark.slow
def test_report_downloads_render_every_format(runs_env, shared_traces_dir):
    from app_ui import render
    from diagnostics.analyze import analyze
    from diagnostics.compare import compare

    first, second = analyze(runs_env.slow), analyze(runs_env.fixed)
    trace = analyze(shared_traces_dir / "hta_a100_alexnet_with_syncs.json.gz")
    comparison = compare(first, second)
    for fmt, opening in (("html", "<!doctype html"), ("md", "#"), ("json", "{")):
        for text in (
            render.report_text(first, fmt),
            render.report_text(trace, fmt),
            render.comparison_report_text(comparison, fmt),
        ):
            assert text.lstrip().lower().startswith(opening), (fmt, text[:80])
    assert runs_env.slow.name in render.report_text(first, "md")
    assert runs_env.fixed.name in render.comparison_report_text(comparison, "md")


@pytest.fixture
def malformed_env(empty_env):
    """Two good runs beside a run whose status.json is [1,2] and one whose run.json is."""
    for run_id in ("good-a", "good-b"):
        RunWriter.create(empty_env, {"scenario": "healthy"}, {}, run_id=run_id).finalise(
            "completed"
        )
    for run_id, name in (("bad-status", "status.json"), ("bad-manifest", "run.json")):
        writer = RunWriter.create(empty_env, {"scenario": "healthy"}, {}, run_id=run_id)
        writer.finalise("completed")
        (writer.path / name).write_text("[1, 2]")
    return empty_env


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_beside_a_malformed_run(malformed_env, page):
    at = open_page(page)
    assert not at.exception, at.exception
    assert at.title, f"{page} has no title"


def test_a_malformed_run_reads_unreadable_with_its_reason_and_the_others_stay(malformed_env):
    listings = {run.run_id: run for run in list_runs(malformed_env)}
    assert {run_id: run.status.status for run_id, run in listings.items()} == {
        "good-a": "completed",
        "good-b": "completed",
        "bad-status": "unreadable",
        "bad-manifest": "unreadable",
    }
    table = open_page("pages/2_Runs.py").dataframe[0].value
    rows = dict(zip(table["run"], table["status"], strict=True))
    assert rows == {run_id: run.status.status for run_id, run in listings.items()}
    notes = dict(zip(table["run"], table["note"], strict=True))
    assert notes["bad-status"] == (
        f"{malformed_env / 'bad-status' / 'status.json'}: unreadable (a JSON list, not an object)"
    )
    for run_id, name in (("bad-status", "status.json"), ("bad-manifest", "run.json")):
        at = open_page("pages/3_Run_detail.py", {"run": run_id})
        assert not at.exception, at.exception
        assert [shown(e.value) for e in at.error] == [
            f"{malformed_env / run_id / name}: unreadable (a JSON list, not an object)"
        ]
    # Compare's default pair is two readable runs, and picking a broken one is one line
    at = open_page("pages/5_Compare.py")
    assert not at.exception and not at.error, [e.value for e in at.error]
    at = open_page("pages/5_Compare.py", {"a": "bad-status", "b": "good-a"})
    assert not at.exception
    assert len(at.error) == 1 and "unreadable (a JSON list, not an object)" in at.error[0].value
