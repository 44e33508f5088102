"""The memory-snapshot recorder on CPU: its window and dumps, and the out-of-memory path,
with torch's three functions passed in as plain functions (the recorder's seam). What the
fake ``_snapshot`` returns is a dict in the documented schema, built by the snapshot
tests' builder (diagnostics/snapshot/examples.py), and what the recorder writes is read
back by the product's restricted reader and analysed, as a run folder would be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from diagnostics.analyze import analyze
from diagnostics.runs import RunFolder
from diagnostics.snapshot.examples import MIB, site_oom_snapshot, training_snapshot
from diagnostics.snapshot.reader import read_snapshot
from probe.memory_snapshots import (
    DUMP_NOTE,
    NEEDS_CUDA_NOTE,
    NullSnapshotRecorder,
    OutOfMemoryRecorded,
    SnapshotRecorder,
    SnapshotWindow,
    make_snapshot_recorder,
)


class FakeAllocator:
    """torch.cuda.memory's recording calls as a log, and a snapshot per dump: the
    training job of ``training_snapshot`` one step further each dump (a tensor of 8 MiB
    kept a step at /job/train.py:52), or ``oom`` once set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.dumps = 0
        self.oom: dict[str, Any] | None = None

    def record_history(self, **kwargs: Any) -> None:
        self.calls.append(("record", kwargs))

    def take_snapshot(self) -> dict[str, Any]:
        self.calls.append(("snapshot", {}))
        self.dumps += 1
        if self.oom is not None:
            return self.oom
        return training_snapshot(steps=1 + 3 * (self.dumps - 1), leak_bytes_per_step=8 * MIB)

    def synchronize(self) -> None:
        self.calls.append(("sync", {}))

    def functions(self) -> dict[str, Any]:
        return {
            "record_history": self.record_history,
            "take_snapshot": self.take_snapshot,
            "synchronize": self.synchronize,
        }


def _recorder(tmp_path: Path, window: SnapshotWindow, notes: list[str] | None = None):
    fake = FakeAllocator()
    recorder = make_snapshot_recorder(
        window,
        tmp_path,
        enabled=True,
        cuda=True,
        note=(notes if notes is not None else []).append,
        **fake.functions(),
    )
    return recorder, fake


def _drive(recorder, steps: range) -> list[Path | None]:
    written = []
    for step in steps:
        recorder.step_begins(step)
        written.append(recorder.step_ended(step))
    return written


def test_history_covers_the_window_and_dumps_at_its_first_and_last_step(tmp_path):
    recorder, fake = _recorder(tmp_path, SnapshotWindow(steps=4, start=3, stacks="python"))
    written = _drive(recorder, range(1, 10))
    folder = RunFolder(tmp_path)
    # steps 3..6: on as step 3 begins, a dump after 3 and after 6, then off for good
    assert (
        written
        == [None, None, folder.snapshot_path(3), None, None, folder.snapshot_path(6)] + [None] * 3
    )
    assert fake.calls == [
        (
            "record",
            {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 100_000},
        ),
        ("sync", {}),
        ("snapshot", {}),
        ("sync", {}),
        ("snapshot", {}),
        ("record", {"enabled": None}),
    ]
    assert [p.name for p in folder.snapshot_files()] == [
        "step_00000003.pickle",
        "step_00000006.pickle",
    ]
    assert not recorder.recording
    assert [s for s in range(1, 10) if recorder.marks(s)] == [3, 4, 5, 6]
    assert recorder.marks(4) == ["memory_history"]


def test_one_step_window_dumps_once_and_stacks_all_passes_through(tmp_path):
    recorder, fake = _recorder(tmp_path, SnapshotWindow(steps=1, start=1, stacks="all"))
    assert _drive(recorder, range(1, 4)) == [RunFolder(tmp_path).snapshot_path(1), None, None]
    assert fake.calls[0] == (
        "record",
        {"enabled": "all", "context": "all", "stacks": "all", "max_entries": 100_000},
    )
    assert fake.calls[-1] == ("record", {"enabled": None}) and fake.dumps == 1


def test_a_resumed_run_inside_the_window_records_the_rest_of_it(tmp_path):
    recorder, fake = _recorder(tmp_path, SnapshotWindow(steps=4, start=3))
    written = _drive(recorder, range(5, 9))  # resumed after step 4
    assert written == [None, RunFolder(tmp_path).snapshot_path(6), None, None]
    assert [c[0] for c in fake.calls] == ["record", "sync", "snapshot", "record"]


