from __future__ import annotations

import pytest

from diagnostics.chart import Chart
from diagnostics.rules.base import Severity
from tests.diagnostics.report import fakes
from tests.diagnostics.report.fakes import BREAKOUT, HOSTILE, PIPED


@pytest.fixture
def run_data(tmp_path):
    samples = [
        {
            "wall_time": 1000.0 + t * 0.5,
            "cpu_percent": 150.0,
            "workers_rss_bytes": 10 << 20,
            "gpu_index": 0,
            "gpu_util_pct": 40.0,
        }
        for t in range(6)
    ]
    return fakes.write_run(
        tmp_path,
        run_id="run-1",
        steps=fakes.steps_records(12, data_wait_ms=40.0),
        samples=samples,
        config={
            "scenario": "slow-loader",
            "data": {"rows": 1000, "num_workers": 0},
            "train": {"batch_size": 8},
        },
        environment={
            "device": "cuda",
            "pytorch_version": "2.9.0",
            "gpu_name": "NVIDIA H100 80GB HBM3",
            "cpu_count": 2,
        },
    )


@pytest.fixture
def mixed_findings():
    """Given out of order on purpose: low first, high last."""
    chart = Chart(
        kind="line",
        title="Data wait per step",
        x_label="step",
        y_label="time (ms)",
        x=(1, 2, 3),
        series={"data wait (ms)": (40.0, 41.0, 39.0)},
        highlight_x=(2,),
    )
    return (
        fakes.finding("small-batch", Severity.LOW, 5.0, patch={"train.batch_size": 64}),
        fakes.finding("missing-pin-memory", Severity.MEDIUM, 8.0),
        fakes.finding("too-few-workers", Severity.HIGH, 10.0),
        fakes.finding(
            "slow-data",
            Severity.HIGH,
            35.0,
            evidence={"data_wait_ms": 40.0, "data_wait_pct": 40.0, "chart": chart},
            patch={"data.num_workers": 4, "data.persistent_workers": True},
        ),
    )


@pytest.fixture
def run_result(run_data, mixed_findings):
    return fakes.run_result(run_data, mixed_findings)


@pytest.fixture
def hostile_result(tmp_path):
    """Markup and script in every string a trace or a run can carry into a report."""
    config = {
        "scenario": HOSTILE,
        "data": {"rows": 100, "dataset": BREAKOUT},
        "train": {"batch_size": 4},
        HOSTILE: BREAKOUT,
        PIPED: PIPED,
    }
    run = fakes.write_run(
        tmp_path,
        run_id="hostile-run",
        steps=fakes.steps_records(5, data_wait_ms=10.0),
        config=config,
        environment={
            "device": "cuda",
            "gpu_name": HOSTILE,
            "pytorch_version": BREAKOUT,
            "hostname": PIPED,
        },
    )
    chart = Chart(
        kind="bar",
        title=HOSTILE,
        x_label=BREAKOUT,
        y_label="time (ms)",
        x=(HOSTILE, BREAKOUT),
        series={HOSTILE: (1.0, 2.0)},
    )
    bad = fakes.finding(
        "host-device-sync",
        Severity.HIGH,
        12.0,
        title=f"Sync in {HOSTILE} {PIPED}",
        evidence={
            "op": HOSTILE,
            "file": BREAKOUT,
            "names": [HOSTILE, PIPED],
            PIPED: PIPED,
            "chart": chart,
        },
        code=f"# {BREAKOUT}\nx = '{HOSTILE}'",
        patch={"data.dataset": BREAKOUT},
    )
    return fakes.HandResult(
        source={
            "kind": "run",
            "path": str(run.folder.path),
            "files": [f"{HOSTILE}.pt.trace.json"],
            "ranks": [0],
        },
        summary={"device": "cuda", "steps": 5, "breakdown_pct": {HOSTILE: 1.0, PIPED: 2.0}},
        facts=fakes.trace_facts(op_name=HOSTILE, kernel_name=BREAKOUT),
        run=run,
        findings=(bad,),
        warnings=(f"odd event {HOSTILE}",),
        environment=dict(run.environment),
    )


@pytest.fixture
def hostile_trace_file(tmp_path):
    """A small, valid Kineto trace whose file, operator, kernel and GPU names are markup."""
    import json

    events = []
    for step in range(3):
        start = step * 10_000
        events += [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step + 1}",
                "pid": 1,
                "tid": 1,
                "ts": start,
                "dur": 9000,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": HOSTILE,
                "pid": 1,
                "tid": 1,
                "ts": start + 100,
                "dur": 3000,
            },
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": start + 200,
                "dur": 20,
                "args": {"correlation": step + 1},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": BREAKOUT,
                "pid": 0,
                "tid": 7,
                "ts": start + 300,
                "dur": 2000,
                "args": {"correlation": step + 1, "device": 0, "stream": 7},
            },
        ]
    document = {
        "schemaVersion": 1,
        "deviceProperties": [
            {
                "id": 0,
                "name": HOSTILE,
                "totalGlobalMem": 1 << 34,
                "computeMajor": 8,
                "computeMinor": 0,
            }
        ],
        "traceEvents": events,
    }
    # "/" cannot be in a file name, so the file name carries an attribute-based payload.
    path = tmp_path / "<img src=x onerror=alert(1)>.json"
    path.write_text(json.dumps(document))
    return path
