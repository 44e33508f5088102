"""diagnostics.views: what the pages show, checked without a browser."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from diagnostics import views
from diagnostics.chart import Chart
from diagnostics.compare import MetricRow
from diagnostics.errors import InputError
from diagnostics.metrics import KeyMetrics
from diagnostics.runs import STEP_SCHEMA, RunFolder, RunStatus, RunWriter, list_runs
from tests.app.conftest import REPO_ROOT
from trainer.config import build_config

# --- numbers for people ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value_ms", "text"),
    [
        (0.84, "840 µs"),  # under 1 ms: shown in µs, 0.84 ms * 1000
        (12.34, "12.3 ms"),
        (250.0, "250 ms"),
        (1250.0, "1.25 s"),  # 1.25 s: two decimals under 10 s, as in the reports
        (200_000.0, "3 min 20 s"),  # 200 s = 3 * 60 + 20
        (None, "—"),
        (float("nan"), "—"),
    ],
)
def test_fmt_ms(value_ms, text):
    assert views.fmt_ms(value_ms) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (512, "512 B"),
        (1536, "1.5 KiB"),  # 1536 / 1024
        (3 * 1024**3 + 512 * 1024**2, "3.5 GiB"),
        (None, "—"),
    ],
)
def test_fmt_bytes(value, text):
    assert views.fmt_bytes(value) == text


def test_fmt_other_units():
    assert views.fmt_pct(42.345) == "42.3 %"
    assert views.fmt_saving(33.6) == "34 %"
    assert views.fmt_saving(0.3) == "under 1 %"  # not "0 %": the fix still helps a little
    assert views.fmt_saving(0.5) == "under 1 %"  # format() rounds 0.5 to even: "0 %"
    assert views.fmt_ratio(2.414) == "2.41×"
    assert views.fmt_rate(1234.5, "samples/s") == "1,234 samples/s"
    assert views.fmt_rate(12.54, "steps/s") == "12.5 steps/s"
    assert views.fmt_number(1234567) == "1,234,567"
    assert views.fmt_seconds(3 * 3600 + 5 * 60) == "3 h 05 min"


def test_fmt_when_is_relative_then_absolute():
    now = 1_800_000_000.0
    assert views.fmt_when(now - 10, now) == "just now"
    assert views.fmt_when(now - 300, now) == "5 min ago"  # 300 s / 60
    assert views.fmt_when(now - 7200, now) == "2 h ago"
    assert views.fmt_when(now - 3 * 86400, now).endswith("UTC")


def test_evidence_rows_use_the_unit_in_the_key_and_skip_chart_series():
    evidence = {
        "data_wait_share_pct": 61.25,
        "median_data_wait_ms": 41.0,
        "gpu_idle_us": 2500.0,
        "num_workers": 0,
        "slope_bytes_per_step": 3 * 1024**2,
        "pin_memory": False,
        "spike_steps": [3, 4],
        "chart": Chart("line", "a", "step", "a", tuple(range(100)), {"a": tuple(range(100))}),
        "per_step_ms": list(range(50)),  # a long series: left to the chart
    }
    rows = dict(views.evidence_rows(evidence))
    assert rows == {
        "Data-wait share (%)": "61.2 %",  # 61.25 to one decimal (round half to even)
        "Median data wait": "41.0 ms",
        "GPU idle": "2.5 ms",  # 2500 µs / 1000
        "DataLoader workers now": "0",
        "Slope per step": "3.00 MiB",  # 3 * 1024**2 bytes
        "Pin memory": "false",
        "Spike steps": "3, 4",
    }


# --- runs --------------------------------------------------------------------------------


def _make_run(runs_dir: Path, scenario: str, steps: int, status: str, parent: str | None = None):
    writer = RunWriter.create(
        runs_dir,
        {"scenario": scenario, "train": {"steps": steps, "batch_size": 8}},
        {"device": "cpu"},
        run_id=f"run-{scenario}-{status}",
        parent_run_id=parent,
        total_steps=steps,
    )
    start = time.time() - steps
    for step in range(1, steps + 1):
        writer.append_step(
            {
                "step": step,
                "wall_time": start + step,
                "step_time_ms": 1000.0,
                "data_wait_ms": 600.0,
                "batch_size": 8,
            }
        )
    if status == "running":
        writer.heartbeat()
    else:
        writer.finalise(status)
    return writer.path


def test_runs_table_filter_and_links(tmp_path):
    _make_run(tmp_path, "slow-loader", 4, "completed")
    _make_run(tmp_path, "healthy", 2, "cancelled", parent="run-slow-loader-completed")
    listings = list_runs(tmp_path)
    table = views.runs_table(listings)
    assert table.height == 2
    row = table.filter(pl.col("run") == "run-healthy-cancelled").row(0, named=True)
    assert row["status"] == "cancelled"
    assert row["steps"] == "2 / 2"
    assert row["progress"] == 1.0  # 2 of 2 steps
    assert row["re-run of"] == "run-slow-loader-completed"
    assert row["open"] == "Run_detail?run=run-healthy-cancelled"

    only_done = views.filter_runs(listings, statuses=["completed"])
    assert [r.run_id for r in only_done] == ["run-slow-loader-completed"]
    only_healthy = views.filter_runs(listings, scenarios=["healthy"])
    assert [r.run_id for r in only_healthy] == ["run-healthy-cancelled"]
    assert len(views.filter_runs(listings)) == 2  # nothing chosen: everything
    assert [r.run_id for r in views.children_of(listings, "run-slow-loader-completed")] == [
        "run-healthy-cancelled"
    ]
    assert views.default_pair(listings) == ("run-slow-loader-completed", "run-healthy-cancelled")


def test_safe_run_path_rejects_escapes(tmp_path):
    path = _make_run(tmp_path, "healthy", 1, "completed")
    assert views.safe_run_path(tmp_path, path.name) == path
    for bad in ("..", "../etc", "a/b", "", "nope"):
        assert views.safe_run_path(tmp_path, bad) is None


def test_progress_rate_and_eta(tmp_path):
    run_dir = _make_run(tmp_path, "healthy", 10, "running")
    folder = RunFolder(run_dir)
    # rewrite total: 10 done of 40, one step a second (wall_time steps 1 s apart)
    status = RunStatus(**{**folder.status().__dict__, "total_steps": 40})
    progress = views.progress(status, folder.steps())
    assert progress.step == 10
    assert progress.fraction == pytest.approx(10 / 40)
    assert progress.steps_per_s == pytest.approx(1.0)  # 9 intervals over 9 s
    assert progress.eta_s == pytest.approx(30.0)  # (40 - 10) steps at 1 step/s
    assert "step 10 of 40" in progress.text and "30 s left" in progress.text


def test_progress_before_the_first_step():
    status = RunStatus(status="running", step=0, total_steps=20, started_at=time.time())
    empty = pl.DataFrame(schema=STEP_SCHEMA)
    progress = views.progress(status, empty)
    assert (progress.step, progress.fraction, progress.steps_per_s, progress.eta_s) == (
        0,
        0.0,
        None,
        None,
    )


# --- cards and comparison ----------------------------------------------------------------


def test_summary_cards_format_key_metrics():
    metrics = KeyMetrics(
        device="cpu",
        steps=10,
        median_step_time_ms=123.4,
        mean_step_time_ms=130.0,
        p95_step_time_ms=150.0,
        steps_per_s=7.7,
        samples_per_s=256.0,
        data_wait_pct=61.0,
        gpu_utilization_pct=None,
        peak_memory_bytes=512 * 1024**2,
        peak_memory_kind="host RSS",
        source="run",
        peak_memory_window="all steps",
    )
    summary = views.summary_cards(metrics)
    cards = {card.label: card.value for card in summary}
    # short labels (a card at 1280 px holds about 20 characters); the full name is the help
    assert cards == {
        "Median step time": "123 ms",
        "Samples/s": "256",
        "GPU utilisation": "—",
        "GPU busy": "—",
        "Data-wait share": "61.0 %",
        "Peak host RSS": "512 MiB",
    }
    helps = {card.label: card.help for card in summary}
    assert helps["GPU utilisation"].startswith("GPU utilisation (kernel time, as nvidia-smi): ")
    assert helps["GPU busy"].startswith("GPU busy (kernels, copies, memsets): ")
    assert helps["Peak host RSS"].startswith("Highest host RSS over all steps (the run's step ")
    assert all(len(label) <= 20 for label in cards)


@pytest.mark.parametrize(
    ("count", "rows"),
    [(1, [1]), (4, [4]), (5, [3, 2]), (6, [3, 3]), (7, [4, 3]), (8, [4, 4]), (9, [3, 3, 3])],
)
def test_cards_go_in_rows_of_at_most_four_as_even_as_they_go(count, rows):
    assert views.card_rows(count) == rows


def test_comparison_card_colours_and_ratios():
    faster = MetricRow("throughput", "throughput", "samples/s", 100.0, 241.0, "higher")
    card = views.comparison_card(faster)
    assert (card.label, card.value, card.delta, card.delta_color) == (
        "Samples/s",
        "241",
        "+141 % (2.41×)",  # 241 / 100 = 2.41, (2.41 - 1) * 100 = +141 %
        "normal",
    )
    wait = MetricRow("data_wait_pct", "data-wait share", "%", 60.0, 5.0, "lower")
    card = views.comparison_card(wait)
    assert (card.delta, card.delta_color) == ("-55.0 points", "inverse")  # 5 - 60
    table = views.comparison_table([faster, wait], "A", "B")
    assert table.get_column("B ÷ A").to_list() == ["2.41×", "0.08×"]  # 5 / 60 = 0.083
    assert table.get_column("change").to_list() == ["better", "better"]


def test_a_step_time_card_says_how_much_faster_or_slower():
    # 1.41 s -> 85.1 ms: 94 % less time, 1410 / 85.1 = 16.57x faster (not "0.06x")
    faster = MetricRow("median_step_time_ms", "median step time", "ms", 1410.0, 85.1, "lower")
    card = views.comparison_card(faster)
    assert (card.label, card.value, card.delta) == (
        "Median step time",
        "85.1 ms",
        "-94 % (16.57× faster)",
    )
    slower = views.comparison_card(
        MetricRow("median_step_time_ms", "median step time", "ms", 100.0, 125.0, "lower")
    )
    assert (slower.delta, slower.delta_color) == ("+25 % (1.25× slower)", "inverse")


def test_an_unchanged_value_has_no_arrow_or_colour():
    # 0 % -> 0 % data wait, and 100 -> 101 ms (1 %, within compare.SAME_WITHIN)
    for row in (
        MetricRow("data_wait_pct", "data-wait share", "%", 0.0, 0.0, "lower"),
        MetricRow("median_step_time_ms", "median step time", "ms", 100.0, 101.0, "lower"),
    ):
        card = views.comparison_card(row)
        assert (card.delta, card.delta_color, card.delta_arrow) == ("unchanged", "off", "off")
        assert views.comparison_table([row], "A", "B")["change"].to_list() == ["same"]
    # a real change keeps its arrow
    worse = MetricRow("median_step_time_ms", "median step time", "ms", 100.0, 120.0, "lower")
    assert views.comparison_card(worse).delta_arrow == "auto"


# --- configs and re-runs -----------------------------------------------------------------


def test_rerun_overrides_keep_the_config_and_apply_the_patch():
    config = {
        "scenario": "slow-loader",
        "data": {"num_workers": 0, "pin_memory": True},
        "train": {"steps": 12},
        "not_a_field": 1,
    }
    known = ["data.num_workers", "data.pin_memory", "train.steps"]
    overrides = views.rerun_overrides(config, {"data.num_workers": 4}, known)
    assert overrides == {"data.num_workers": 4, "data.pin_memory": True, "train.steps": 12}
    rows = views.patch_rows({"data.num_workers": 4}, config)
    assert rows.row(0) == ("data.num_workers", "0", "4")
    assert views.patch_summary({"train.grad_clip": None, "data.pin_memory": True}) == (
        "train.grad_clip = none, data.pin_memory = true"
    )


def test_form_overrides_turn_zero_clipping_into_none():
    assert views.form_overrides({"train.grad_clip": 0.0, "data.num_workers": 2}) == {
        "train.grad_clip": None,
        "data.num_workers": 2,
    }
    assert views.form_overrides({"train.grad_clip": 0.5}) == {"train.grad_clip": 0.5}


def test_form_overrides_send_only_changed_fields_so_the_size_preset_can_apply():
    # the form starts at the cpu values under "auto"; unchanged fields must not pin them,
    # or a run that finds CUDA would keep batch 32 instead of the gpu preset's 256
    preset = build_config("healthy").to_flat()
    values = {
        "device": "auto",
        "train.batch_size": 32,
        "data.num_workers": 3,
        "train.grad_clip": 1.0,
        "train.lr": float(preset["train.lr"]),
    }
    assert views.form_overrides(values, preset) == {"device": "auto", "data.num_workers": 3}
    # clipping typed as 0 differs from the preset's 1.0: sent, as null
    assert views.form_overrides({"train.grad_clip": 0.0}, preset) == {"train.grad_clip": None}
    assert views.SIZE_FIELD.key == "model.size"


# --- uploads -----------------------------------------------------------------------------


def test_safe_upload_names():
    assert views.safe_upload_name("../../etc/passwd") == "passwd"
    assert views.safe_upload_name("C:\\traces\\rank 0.json.gz") == "rank_0.json.gz"
    assert views.safe_upload_name("...") == "trace.json"
    assert views.is_trace_name("x.JSON.GZ") and not views.is_trace_name("x.gz")


def test_analyse_uploads_uses_a_temporary_copy_that_is_removed(tmp_path):
    payload = gzip.compress(json.dumps({"traceEvents": []}).encode())
    seen: dict[str, object] = {}

    def fake_analyse(paths, display_names):
        # the analyser sees the bytes, under the user's names
        seen["paths"] = list(paths)
        seen["names"] = display_names
        seen["bytes"] = [p.read_bytes() for p in paths]
        return "analysed"

    files = [("rank0.json.gz", io.BytesIO(payload)), ("rank0.json.gz", io.BytesIO(payload))]
    assert views.analyse_uploads(files, fake_analyse, temp_root=tmp_path) == "analysed"
    assert seen["names"] == ["rank0.json.gz", "rank0.json.gz"]
    assert seen["bytes"] == [payload, payload]
    assert [p.name for p in seen["paths"]] == ["rank0.json.gz", "rank0-1.json.gz"]
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone


def test_analyse_uploads_removes_the_copy_when_the_analyser_fails(tmp_path):
    def failing(paths, display_names):
        raise InputError(display_names[0], "not JSON")

    with pytest.raises(InputError, match="bad.json: not JSON"):
        views.analyse_uploads([("bad.json", io.BytesIO(b"{"))], failing, temp_root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_analyse_uploads_rejects_other_files_by_name(tmp_path):
    with pytest.raises(InputError, match=r"notes\.txt: not a trace file"):
        views.analyse_uploads([("notes.txt", io.BytesIO(b"x"))], lambda *a, **k: None, tmp_path)


def test_save_uploads_keeps_files_under_runs_uploads(tmp_path):
    folder = views.save_uploads([("my trace.json", io.BytesIO(b"{}"))], tmp_path, now=0.5)
    assert folder == tmp_path / "uploads" / "19700101-000000-500"
    assert (folder / "my_trace.json").read_bytes() == b"{}"


def test_form_error_summary_splits_field_and_other_messages():
    errors = {
        "train.batch_size": "train.batch_size: 0 is out of range",
        "model.heads": "model.heads: 5 does not divide model.hidden_size 192",
    }
    others, summary = views.form_error_summary(errors)
    assert others == ["model.heads: 5 does not divide model.hidden_size 192"]  # not in the form
    assert summary == "1 setting needs fixing: see the messages next to the fields."
    assert views.form_error_summary({}) == ([], None)


def test_analyse_uploads_caps_the_number_of_files(tmp_path):
    # one file per rank for at least 64 ranks (issue 10), then refused
    assert views.MAX_UPLOAD_FILES >= 64
    n = views.MAX_UPLOAD_FILES
    files = [(f"rank{i}.json", io.BytesIO(b"{}")) for i in range(n + 1)]
    with pytest.raises(InputError, match=rf"^{n + 1} files: too many at once; upload at most {n}"):
        views.analyse_uploads(files, lambda *a, **k: None, tmp_path)
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_views_import_neither_streamlit_nor_torch():
    code = "import sys, diagnostics.views; print(sorted({'streamlit', 'torch'} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert done.stdout.strip() == "[]"


def test_the_first_eta_waits_for_steady_steps_and_leaves_start_up_out():
    """A run's first intervals hold its start-up: a 3 s first step beside 0.1 s steps made
    the first ETA many times the time the run had left."""
    now = time.time()
    walls = [now, now + 3.0, now + 3.1]  # step 2 waited for the first batch's workers
    marks = [None, "epoch_start", None]
    status = RunStatus(status="running", step=3, total_steps=100, started_at=now - 5)

    def steps_frame(walls, marks):
        n = len(walls)
        return pl.DataFrame(
            {
                "step": list(range(1, n + 1)),
                "wall_time": walls,
                "phase": ["finetune"] * n,
                "marks": marks,
            },
            schema_overrides={name: STEP_SCHEMA[name] for name in ("step", "wall_time", "marks")},
        )

    early = views.progress(status, steps_frame(walls, marks))
    assert early.eta_s is None
    assert "estimating time left…" in early.text

    # four more steady steps of 0.1 s (one profiler step of 0.5 s among them, left out)
    walls += [now + 3.2, now + 3.7, now + 3.8, now + 3.9]
    marks += [None, "profiler_active", None, None]
    status = RunStatus(status="running", step=7, total_steps=100, started_at=now - 5)
    steady = views.progress(status, steps_frame(walls, marks))
    assert steady.eta_s == pytest.approx(93 * 0.1)
    assert "about 9.3 s left" in steady.text
    # a whole run under allocator history is marked throughout: its ETA still comes
    history = views.progress(status, steps_frame(walls, ["memory_history"] * 7))
    assert history.eta_s is not None


def test_runs_table_shows_each_runs_median_step_and_its_last_analysis_findings(tmp_path):
    from diagnostics.analyze import analyze

    slow = RunFolder(_make_run(tmp_path, "slow-loader", 6, "completed"))
    _make_run(tmp_path, "healthy", 4, "cancelled")
    listings = list_runs(tmp_path)
    figures = {run.run_id: views.run_figures(RunFolder(run.path)) for run in listings}

    # the steady steps' median (the first left out), as the Step time card says
    assert figures[slow.run_id].median_step_ms == pytest.approx(1000.0)
    assert all(f.findings is None for f in figures.values())  # nothing analysed yet
    table = views.runs_table(listings, figures=figures)
    assert table["findings"].to_list() == [views.NOT_ANALYSED] * 2
    # beside the run's name and status, so the grid shows them before it scrolls at 1400 px
    assert table.columns[:6] == [
        "run",
        "scenario",
        "status",
        "median step (ms)",
        "findings",
        "worst finding",
    ]
    assert {run.run_id for run in views.not_analysed(listings, figures)} == {
        "run-slow-loader-completed",
        "run-healthy-cancelled",
    }

    result = analyze(slow.path)
    slow.write_findings_digest(views.findings_digest(result.findings), slow.mtime_key())
    digest = views.run_figures(slow).findings
    assert digest is not None
    assert digest.rules[0] == "too-few-workers"  # 60 % of each step waits: high, first
    assert digest.total == len(result.findings)
    row = views.runs_table(list_runs(tmp_path), figures={slow.run_id: views.run_figures(slow)})
    row = row.filter(pl.col("run") == slow.run_id).row(0, named=True)
    assert row["median step (ms)"] == pytest.approx(1000.0)
    assert row["findings"] == views.findings_text(digest)
    assert row["findings"].startswith("1 high")
    assert row["worst finding"] == "too-few-workers"

    # new records make the digest stale: the table says so instead of old findings
    time.sleep(0.01)
    (slow.path / "steps.jsonl").touch()
    assert views.run_figures(slow).findings is None


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '{"counts": {"high": 1}, "rules": [], "mtime_key": 0}',
        '{"counts": {"high": -1, "medium": 0, "low": 0}, "rules": [], "mtime_key": 0}',
        "not json",
    ],
)
def test_a_findings_digest_we_did_not_write_reads_as_not_analysed(tmp_path, text):
    run = RunFolder(_make_run(tmp_path, "healthy", 3, "completed"))
    (run.path / "findings.json").write_text(text)
    assert run.findings_digest() is None
    assert views.findings_text(run.findings_digest()) == "not analysed"


def test_a_findings_digest_keeps_each_fix_and_refuses_a_malformed_one(tmp_path):
    from diagnostics.runs import DigestFix, FindingsDigest

    run = RunFolder(_make_run(tmp_path, "slow-loader", 4, "completed"))
    digest = FindingsDigest(
        counts={"high": 1, "medium": 0, "low": 0},
        rules=("too-few-workers",),
        fixes=(DigestFix("too-few-workers", {"data.num_workers": 3}, 42.5),),
    )
    run.write_findings_digest(digest, run.mtime_key())
    assert run.findings_digest() == digest

    raw = json.loads((run.path / "findings.json").read_text())
    for broken in ({"rule": 1}, {**raw["fixes"][0], "saving_pct": float("nan")}, "fix"):
        (run.path / "findings.json").write_text(json.dumps({**raw, "fixes": [broken]}))
        assert run.findings_digest() is None, broken
