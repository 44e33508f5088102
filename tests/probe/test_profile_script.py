"""``pipeline-doctor profile`` on a plain loop whose DataLoader is the bottleneck
(tests/scripts/slow_loader.py: each sample sleeps 1 ms, num_workers=0), unmodified.

One run serves most assertions (module-scoped); its expectations come from the script's own
printed output and source, and from the sleeps' lower bound, never from the probe itself.
"""

from __future__ import annotations

import hashlib
import re

import pytest

from diagnostics.analyze import analyze
from diagnostics.runs import RunFolder
from tests.probe.helpers import SLOW_LOADER, line_of, profile, run_folder

BATCH = 8
SLEEP_MS = 1.0
WRAPPER_STEPS = 12  # the wrapper stops the script here; the script itself would run 40
SCRIPT_ARGS = (
    "--steps", "40", "--batch-size", str(BATCH), "--sleep-ms", str(SLEEP_MS), "--hidden", "256",
)  # fmt: skip


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("profile") / "runs"
    result = profile(runs, "--steps", str(WRAPPER_STEPS), str(SLOW_LOADER), *SCRIPT_ARGS)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, RunFolder(run_folder(result))


def _printed(stdout: str) -> dict[int, tuple[float, float]]:
    """step -> (loss, grad norm) as the script printed them."""
    found = re.findall(r"^step (\d+) loss (\S+) grad_norm (\S+)$", stdout, re.MULTILINE)
    return {int(s): (float(loss), float(norm)) for s, loss, norm in found}


def test_the_run_completes_at_the_step_limit_and_prints_its_folder(slow_run):
    result, run = slow_run
    assert run.path.parent.name == "runs" and run.path.is_dir()
    status = run.status()
    assert (status.status, status.reason, status.step) == ("completed", None, WRAPPER_STEPS)
    assert any(f"step {WRAPPER_STEPS}" in note for note in run.manifest().notes)


def test_the_scripts_output_passes_through_and_is_kept_in_the_log(slow_run):
    result, run = slow_run
    printed = _printed(result.stdout)
    # the last step ends in its optimizer.step(), before the script prints it
    assert sorted(printed) == list(range(1, WRAPPER_STEPS))
    log = run.log_path.read_text()
    assert f"step {WRAPPER_STEPS - 1} loss" in log and "step 1 loss" in log


def test_one_record_per_optimizer_step_with_the_loss_and_grad_norm_the_script_saw(slow_run):
    result, run = slow_run
    steps = run.steps()
    assert steps["step"].to_list() == list(range(1, WRAPPER_STEPS + 1))
    printed = _printed(result.stdout)
    for row in steps.iter_rows(named=True):
        if row["step"] not in printed:  # the last one (see above)
            continue
        loss, grad_norm = printed[row["step"]]
        assert row["loss"] == pytest.approx(loss, rel=1e-4)
        assert row["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
        assert row["batch_size"] == BATCH


def test_data_wait_is_at_least_the_datasets_sleeps_and_inside_the_step(slow_run):
    _, run = slow_run
    for row in run.steps().iter_rows(named=True):
        # each batch sleeps BATCH x SLEEP_MS in __getitem__, on the training thread
        assert row["data_wait_ms"] >= BATCH * SLEEP_MS
        assert row["step_time_ms"] >= row["data_wait_ms"]
        assert row["rss_bytes"] > 0


def test_the_manifest_says_script_with_its_command_hash_and_environment(slow_run):
    _, run = slow_run
    manifest = run.manifest()
    assert manifest.kind == "script"
    script = manifest.extra["script"]
    assert script["path"] == str(SLOW_LOADER)
    assert script["sha256"] == hashlib.sha256(SLOW_LOADER.read_bytes()).hexdigest()
    assert script["args"] == list(SCRIPT_ARGS)
    assert manifest.extra["command"][:2] == ["pipeline-doctor", "profile"]
    assert manifest.environment["device"] == "cpu"
    assert manifest.environment["pytorch_version"]
    probe = manifest.extra["probe"]
    assert probe["steps_counted_by"] == "optimizer"
    assert probe["optimizers"] == [{"class": "SGD", "steps": WRAPPER_STEPS, "thread": "training"}]


def test_the_dataloader_is_recorded_with_its_line_and_arguments(slow_run):
    _, run = slow_run
    (loader,) = run.dataloaders()
    line = line_of(SLOW_LOADER, "loader = DataLoader(")
    assert (loader.site, loader.file, loader.line) == (
        f"slow_loader.py:{line}",
        str(SLOW_LOADER),
        line,
    )
    assert loader.code.startswith("loader = DataLoader(") and loader.code.endswith(")")
    assert (loader.batch_size, loader.num_workers, loader.pin_memory) == (BATCH, 0, False)
    assert loader.dataset_class == "SleepyDataset"
    assert loader.batches == WRAPPER_STEPS
    # the sleeps are not the training thread's CPU time: most of the wait is not CPU
    assert loader.wait_ms >= WRAPPER_STEPS * BATCH * SLEEP_MS
    assert loader.wait_cpu_ms < loader.wait_ms


def test_the_profiler_window_covers_steps_three_to_five(slow_run):
    _, run = slow_run
    assert len(run.trace_files()) == 1
    profiled = run.steps().filter(run.steps()["profiled"])["step"].to_list()
    assert profiled == [3, 4, 5]  # default window: wait 1, warmup 1, active 3


def test_too_few_workers_names_the_line_and_the_call_and_a_patch_in_override_keys(slow_run):
    _, run = slow_run
    result = analyze(run.path)
    (finding,) = [f for f in result.findings if f.rule == "too-few-workers"]
    line = line_of(SLOW_LOADER, "loader = DataLoader(")
    assert finding.recommendation.startswith(
        f"slow_loader.py:{line} builds DataLoader(batch_size={BATCH}, num_workers=0, "
        "pin_memory=False)."
    )
    workers = finding.evidence["recommended_num_workers"]
    assert workers >= 1
    assert finding.fix.config_patch == {"dataloader.num_workers": workers}
    assert f"num_workers={workers}," in finding.fix.code
    assert "persistent_workers=True" in finding.fix.code
    assert finding.evidence["rerun_command"] == (
        f"pipeline-doctor profile --runs-dir {run.path.resolve().parent} "
        f"--parent-run-id {run.run_id} --steps {WRAPPER_STEPS} "
        f"--override dataloader.num_workers={workers} {SLOW_LOADER} {' '.join(SCRIPT_ARGS)}"
    )
    skipped = {s.rule: s.reason for s in result.skipped}
    assert skipped["worker-restarts"].startswith("a script run:")
