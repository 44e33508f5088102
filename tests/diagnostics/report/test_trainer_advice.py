"""Trainer advice only for trainer runs: an uploaded trace is someone else's job, so its
findings give code for the user's own training script, never `python -m trainer run --set`
or a "config patch for the reference trainer"; a run of the trainer keeps its patch."""

from __future__ import annotations

import json
from pathlib import Path

from diagnostics.analyze import analyze
from diagnostics.report.html import render_html
from diagnostics.report.json_report import render_json
from diagnostics.report.markdown import render_markdown
from diagnostics.report.model import build_report
from tests.diagnostics.report import fakes

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
TRAINER_WORDS = ("python -m trainer", "--set ", "reference trainer", "Config patch")


def _reports(result) -> dict[str, str]:
    report = build_report(result)
    return {
        "html": render_html(report),
        "md": render_markdown(report),
        "json": render_json(report),
    }


def test_an_uploaded_trace_gets_code_for_its_own_script():
    # ResNet-50 with num_workers=0: too-few-workers and missing-pin-memory fire
    result = analyze(TRACES / "kineto_resnet50_num_workers_0.pt.trace.json.gz")
    assert not result.is_run_folder
    workers = next(f for f in result.findings if f.rule == "too-few-workers")
    assert "DataLoader(" in workers.fix.code and "num_workers=1" in workers.fix.code
    assert all(f.fix.config_patch is None for f in result.findings)
    for name, text in _reports(result).items():
        for words in TRAINER_WORDS:
            assert words not in text, f"{name} report offers trainer advice: {words!r}"
    doc = json.loads(_reports(result)["json"])
    assert all(f["set_args"] == [] for f in doc["report"]["findings"])


def test_a_trainer_run_keeps_its_config_patch(tmp_path):
    # 90 ms of a 150 ms step waits for a single-process loader
    run = fakes.write_run(
        tmp_path,
        run_id="slow",
        steps=fakes.steps_records(8, data_wait_ms=90.0),
        config={
            "scenario": "slow-loader",
            "data": {"rows": 64, "num_workers": 0},
            "train": {"batch_size": 8},
        },
    )
    result = analyze(run.folder.path)
    assert result.is_run_folder
    workers = next(f for f in result.findings if f.rule == "too-few-workers")
    assert workers.fix.config_patch and workers.fix.config_patch["data.num_workers"] > 0
    reports = _reports(result)
    assert "python -m trainer run" in reports["md"] and "data.num_workers=" in reports["md"]
    assert "Config patch" in reports["html"]