def test_the_recorded_window_is_analysed_as_a_leak_named_by_its_line(tmp_path):
    recorder, _ = _recorder(tmp_path, SnapshotWindow(steps=4, start=2))
    _drive(recorder, range(1, 7))
    run = _minimal_run_folder(tmp_path)
    files = run.snapshot_files()
    # what the recorder wrote is what the restricted reader reads: protocol 4, every entry
    assert [f.read_bytes()[:2] for f in files] == [b"\x80\x04"] * 2
    first = training_snapshot(steps=1, leak_bytes_per_step=8 * MIB)  # what dump 1 was
    assert read_snapshot(files[0]).entries.height == len(first["device_traces"][0])
    result = analyze(tmp_path)
    leak = [f for f in result.findings if f.rule == "memory-leak-by-site"]
    assert len(leak) == 1
    # 1 step at the first dump, 4 at the last: 3 more tensors of 8 MiB at train.py:52
    assert "train.py:52" in leak[0].title
    growth = result.snapshot_growth
    assert growth is not None
    top = growth.sites.row(0, named=True)
    assert top["growth_bytes"] == 3 * 8 * MIB


def test_an_out_of_memory_error_inside_the_window_dumps_and_names_the_site(tmp_path):
    notes: list[str] = []
    recorder, fake = _recorder(tmp_path, SnapshotWindow(steps=10, start=2), notes)
    _drive(recorder, range(1, 3))  # step 2 ends: the first dump
    recorder.step_begins(3)
    fake.oom = site_oom_snapshot()
    error = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB.")
    raised = recorder.out_of_memory(3, error)
    path = RunFolder(tmp_path).snapshot_path(3, oom=True)
    assert isinstance(raised, OutOfMemoryRecorded)
    assert str(raised) == f"out of memory at step 3: snapshot in {path}"
    assert raised.step == 3 and raised.path == path and path.is_file()
    assert fake.calls[-1] == ("record", {"enabled": None}) and not recorder.recording
    dumps = [DUMP_NOTE.fullmatch(n) for n in notes if n.startswith("memory snapshot ")]
    assert [m["name"] for m in dumps if m] == ["step_00000002.pickle", path.name]
    # the note's size is the file's, to the 0.01 MiB it is written with
    assert float(dumps[1]["mib"]) == round(path.stat().st_size / 2**20, 2)
    assert [n for n in notes if not n.startswith("memory snapshot ")] == [
        "out of memory at step 3: CUDA out of memory. Tried to allocate 64.00 MiB."
    ]
    # no more history and no more dumps once the run failed
    recorder.step_begins(4)
    assert recorder.step_ended(10) is None and fake.dumps == 2

    _minimal_run_folder(tmp_path, status="failed", reason=str(raised))
    result = analyze(tmp_path)
    assert result.snapshot is not None and result.snapshot.source.endswith(path.name)
    cause = [f for f in result.findings if f.rule == "out-of-memory-cause"]
    assert len(cause) == 1
    # site_oom_snapshot: 40 tensors of 16 MiB from cache_outputs at /job/train.py:88
    text = cause[0].title + json.dumps(cause[0].to_dict()["evidence"], default=str)
    assert "train.py:88" in text


def test_an_out_of_memory_error_outside_the_window_dumps_the_state_and_says_so(tmp_path):
    recorder, fake = _recorder(tmp_path, SnapshotWindow(steps=2, start=2))
    _drive(recorder, range(1, 5))
    fake.oom = site_oom_snapshot()
    raised = recorder.out_of_memory(7, torch.cuda.OutOfMemoryError("out of memory"))
    path = RunFolder(tmp_path).snapshot_path(7, oom=True)
    assert str(raised) == (
        f"out of memory at step 7: snapshot in {path} (state only, no stacks: allocation "
        "history was recorded for steps 2..3 only)"
    )
    no_window, _ = _recorder(tmp_path / "b", SnapshotWindow(steps=0))
    assert isinstance(no_window, SnapshotRecorder)  # on CUDA it still dumps at an OOM
    assert _drive(no_window, range(1, 4)) == [None, None, None]
    assert str(no_window.out_of_memory(1, torch.cuda.OutOfMemoryError("x"))).endswith(
        "(state only, no stacks: allocation history was not recorded)"
    )


