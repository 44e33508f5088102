"""The reference trainer with memory snapshots asked for, on CPU: the run's note, and the
recorder's window and out-of-memory path inside a real training loop (the recorder given
plain functions for torch's three CUDA calls, as tests/probe/test_memory_snapshots.py does;
a real step that raises ``torch.cuda.OutOfMemoryError`` at step 3)."""

from __future__ import annotations

import pytest
import torch

from diagnostics.runs import RunFolder, RunWriter
from diagnostics.snapshot.examples import MIB, site_oom_snapshot, training_snapshot
from probe.memory_snapshots import (
    NEEDS_CUDA_NOTE,
    NullSnapshotRecorder,
    OutOfMemoryRecorded,
    SnapshotRecorder,
    SnapshotWindow,
)
from trainer.cli import _failure
from trainer.config import build_config
from trainer.loop import Trainer
from trainer.run_io import SafeWriter
from trainer.runtime import StopRequests

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {
    "data.rows": 300,
    "data.num_workers": 0,
    "train.batch_size": 16,
    "train.pretrain_steps": 1,
    "profiler.enabled": False,  # the instruments stay on (snapshots are one), the trace off
    "instruments.memory_snapshot_steps": 3,
    "instruments.memory_snapshot_start": 2,
}


def _trainer(tmp_path, steps):
    config = build_config("healthy", SMALL, steps=steps, device="cpu")
    writer = SafeWriter(RunWriter.create(tmp_path, config.to_dict(), {"device": "cpu"}))
    trainer = Trainer(
        config, writer, device="cpu", cache_dir=tmp_path / "cache", stop=StopRequests()
    )
    return trainer, writer.path


def _fake_recorder(run_dir, dumps: list[str]):
    def take_snapshot():
        dumps.append("dump")
        if len(dumps) > 2:
            return site_oom_snapshot()
        return training_snapshot(steps=len(dumps), leak_bytes_per_step=8 * MIB)

    return SnapshotRecorder(
        SnapshotWindow(steps=3, start=2),
        run_dir,
        record_history=lambda **kwargs: dumps.append(f"history {kwargs.get('enabled')}"),
        take_snapshot=take_snapshot,
        synchronize=lambda: None,
    )


def test_on_cpu_no_snapshot_is_recorded_and_the_run_notes_say_why(tmp_path):
    trainer, run_dir = _trainer(tmp_path, steps=3)
    assert isinstance(trainer.snapshots, NullSnapshotRecorder)
    assert trainer.run().status == "completed"
    run = RunFolder(run_dir)
    assert NEEDS_CUDA_NOTE in run.manifest().notes
    assert run.snapshot_files() == []
    assert run.steps()["marks"].str.contains("memory_history").sum() == 0


def test_the_window_in_a_real_loop_and_an_out_of_memory_error_at_step_3(tmp_path):
    trainer, run_dir = _trainer(tmp_path, steps=6)
    log: list[str] = []
    trainer.snapshots = _fake_recorder(run_dir, log)
    real_step, calls = trainer._train_step, []

    def step_that_runs_out_at_step_3(phase, batch):
        calls.append(phase)
        if len(calls) == 3:  # 1 masked-LM step, then fine-tuning steps 2 and 3
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB.")
        return real_step(phase, batch)

    trainer._train_step = step_that_runs_out_at_step_3
    with pytest.raises(OutOfMemoryRecorded) as raised:
        trainer.run()
    run = RunFolder(run_dir)
    oom = run.snapshot_path(3, oom=True)
    # history on as step 2 began, the window's first dump after it, the OOM dump, then off
    assert log == ["history all", "dump", "dump", "history None"]
    assert [p.name for p in run.snapshot_files()] == ["step_00000002.pickle", oom.name]
    assert str(raised.value) == f"out of memory at step 3: snapshot in {oom}"
    assert isinstance(raised.value.__cause__, torch.cuda.OutOfMemoryError)
    # the run's failure reason is the message itself (trainer.cli ends the run with it)
    assert _failure(raised.value, 2) == f"out of memory at step 3: snapshot in {oom}"
    steps = run.steps()
    assert steps["step"].to_list() == [1, 2]  # the records that reached the device stay
    assert steps["marks"].to_list()[1].split(",").count("memory_history") == 1
    assert not trainer.snapshots.recording


def test_the_cost_bench_takes_the_windows_steady_intervals_and_the_dump_notes():
    import sys

    from tests.conftest import REPO_ROOT

    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from bench_snapshot_recording import dump_costs, table, window_costs

    # window 5..9: steps 7, 8 and 9 are steady (5 starts history, 6 follows the first dump)
    walls = {4: 10.0, 5: 10.5, 6: 11.5, 7: 11.6, 8: 11.72, 9: 11.8, 10: 11.9}
    device = {7: 30.0, 8: 31.0, 9: 50.0}
    got = window_costs(walls, device, start=5, window=5)
    assert got["wall_ms"] == pytest.approx(100.0)  # intervals 100, 120, 80 ms: median 100
    assert got["device_ms"] == 31.0
    notes = (
        "memory snapshots need CUDA: none recorded on this device",
        "memory snapshot step_00000005.pickle: 12.50 MiB in 0.250 s",
    )
    assert dump_costs(notes) == [("step_00000005.pickle", 12.5, 0.25)]
    rows = table(
        {
            "off": {"wall_ms": 100.0, "device_ms": 30.0, "dumps": []},
            "python": {"wall_ms": 125.0, "device_ms": 30.0, "dumps": dump_costs(notes)},
        }
    )
    assert rows[2] == "| off | 100.0 | 1.000 | 30.0 | — |"
    assert rows[3] == "| python | 125.0 | 1.250 | 30.0 | step_00000005.pickle 12.5 MiB 0.25 s |"


def test_an_out_of_memory_error_in_the_evaluation_is_dumped_and_named(tmp_path):
    trainer, run_dir = _trainer(tmp_path, steps=3)
    log: list[str] = []
    trainer.snapshots = _fake_recorder(run_dir, log)

    def evaluation_that_runs_out(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB.")

    import trainer.loop as loop

    real_evaluate = loop.evaluate
    loop.evaluate = evaluation_that_runs_out
    try:
        with pytest.raises(OutOfMemoryRecorded) as raised:
            trainer.run()
    finally:
        loop.evaluate = real_evaluate
    run = RunFolder(run_dir)
    # 1 masked-LM step and 3 fine-tuning steps trained (the window, steps 2..4, dumped
    # after its first and last), then the end-of-run evaluation ran out
    assert trainer.position.step == 4
    oom = run.snapshot_path(4, oom=True)
    assert log == ["history all", "dump", "dump", "history None", "dump"]
    assert oom.exists()
    # after the window: the allocator's state, without the stacks, and the message says so
    assert str(raised.value) == (
        f"out of memory in the evaluation after step 4: snapshot in {oom} (state only, no "
        "stacks: allocation history was recorded for steps 2..4 only)"
    )
    assert _failure(raised.value, 2) == str(raised.value)
    assert isinstance(raised.value.__cause__, torch.cuda.OutOfMemoryError)
