"""The instruments on their own and in a run: profiler window, sampler, memory lines, off."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import polars as pl
import pytest
import torch

from diagnostics.runs import MEMORY_LINE_SCHEMA, RunFolder
from probe.profiler import NullProfiler, TrainingProfiler, make_profiler
from probe.system import NullSampler, SystemSampler, child_pids, make_sampler
from tests.conftest import REPO_ROOT, TINY_RUN_ARGS
from trainer.config import ProfilerConfig
from trainer.loop import MEMORY_LINES_PROBE_SAMPLES


def _profile_steps(tmp_path, config, steps):
    profiler = TrainingProfiler(config, tmp_path, cuda=False, worker_name="w")
    recording = []
    profiler.start()
    x = torch.randn(32, 32)
    for _ in range(steps):
        recording.append(profiler.recording)
        (x @ x).sum()
        profiler.step()
    profiler.stop()
    return recording, sorted(p.name for p in tmp_path.iterdir())


def test_profiler_records_the_scheduled_window_then_stops(tmp_path):
    recording, files = _profile_steps(tmp_path, ProfilerConfig(), steps=8)
    # wait=1, warmup=1, active=3, repeat=1: steps 3-5 of 8 (1-based), then nothing
    assert recording == [False, False, True, True, True, False, False, False]
    assert len(files) == 1 and files[0].endswith(".pt.trace.json.gz")


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")
def test_profiler_repeat_writes_one_trace_per_cycle(tmp_path):
    config = ProfilerConfig(wait=0, warmup=1, active=1, repeat=2)
    recording, files = _profile_steps(tmp_path, config, steps=6)
    assert recording == [False, True, False, True, False, False]
    assert len(files) == 2


def test_no_op_variants_when_disabled(tmp_path):
    assert (
        type(make_profiler(ProfilerConfig(), tmp_path, enabled=False, cuda=False, worker_name="w"))
        is NullProfiler
    )
    assert (
        type(
            make_profiler(
                ProfilerConfig(enabled=False), tmp_path, enabled=True, cuda=False, worker_name="w"
            )
        )
        is NullProfiler
    )
    assert type(make_sampler(print, print, enabled=False, sample_hz=10)) is NullSampler


def test_child_pids_sees_a_child_process():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in child_pids(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_sampler_records_host_and_children_at_its_rate():
    rows, notes = [], []
    # a child that holds ~50 MiB, like a DataLoader worker holding batches
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; b = bytearray(50 * 2**20); time.sleep(30)"]
    )
    time.sleep(0.5)  # let it allocate
    sampler = SystemSampler(rows.append, notes.append, sample_hz=20.0)
    try:
        sampler.start()
        time.sleep(1.0)
        sampler.stop()
    finally:
        child.kill()
        child.wait()
    frame = pl.DataFrame(rows)
    # 20 Hz for 1 s: about 20 ticks; a loaded machine may deliver fewer, never many more
    assert 5 <= sampler.samples_taken <= 22
    assert frame["wall_time"].is_sorted()
    assert (frame["worker_count"] >= 1).all()
    assert (frame["workers_rss_bytes"] >= 50 * 2**20).all()
    assert (frame["trainer_rss_bytes"] > 0).all()
    if frame["gpu_index"].null_count():
        # no NVML here: said once, not once per tick
        assert len([n for n in notes if n.startswith("NVML unavailable")]) == 1


def _cli(runs_dir, *extra):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer",
            "run",
            *TINY_RUN_ARGS,
            "--runs-dir",
            str(runs_dir),
            *extra,
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def special_runs(tmp_path_factory):
    """A run with --memory-lines and one with --instruments off, side by side."""
    procs = {
        "memory": _cli(tmp_path_factory.mktemp("memory"), "--memory-lines"),
        "off": _cli(tmp_path_factory.mktemp("off"), "--instruments", "off"),
    }
    runs = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        runs[name] = RunFolder(out.strip().splitlines()[-1])
    return runs


@pytest.mark.slow
def test_memory_lines_cover_the_training_step_and_getitem(special_runs):
    lines = special_runs["memory"].memory_lines()
    assert lines is not None
    assert lines.columns == list(MEMORY_LINE_SCHEMA)
    assert set(lines["function"]) == {"Trainer._train_step_impl", "TransactionDataset.__getitem__"}

    def occurrences(function, source):
        rows = lines.filter(
            (pl.col("function") == function) & pl.col("source").str.contains(source, literal=True)
        )
        return rows["occurrences"].to_list()

    # a straight-line statement of the step function runs once per step: 2 pre-training
    # + 8 fine-tuning (lines inside comprehensions count once per item instead)
    assert occurrences("Trainer._train_step_impl", 'self.clock.mark("start")') == [10]
    # __getitem__ is probed in the training process on the first samples
    assert occurrences("TransactionDataset.__getitem__", "if self.sample_latency_s:") == [
        MEMORY_LINES_PROBE_SAMPLES
    ]
    assert (lines["mem_usage_mib"] > 0).all()


@pytest.mark.slow
def test_instruments_off_keeps_step_records_only(special_runs):
    run = special_runs["off"]
    assert run.status().status == "completed"
    assert run.steps().height == 10
    assert not run.steps()["profiled"].any()
    assert run.trace_files() == []
    assert run.samples().height == 0
    assert run.memory_lines() is None
