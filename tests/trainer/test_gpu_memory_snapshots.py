"""Memory snapshots recorded on CUDA by the reference trainer and the script wrapper, read
back and analysed: a healthy run's window, the leak scenario's leaking line, and a forced
out-of-memory error (the trainer at a batch no device holds; the wrapper at a 1 PiB
request). Needs CUDA: skipped elsewhere; ``scripts/gpu_check.sh`` runs them. Not run yet:
no GPU was lent to the session that wrote them (the CPU side is
tests/trainer/test_memory_snapshots.py and tests/probe/test_memory_snapshots.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from diagnostics.analyze import analyze
from diagnostics.runs import RunFolder
from tests.conftest import run_trainer_cli
from tests.probe.helpers import SCRIPTS, line_of, profile, run_folder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# 2 masked-LM steps, then fine-tuning; history over steps 3..6, dumps after 3 and 6
ARGS = [
    "--device",
    "cuda",
    "--steps",
    "6",
    "--set",
    "data.rows=600",
    "--set",
    "train.pretrain_steps=2",
    "--set",
    "profiler.enabled=false",
    "--memory-snapshots",
    "4",
    "--set",
    "instruments.memory_snapshot_start=3",
]


def _trainer_run(tmp_path_factory, name, *extra, expect=0):
    runs = tmp_path_factory.mktemp(name)
    done = run_trainer_cli(["run", "--runs-dir", str(runs), *ARGS, *extra], timeout_s=600)
    assert done.returncode == expect, done.stderr[-3000:]
    return RunFolder(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return _trainer_run(tmp_path_factory, "healthy")


@pytest.fixture(scope="module")
def leak(tmp_path_factory):
    return _trainer_run(tmp_path_factory, "leak", "--scenario", "leak")


def test_a_healthy_window_writes_two_snapshots_and_no_leak(healthy):
    assert [p.name for p in healthy.snapshot_files()] == [
        "step_00000003.pickle",
        "step_00000006.pickle",
    ]
    assert all(p.read_bytes()[:2] == b"\x80\x04" for p in healthy.snapshot_files())
    result = analyze(healthy.path)
    facts = result.snapshot
    assert facts is not None and facts.peak is not None
    assert facts.dump.active_bytes > 0 and facts.dump.reserved_bytes >= facts.dump.active_bytes
    assert "memory-leak-by-site" not in {f.rule for f in result.findings}
    marks = healthy.steps().select("step", "marks").to_dicts()
    with_history = [r["step"] for r in marks if "memory_history" in (r["marks"] or "")]
    assert with_history == [3, 4, 5, 6]


def test_the_leak_scenario_names_a_leaking_line_of_the_trainer(leak):
    result = analyze(leak.path)
    assert result.snapshot_growth is not None and result.snapshot_growth.same_phase
    found = [f for f in result.findings if f.rule == "memory-leak-by-site"]
    assert found, [f.rule for f in result.findings]
    # the leak keeps each step's batch (loop.py's copy to the device) and its encoder
    # output and graph (model.py): the site named is one of the trainer's own lines
    assert re.search(r"(loop|model)\.py:\d+", found[0].title), found[0].title


def test_a_batch_no_device_holds_fails_with_its_snapshot(tmp_path_factory):
    # ~26 kB of saved activations per token and layer (bf16 BERT): 8192 x 256 tokens x 6
    # layers is ~330 GB, beyond any single device
    run = _trainer_run(
        tmp_path_factory,
        "oom",
        "--set",
        "data.rows=12000",
        "--set",
        "train.batch_size=8192",
        "--set",
        "data.max_length=256",
        "--set",
        "instruments.memory_snapshot_start=1",
        expect=1,
    )
    status = json.loads((run.path / "status.json").read_text())
    oom = run.snapshot_path(1, oom=True)
    assert status["status"] == "failed"
    assert status["reason"] == f"out of memory at step 1: snapshot in {oom}"
    result = analyze(run.path)
    assert result.snapshot is not None and result.snapshot.oom is not None
    assert "out-of-memory-cause" in {f.rule for f in result.findings}


def test_the_wrapper_dumps_a_scripts_out_of_memory_error_naming_the_line(tmp_path):
    script = SCRIPTS / "leak_then_oom.py"
    done = profile(
        tmp_path / "runs", "--no-trace", "--memory-snapshots", "3", str(script), "--oom-at", "4"
    )
    assert done.returncode == 1, done.stderr[-3000:]
    run = RunFolder(run_folder(done))
    oom = run.snapshot_path(4, oom=True)
    status = json.loads((run.path / "status.json").read_text())
    assert status["reason"] == f"out of memory at step 4: snapshot in {oom}"
    assert [p.name for p in run.snapshot_files()] == ["step_00000002.pickle", oom.name]
    result = analyze(run.path)
    cause = [f for f in result.findings if f.rule == "out-of-memory-cause"]
    assert cause, [f.rule for f in result.findings]
    # the 1 PiB request failed while the leak (4 x 8 MiB) held the most
    text = cause[0].title + json.dumps(cause[0].to_dict()["evidence"], default=str)
    assert f"leak_then_oom.py:{line_of(script, '# LEAK')}" in text
