"""Distributed runs under torchrun: real processes, gloo on CPU (nccl when marked gpu).

Each run here is two ranks of a tiny model for a few steps: the 2-core machine runs them
in about a minute each.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from diagnostics.runs import RunFolder
from tests.conftest import (
    STRAGGLER_DELAY_MS,
    TINY_DIST_ARGS,
    run_trainer_cli,
    start_trainer_cli,
)
from trainer.data import EpochSampler
from trainer.dist_launch import aggregate

DIST_ARGS = ("--scenario", "healthy", *TINY_DIST_ARGS)
# long enough to be stopped part-way: each sample waits 15 ms, a batch of 8 then 120 ms
SLOW_ARGS = (*DIST_ARGS, "--steps", "60", "--instruments", "off", "--nproc-per-node", "2")
SLOW_ARGS += ("--set", "data.sample_latency_ms=15")


def _wait_for_steps(
    proc: subprocess.Popen[str], run_dir: Path, steps: int, timeout_s: float = 240.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.communicate()[1][-3000:]}")
        step = RunFolder(run_dir).last_step() if run_dir.is_dir() else None
        if step is not None and step >= steps:
            return
        time.sleep(0.2)
    raise AssertionError(f"{run_dir}: no step {steps} within {timeout_s} s")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _finish(proc: subprocess.Popen[str], timeout_s: float = 240.0) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, out, err


# --- the data split ----------------------------------------------------------------------


def test_sampler_shards_are_distributed_samplers_split_of_one_order():
    whole = [index for _, index in EpochSampler(103, seed=7, phase="finetune")]
    shards = [list(EpochSampler(103, 7, "finetune", rank, 3)) for rank in range(3)]
    # 103 // 3 = 34 each: the last 103 - 102 = 1 index of the order is dropped this epoch
    assert [len(s) for s in shards] == [34, 34, 34]
    for rank, shard in enumerate(shards):
        assert [index for _, index in shard] == whole[:102][rank::3]
    resumed = EpochSampler(103, 7, "finetune", 1, 3)
    resumed.set_epoch(0, start=16)  # two batches of 8 already trained on
    assert list(resumed) == shards[1][16:]
    assert len(resumed) == 34 - 16


def test_sampler_rejects_a_rank_outside_the_world():
    with pytest.raises(ValueError, match="rank 2 of 2"):
        EpochSampler(10, 0, "finetune", 2, 2)


# --- the job's status from its ranks' ------------------------------------------------------


def _status(state: str, reason: str | None = None, ended_at: float = 0.0) -> dict:
    return {"status": state, "reason": reason, "ended_at": ended_at, "step": 3}


def test_aggregate_completed_only_when_every_rank_is():
    assert aggregate({0: _status("completed"), 1: _status("completed")}, {}) == (
        "completed",
        None,
    )
    status, reason = aggregate({0: _status("completed"), 1: _status("preempted", "SIGTERM")}, {})
    assert (status, reason) == ("preempted", "SIGTERM")


def test_aggregate_blames_the_earliest_failure_not_its_echo():
    statuses = {
        0: _status("failed", "DistBackendError: Connection closed by peer", ended_at=12.0),
        1: _status("failed", "RuntimeError: out of memory", ended_at=10.0),
    }
    assert aggregate(statuses, {}) == ("failed", "rank 1: RuntimeError: out of memory")


def test_aggregate_blames_the_killed_rank_not_the_one_torchrun_stopped_after_it():
    """Seen in a full run under load: rank 1 was SIGKILLed, torchrun SIGTERMed rank 0, and
    neither wrote a status; the cause is rank 1 whichever failure torchrun timestamps first."""
    statuses = {0: None, 1: None}
    for failures in (
        {1: "killed by signal SIGKILL", 0: "killed by signal SIGTERM"},
        {0: "killed by signal SIGTERM", 1: "killed by signal SIGKILL"},
    ):
        assert aggregate(statuses, failures) == ("failed", "rank 1 died: killed by signal SIGKILL")
    # a job stopped as a whole (every rank SIGTERMed) still names the first
    both = {0: "killed by signal SIGTERM", 1: "killed by signal SIGTERM"}
    assert aggregate(statuses, both) == ("failed", "rank 0 died: killed by signal SIGTERM")


def test_aggregate_blames_a_rank_that_died_without_a_status():
    statuses = {0: _status("failed", "Connection closed by peer", ended_at=5.0), 1: None}
    failures = {1: "killed by signal SIGKILL", 0: "exit code 1"}
    assert aggregate(statuses, failures) == ("failed", "rank 1 died: killed by signal SIGKILL")


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--nproc-per-node", "2", "--nnodes", "2", "--run-id", "x"], "--rdzv-endpoint"),
        (["--nproc-per-node", "0"], "--nproc-per-node"),
        (["--nproc-per-node", "2", "--set", "data.dataset=sharded"], "data.dataset"),
        (
            ["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1", "--run-id", "x"],
            "--node-rank",
        ),
    ],
)
def test_bad_job_shapes_are_one_line_and_leave_nothing(tmp_path, extra, field):
    result = run_trainer_cli(["run", *DIST_ARGS, "--runs-dir", str(tmp_path), *extra])
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {field}:"), result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


# --- real runs -----------------------------------------------------------------------------


def _two_rank_run(
    runs_dir: Path,
    scenario: str,
    steps: int = 6,
    patch: dict | None = None,
    *,
    measured: bool = False,
) -> RunFolder:
    args = [a if a != "healthy" else scenario for a in DIST_ARGS]
    patched = ["--patch-json", json.dumps(patch)] if patch else []
    result = run_trainer_cli(
        ["run", *args, "--steps", str(steps), "--runs-dir", str(runs_dir)]
        + ["--nproc-per-node", "2", *patched],
        timeout_s=400,
        measured=measured,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return RunFolder(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def healthy_two_ranks(two_rank_runs) -> RunFolder:
    """The session's healthy 2-rank run: the same arguments as _two_rank_run's, 6 steps."""
    return RunFolder(two_rank_runs.healthy)


def _allreduces_per_profiled_step(run: RunFolder, rank: int) -> float:
    from diagnostics.trace.loader import load

    trace = next(t for t in load(run.path).traces if t.rank == rank)
    calls = trace.events.filter(pl.col("name") == "c10d::allreduce_").height
    profiled = run.rank_steps().filter((pl.col("rank") == rank) & pl.col("profiled")).height
    return calls / profiled


def test_two_processes_on_cpu(healthy_two_ranks):
    run = healthy_two_ranks
    assert run.status().status == "completed"
    info = run.manifest().extra["distributed"]
    assert (info["world_size"], info["backend"], info["nnodes"]) == (2, "gloo", 1)
    assert [(r["rank"], r["local_rank"], r["node_rank"]) for r in info["ranks"]] == [
        (0, 0, 0),
        (1, 1, 0),
    ]
    assert run.world_size() == 2
    # model.size=auto follows the resolved device for ranks too (gpu preset on CUDA)
    assert run.manifest().config["model"]["size"] == "cpu"
    steps = run.rank_steps()
    assert steps.group_by("rank").agg(pl.col("step").sort()).sort("rank")["step"].to_list() == [
        list(range(1, 7)),
        list(range(1, 7)),
    ]
    by_step = steps.pivot(on="rank", index="step", values=["grad_norm", "loss"]).sort("step")
    # DDP averaged the gradients: both ranks clip and step on the same norm...
    assert by_step["grad_norm_0"].to_list() == pytest.approx(by_step["grad_norm_1"].to_list())
    # ...of losses on different shards of the data
    assert by_step["loss_0"].to_list() != by_step["loss_1"].to_list()
    # one checkpoint set, from rank 0; each rank's own status and trace
    assert [p.name for p in run.checkpoints()] == ["step_00000004.pt", "step_00000006.pt"]
    assert {r: s["status"] for r, s in run.rank_statuses().items()} == {
        0: "completed",
        1: "completed",
    }
    names = sorted(p.name for p in run.trace_files())
    assert len(names) == 2 and ".rank0." in names[0] and ".rank1." in names[1]
    from diagnostics.trace.loader import load

    loaded = load(run.path)
    assert loaded.ranks == (0, 1)
    assert {t.metadata.rank_source for t in loaded.traces} == {"distributedInfo"}


@pytest.fixture(scope="module")
def straggler_two_ranks(two_rank_runs) -> RunFolder:
    """The session's straggler 2-rank run: the same arguments as _two_rank_run's, 6 steps."""
    return RunFolder(two_rank_runs.straggler)


def _paired_step_gaps_ms(run: RunFolder) -> dict[str, float]:
    """Rank 1 less rank 0, step by step, median over the steps: the two ranks' parts of the
    same step are paired, so a busy host slowing both alike drops out of each difference."""
    by_step = run.rank_steps().pivot(
        on="rank", index="step", values=["data_wait_ms", "compute_ms", "step_time_ms"]
    )
    return {
        # how much longer rank 1 waited for its batch
        "late": float((by_step["data_wait_ms_1"] - by_step["data_wait_ms_0"]).median()),
        # how much longer rank 0 took in forward and backward (its all-reduce included)
        "held": float((by_step["compute_ms_0"] - by_step["compute_ms_1"]).median()),
        # how far apart the two ranks' step times are
        "apart": float((by_step["step_time_ms_1"] - by_step["step_time_ms_0"]).abs().median()),
    }


def test_straggler_rank_loads_slower_and_the_other_waits_for_it(straggler_two_ranks):
    run = straggler_two_ranks
    assert run.manifest().config["distributed"]["straggler_rank"] == 1
    gaps = _paired_step_gaps_ms(run)
    # STRAGGLER_DELAY_MS a batch more in rank 1's __getitem__ (spread over the batch's 8
    # samples): a sleep, which a busy host may lengthen but never shortens
    assert run.manifest().config["distributed"]["straggler_delay_ms"] == STRAGGLER_DELAY_MS
    assert gaps["late"] >= STRAGGLER_DELAY_MS - 50.0, gaps
    # in lockstep rank 0 spends that time blocked in backward's all-reduce instead (most of
    # it: the rest of the step differs by far less than the delay) ...
    assert gaps["held"] >= 0.5 * gaps["late"], gaps
    # ... so neither rank's step is longer by it: the steps end together
    assert gaps["apart"] <= 0.25 * gaps["late"], gaps


@pytest.fixture(scope="module")
def exposed_two_ranks(tmp_path_factory) -> RunFolder:
    # raised (measured): exposed-communication fires on a share of step time, which two busy
    # loops and the other tests beside it once brought to 8.3 %, under the 10 % threshold
    return _two_rank_run(
        tmp_path_factory.mktemp("dist_exposed"), "exposed-communication", measured=True
    )


def test_exposed_communication_all_reduces_every_gradient_after_backward(
    exposed_two_ranks, healthy_two_ranks
):
    run = exposed_two_ranks
    assert run.manifest().config["distributed"]["sync"] == "after-backward"
    per_step = _allreduces_per_profiled_step(run, 0)
    bucketed = _allreduces_per_profiled_step(healthy_two_ranks, 0)
    # one call per gradient tensor (tens of them) against DDP's few 25 MB buckets
    assert per_step >= 20 and bucketed <= 5, (per_step, bucketed)
    steps = run.rank_steps().pivot(on="rank", index="step", values="grad_norm")
    # the manual average still keeps the replicas in step: the same norm on both ranks
    assert steps["0"].to_list() == pytest.approx(steps["1"].to_list())


def _allreduces_issued_after_backward(run: RunFolder, rank: int) -> list[tuple[int, int]]:
    """Per profiled step, (all-reduces started after the step's last backward op ended,
    all-reduces started before that): the order of calls on the trace, not their times."""
    from diagnostics.trace.loader import load

    events = next(t for t in load(run.path).traces if t.rank == rank).events
    steps = events.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    counts = []
    for start, dur in steps.select("ts", "dur").iter_rows():
        inside = events.filter((pl.col("ts") >= start) & (pl.col("ts") < start + dur))
        backward = inside.filter(pl.col("name").str.starts_with("autograd::engine::evaluate_"))
        if backward.is_empty():
            continue
        backward_end = (backward["ts"] + backward["dur"]).max()
        calls = inside.filter(pl.col("name") == "c10d::allreduce_")["ts"]
        counts.append((int((calls >= backward_end).sum()), int((calls < backward_end).sum())))
    return counts


def test_exposed_communication_fires_and_its_patch_brings_back_overlap(exposed_two_ranks, tmp_path):
    from diagnostics.analyze import analyze

    before = analyze(exposed_two_ranks.path)
    found = next(f for f in before.findings if f.rule == "exposed-communication")
    assert found.fix.config_patch == {"distributed.sync": "overlap"}
    fixed = _two_rank_run(tmp_path, "exposed-communication", patch=found.fix.config_patch)
    assert fixed.manifest().config["distributed"]["sync"] == "overlap"
    # Overlap is an order of calls, which a busy host cannot change: unpatched, each of the
    # tens of gradients is all-reduced after backward has ended (the one call before it is
    # the ranks' stop-flag agreement); patched, DDP issues every bucket while backward runs.
    unpatched = _allreduces_issued_after_backward(exposed_two_ranks, 0)
    patched = _allreduces_issued_after_backward(fixed, 0)
    assert unpatched and all(after >= 20 and during <= 1 for after, during in unpatched), unpatched
    assert patched and all(after == 0 and during >= 2 for after, during in patched), patched
    # What the analyser reads of it is that structure too, not a share of time: on this 2-core
    # CPU the gloo threads and four ranks' compute share two cores, so how much of the step
    # stays exposed after the fix is the host's load to say (CI measured the patched run at
    # 42.3 % exposed against the unpatched 33.4 %, an idle host 11.9 % against 41.6 %).
    # Unpatched, no collective is in flight while the loop computes, and there is one per
    # gradient; patched, DDP's few buckets (its 1 MB first bucket, then 25 MB ones).
    comms_before = before.facts.comms
    comms_after = analyze(fixed.path).facts.comms
    assert comms_before.overlap_pct == 0.0, comms_before.overlap_pct
    per_step_before = comms_before.collectives_count / comms_before.per_step.height
    per_step_after = comms_after.collectives_count / comms_after.per_step.height
    assert per_step_before >= 20 and per_step_after <= per_step_before / 5, (
        per_step_before,
        per_step_after,
    )


def _stragglers(result) -> list:
    return [f for f in result.findings if f.rule == "rank-stragglers"]


def test_straggler_fires_naming_the_rank_and_its_cause_and_the_fix_removes_it(
    straggler_two_ranks, tmp_path
):
    from diagnostics.analyze import analyze

    (found,) = _stragglers(analyze(straggler_two_ranks.path))
    evidence = found.evidence
    # in lockstep both ranks' step times are equal: the late starts give rank 1 away
    assert evidence["slowest_rank"] == 1 and evidence["straggler_ranks"] == [1]
    assert evidence["cause"] == "data wait", evidence
    assert evidence["caused_wait_share_pct"] >= 75.0, evidence
    # rank 0 waits in the all-reduce about as long as rank 1 was late with its batch, as
    # the same run's step records measure it (the sleep plus what the load added)
    late_ms = _paired_step_gaps_ms(straggler_two_ranks)["late"]
    assert 0.6 * late_ms <= evidence["excess_ms_per_step"] <= 1.4 * late_ms, (evidence, late_ms)
    assert found.fix.config_patch == {"distributed.straggler_delay_ms": 0.0}
    fixed = _two_rank_run(tmp_path, "straggler", patch=found.fix.config_patch, measured=True)
    assert fixed.manifest().config["distributed"]["straggler_delay_ms"] == 0.0
    # Two ranks sharing two cores (and rank 0 checkpointing every 2 steps here) can still
    # keep one waiting for the other a little; the data straggler itself must be gone.
    for after in _stragglers(analyze(fixed.path)):
        assert after.evidence["cause"] != "data wait", after.title
        assert after.evidence["excess_ms_per_step"] < 0.5 * evidence["excess_ms_per_step"]


def test_distributed_scenarios_need_two_ranks(tmp_path):
    result = run_trainer_cli(["run", "--scenario", "straggler", "--runs-dir", str(tmp_path)])
    assert result.returncode == 2
    assert result.stderr.startswith("error: --scenario: straggler needs two or more ranks")
    assert list(tmp_path.iterdir()) == []


def test_cancel_stops_every_rank_at_one_step_and_resume_finishes(tmp_path):
    proc = start_trainer_cli(["run", *SLOW_ARGS, "--steps", "12", "--runs-dir", str(tmp_path)])
    run_dir = None
    deadline = time.monotonic() + 120
    while run_dir is None and time.monotonic() < deadline:
        found = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
        run_dir = found[0] if found else None
        time.sleep(0.2)
    assert run_dir is not None, "no run folder"
    _wait_for_steps(proc, run_dir, 3)
    (run_dir / "cancel.request").touch()
    code, _, err = _finish(proc)
    assert code == 0, err[-3000:]
    run = RunFolder(run_dir)
    assert run.status().status == "cancelled"
    ends = {r: (s["status"], s["step"]) for r, s in run.rank_statuses().items()}
    stopped_at = ends[0][1]
    assert 3 <= stopped_at < 12
    assert ends == {0: ("cancelled", stopped_at), 1: ("cancelled", stopped_at)}
    assert run.checkpoints()[-1].name == f"step_{stopped_at:08d}.pt"

    result = run_trainer_cli(["resume", str(run_dir)], timeout_s=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert run.status().status == "completed"
    steps = run.rank_steps()
    for rank in (0, 1):
        assert sorted(steps.filter(pl.col("rank") == rank)["step"].to_list()) == list(range(1, 13))
    assert run.world_size() == 2


def test_sigterm_preempts_every_rank_with_a_checkpoint(tmp_path):
    run_id = "preempted-job"
    proc = start_trainer_cli(["run", *SLOW_ARGS, "--runs-dir", str(tmp_path), "--run-id", run_id])
    run_dir = tmp_path / run_id
    _wait_for_steps(proc, run_dir, 2)
    proc.send_signal(signal.SIGTERM)
    code, _, err = _finish(proc)
    assert code == 0, err[-3000:]
    run = RunFolder(run_dir)
    status = run.status()
    assert status.status == "preempted", status
    assert "SIGTERM" in (status.reason or "")
    ends = {r: (s["status"], s["step"]) for r, s in run.rank_statuses().items()}
    step = ends[0][1]
    assert ends == {0: ("preempted", step), 1: ("preempted", step)}
    assert 2 <= step < 60
    assert run.checkpoints()[-1].name == f"step_{step:08d}.pt"


def test_the_runtime_budget_stops_every_rank_at_one_step(tmp_path):
    budget = ["--set", "train.max_runtime_s=6", "--run-id", "budget"]
    result = run_trainer_cli(
        ["run", *SLOW_ARGS, "--runs-dir", str(tmp_path), *budget], timeout_s=400
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = RunFolder(tmp_path / "budget")
    status = run.status()
    assert status.status == "cancelled" and "max_runtime_s" in (status.reason or "")
    ends = {r: (s["status"], s["step"]) for r, s in run.rank_statuses().items()}
    step = ends[0][1]
    assert ends == {0: ("cancelled", step), 1: ("cancelled", step)}
    assert 0 < step < 60  # 60 steps of >= 120 ms data wait each cannot fit in 6 s
    assert run.checkpoints()[-1].name == f"step_{step:08d}.pt"


def test_a_rank_that_dies_fails_the_run_with_its_reason(tmp_path):
    run_id = "rank-dies"
    proc = start_trainer_cli(["run", *SLOW_ARGS, "--runs-dir", str(tmp_path), "--run-id", run_id])
    run_dir = tmp_path / run_id
    _wait_for_steps(proc, run_dir, 2)
    ranks = RunFolder(run_dir).manifest().extra["distributed"]["ranks"]
    victim = next(r["pid"] for r in ranks if r["rank"] == 1)
    os.kill(victim, signal.SIGKILL)
    code, out, err = _finish(proc)
    assert code == 1, err[-3000:]
    status = RunFolder(run_dir).status()
    assert status.status == "failed"
    assert status.reason == "rank 1 died: killed by signal SIGKILL", status.reason
    assert out.strip().splitlines()[-1] == str(run_dir)


def test_two_nodes_meet_on_loopback(tmp_path):
    endpoint = f"127.0.0.1:{_free_port()}"
    common = [*DIST_ARGS, "--steps", "4", "--instruments", "off", "--runs-dir", str(tmp_path)]
    common += ["--run-id", "two-nodes", "--nproc-per-node", "1", "--nnodes", "2"]
    common += ["--rdzv-endpoint", endpoint]
    node1 = start_trainer_cli(["run", *common, "--node-rank", "1"])
    node0 = start_trainer_cli(["run", *common, "--node-rank", "0"])
    code0, out0, err0 = _finish(node0, 400)
    code1, out1, err1 = _finish(node1, 400)
    assert (code0, code1) == (0, 0), (err0[-2000:], err1[-2000:])
    run = RunFolder(tmp_path / "two-nodes")
    assert out0.strip().splitlines()[-1] == out1.strip().splitlines()[-1] == str(run.path)
    assert run.status().status == "completed"
    info = run.manifest().extra["distributed"]
    assert info["nnodes"] == 2 and info["world_size"] == 2
    assert [(r["rank"], r["local_rank"], r["node_rank"]) for r in info["ranks"]] == [
        (0, 0, 0),
        (1, 0, 1),
    ]
    steps = run.rank_steps()
    assert steps.group_by("rank").len().sort("rank")["len"].to_list() == [4, 4]


@pytest.mark.gpu
def test_nccl_ranks_on_cuda(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    nproc = min(2, torch.cuda.device_count())
    args = ["cuda" if a == "cpu" else a for a in DIST_ARGS]
    result = run_trainer_cli(
        ["run", *args, "--steps", "6", "--runs-dir", str(tmp_path), "--nproc-per-node", str(nproc)],
        timeout_s=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = RunFolder(result.stdout.strip().splitlines()[-1])
    assert run.status().status == "completed"
    info = run.manifest().extra["distributed"]
    assert info["backend"] == "nccl" and info["world_size"] == nproc
    assert json.loads((run.path / "status.rank0.json").read_text())["status"] == "completed"
    assert run.rank_steps().group_by("rank").len()["len"].to_list() == [6] * nproc


# --- the app's launcher ---------------------------------------------------------------------


def test_job_arguments_for_the_form():
    from trainer.launch import job_arguments

    assert job_arguments(1, 1) == []
    assert job_arguments(2) == ["--nproc-per-node", "2"]
    assert job_arguments(4, 2, "10.0.0.1:29500") == [
        "--nproc-per-node",
        "4",
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--rdzv-endpoint",
        "10.0.0.1:29500",
    ]
    with pytest.raises(ValueError, match="HOST:PORT"):
        job_arguments(1, 2, "")


def test_other_node_command_is_node_zeros_with_its_own_rank():
    from trainer.launch import other_node_command

    command = [sys.executable, "-m", "trainer", "run", "--run-id", "job 1", "--node-rank", "0"]
    assert other_node_command(command, 1) == (
        "python -m trainer run --run-id 'job 1' --node-rank 1"
    )


def test_start_run_launches_a_two_process_job(tmp_path):
    from trainer.launch import start_run

    overrides = {"data.rows": 240, "train.pretrain_steps": 0, "train.batch_size": 8}
    overrides |= {"data.num_workers": 0}
    launched = start_run(
        scenario="healthy",
        overrides=overrides,
        runs_dir=tmp_path,
        steps=4,
        device="cpu",
        instruments=False,
        nproc_per_node=2,
        timeout_s=240,
    )
    assert launched.command[-2:] == ("--nproc-per-node", "2")
    run = RunFolder(launched.run_dir)
    deadline = time.monotonic() + 300
    while not run.status().is_final and time.monotonic() < deadline:
        time.sleep(0.5)
    assert run.status().status == "completed", run.log_tail()
    assert run.world_size() == 2
    assert run.rank_steps().group_by("rank").len()["len"].to_list() == [4, 4]


def test_start_run_refuses_a_distributed_scenario_on_one_process(tmp_path):
    from trainer.launch import start_run

    with pytest.raises(ValueError, match="straggler needs two or more processes"):
        start_run(scenario="straggler", overrides={}, runs_dir=tmp_path, device="cpu")
    assert not any(tmp_path.iterdir())