def test_a_dump_that_fails_after_the_error_is_named_not_raised(tmp_path):
    def broken_snapshot() -> dict[str, Any]:
        raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")

    recorder = SnapshotRecorder(
        SnapshotWindow(steps=2),
        tmp_path,
        record_history=lambda **kw: None,
        take_snapshot=broken_snapshot,
        synchronize=lambda: None,
    )
    recorder.step_begins(2)
    raised = recorder.out_of_memory(2, torch.cuda.OutOfMemoryError("x"))
    assert str(raised) == (
        "out of memory at step 2: no snapshot (the dump failed: RuntimeError: CUDA error: "
        "an illegal memory access was encountered)"
    )
    assert raised.path is None and not recorder.recording


def test_on_cpu_nothing_is_recorded_and_the_notes_say_why(tmp_path):
    notes: list[str] = []
    fake = FakeAllocator()
    recorder = make_snapshot_recorder(
        SnapshotWindow(steps=3), tmp_path, enabled=True, cuda=False, note=notes.append
    )
    assert isinstance(recorder, NullSnapshotRecorder) and notes == [NEEDS_CUDA_NOTE]
    assert "memory snapshots need CUDA" in NEEDS_CUDA_NOTE
    assert _drive(recorder, range(1, 5)) == [None] * 4 and fake.calls == []
    error = torch.cuda.OutOfMemoryError("x")
    assert recorder.out_of_memory(2, error) is error  # the run fails with its own error
    quiet: list[str] = []
    make_snapshot_recorder(
        SnapshotWindow(steps=0), tmp_path, enabled=True, cuda=False, note=quiet.append
    )
    make_snapshot_recorder(
        SnapshotWindow(steps=3), tmp_path, enabled=False, cuda=True, note=quiet.append
    )
    assert quiet == []  # nothing asked for, or the instruments off: nothing to say


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"steps": -1}, "steps must be 0 or more"),
        ({"start": 0}, "start must be 1 or more"),
        ({"stacks": "cpp"}, "stacks must be one of python, all"),
        ({"max_entries": 0}, "max_entries must be 1 or more"),
    ],
)
def test_a_bad_window_is_one_line(fields, message):
    with pytest.raises(ValueError, match=message):
        SnapshotWindow(**fields)


def _minimal_run_folder(path: Path, status: str = "completed", reason: str | None = None):
    """The smallest run folder the reader takes around the recorder's memory/."""
    (path / "run.json").write_text(
        json.dumps({"version": 1, "run_id": "r", "config": {}, "environment": {"device": "cuda"}})
    )
    (path / "status.json").write_text(json.dumps({"status": status, "reason": reason}))
    (path / "steps.jsonl").write_text("")
    return RunFolder(path)


# --- the script wrapper (a real `python -m probe profile` subprocess, on CPU) -------------


@pytest.mark.slow  # a profiled subprocess: ~20-40 s on the shared 2-core host
def test_the_wrapper_on_cpu_notes_snapshots_need_cuda_and_keeps_the_oom_error(tmp_path):
    from tests.probe.helpers import SCRIPTS, profile, run_folder

    runs = tmp_path / "runs"
    script = str(SCRIPTS / "leak_then_oom.py")
    done = profile(runs, "--no-trace", "--memory-snapshots", "2", script, "--oom-at", "3")
    assert done.returncode == 1, done.stderr
    run = RunFolder(run_folder(done))
    assert NEEDS_CUDA_NOTE in run.manifest().notes
    assert run.snapshot_files() == []
    status = json.loads((run.path / "status.json").read_text())
    assert status["status"] == "failed"
    assert status["reason"] == (
        "torch.OutOfMemoryError: CUDA out of memory (raised by hand on CPU)"
    )


def test_a_negative_window_is_one_usage_line(tmp_path, capsys):
    from probe.cli import main
    from tests.probe.helpers import SCRIPTS

    script = str(SCRIPTS / "leak_then_oom.py")
    assert main(["profile", "--runs-dir", str(tmp_path), "--memory-snapshots", "-1", script]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --memory-snapshots: -1 is not 0 or more steps"
    ]
    assert list(tmp_path.iterdir()) == []  # no run folder
