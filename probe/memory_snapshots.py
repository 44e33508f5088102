"""CUDA memory snapshots of a window of steps, and one at an out-of-memory error.

The allocator records a history (every alloc and free, with its Python stack) only while
``torch.cuda.memory._record_memory_history`` is on, and that costs on every allocation
(torchtitan measured snapshot dumps of 461 s with C++ stacks against 4 s with Python ones;
docs/MEMORY.md, "Recording"). So history is on for a window of ``steps`` steps only,
chosen by count as the profiler's window is, then switched off:

- history starts as step ``start`` begins;
- a snapshot is written as step ``start`` ends and another as the window's last step ends
  (``memory/step_N.pickle``): the analysis compares a run folder's first and last snapshot,
  and two dumps at the same point of a step are of the same phase, so what a line kept
  between them is a leak suspect named with its line (memory-leak-by-site);
- on CUDA, a ``torch.cuda.OutOfMemoryError`` in a step writes ``memory/oom_step_N.pickle`` before
  the run fails with "out of memory at step N: snapshot in PATH". Inside the window the
  snapshot holds the failed request (its ``oom`` entry) and the stacks of what held the
  rest; outside it the state only (the blocks, without stacks), and the message says so.

The three torch functions are parameters (torch's by default) so that everything around
them runs on a machine without CUDA; this module imports torch only when it needs them.
On CPU the recorder is :class:`NullSnapshotRecorder` and the run's notes say why.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from diagnostics.runs import RunFolder

Stacks = Literal["python", "all"]
STACKS: tuple[str, ...] = ("python", "all")
NEEDS_CUDA_NOTE = "memory snapshots need CUDA: none recorded on this device"


DUMP_NOTE = re.compile(r"memory snapshot (?P<name>\S+): (?P<mib>[0-9.]+) MiB in (?P<s>[0-9.]+) s")


def dump_note(path: Path, size_bytes: int, seconds: float) -> str:
    """The run note a dump leaves (``DUMP_NOTE`` reads it back: the cost bench does)."""
    return f"memory snapshot {path.name}: {size_bytes / 2**20:.2f} MiB in {seconds:.3f} s"


def oom_when(step: int, evaluating: bool) -> str:
    """Where an out-of-memory error struck, as its message and note say it."""
    return f"in the evaluation after step {step}" if evaluating else f"at step {step}"


class OutOfMemoryRecorded(RuntimeError):
    """The run's failure after an out-of-memory error: its message is the run's reason."""

    def __init__(self, step: int, path: Path | None, detail: str, *, evaluating: bool = False):
        self.step = step
        self.path = path
        where = f"snapshot in {path}" if path is not None else "no snapshot"
        super().__init__(f"out of memory {oom_when(step, evaluating)}: {where}{detail}")


@dataclass(frozen=True)
class SnapshotWindow:
    """``steps`` steps from step ``start`` (1-based, counted as the run counts steps);
    ``steps=0`` records nothing. ``max_entries`` bounds the allocator's ring buffer (a
    snapshot is several kB an entry), ``stacks`` is what each entry keeps: ``python``
    frames, or ``all`` (C++ too, far slower to dump)."""

    steps: int = 0
    start: int = 2
    stacks: Stacks = "python"
    max_entries: int = 100_000

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError("memory snapshot window: steps must be 0 or more")
        if self.start < 1:
            raise ValueError("memory snapshot window: start must be 1 or more")
        if self.stacks not in STACKS:
            raise ValueError(f"memory snapshot window: stacks must be one of {', '.join(STACKS)}")
        if self.max_entries < 1:
            raise ValueError("memory snapshot window: max_entries must be 1 or more")

    @property
    def last(self) -> int:
        return self.start + self.steps - 1

    def dump_steps(self) -> tuple[int, ...]:
        """The steps whose end writes a snapshot: the window's first and last."""
        if self.steps == 0:
            return ()
        return tuple(dict.fromkeys((self.start, self.last)))


class NullSnapshotRecorder:
    """Records nothing: snapshots are off, or there is no CUDA device."""

    recording = False
    written: tuple[Path, ...] = ()

    def step_begins(self, step: int) -> None:
        pass

    def step_ended(self, step: int) -> Path | None:
        return None

    def out_of_memory(
        self, step: int, error: BaseException, *, evaluating: bool = False
    ) -> BaseException:
        return error

    def stop(self) -> None:
        pass

    def marks(self, step: int) -> list[str]:
        return []


def _torch_record_history(**kwargs: Any) -> None:
    import torch

    torch.cuda.memory._record_memory_history(**kwargs)


def _torch_snapshot() -> dict[str, Any]:
    import torch

    return torch.cuda.memory._snapshot()


def _torch_synchronize() -> None:
    import torch

    torch.cuda.synchronize()


class SnapshotRecorder(NullSnapshotRecorder):
    """Allocator history over a :class:`SnapshotWindow`, snapshots into ``run_dir``'s
    ``memory/``. Call ``step_begins(n)`` before step n runs, ``step_ended(n)`` after it,
    ``out_of_memory(n, error)`` when it raised ``torch.cuda.OutOfMemoryError`` (raise what
    it returns; ``evaluating=True`` for the evaluation after step n), and ``stop()`` when
    the run ends however it ends."""

    def __init__(
        self,
        window: SnapshotWindow,
        run_dir: Path,
        *,
        record_history: Callable[..., None] = _torch_record_history,
        take_snapshot: Callable[[], dict[str, Any]] = _torch_snapshot,
        synchronize: Callable[[], None] = _torch_synchronize,
        note: Callable[[str], None] | None = None,
    ):
        self.window = window
        self.folder = RunFolder(run_dir)
        self._record_history = record_history
        self._take_snapshot = take_snapshot
        self._synchronize = synchronize
        self._note = note or (lambda text: None)
        self.recording = False
        self._done = False  # the window is over: history never starts again
        self.written: tuple[Path, ...] = ()

    def step_begins(self, step: int) -> None:
        if self.recording or self._done or not (self.window.start <= step <= self.window.last):
            return
        # a run resumed inside the window starts history where it is; its first dump
        # then falls at the window's end
        self._record_history(
            enabled="all",
            context="all",
            stacks=self.window.stacks,
            max_entries=self.window.max_entries,
        )
        self.recording = True

    def step_ended(self, step: int) -> Path | None:
        if not self.recording or step not in self.window.dump_steps():
            return None
        path = self._dump(self.folder.snapshot_path(step))
        if step >= self.window.last:
            self.stop()
        return path

    def _dump(self, path: Path) -> Path:
        # a free another stream still uses completes once the device reaches it: the
        # snapshot then shows the block as freed rather than awaiting free
        # imported at the dump only: diagnostics.snapshot's package brings its analysis along
        from diagnostics.snapshot.writer import write_snapshot

        self._synchronize()
        started = time.perf_counter()
        target = write_snapshot(self._take_snapshot(), path)
        seconds = time.perf_counter() - started
        self.written = (*self.written, target)
        # the dump's own cost, which grows with the entries and their stacks (the step
        # records cannot show it: it runs between steps)
        self._note(dump_note(target, target.stat().st_size, seconds))
        return target

    def out_of_memory(
        self, step: int, error: BaseException, *, evaluating: bool = False
    ) -> BaseException:
        """Writes ``oom_step_N.pickle`` and returns the run's error to raise (from
        ``error``). A dump that itself fails is named in the message, never raised.
        ``evaluating``: the error came from the evaluation after step N, not a step."""
        with_history = self.recording
        path: Path | None = None
        detail = ""
        try:
            path = self._dump(self.folder.snapshot_path(step, oom=True))
        except Exception as exc:  # the device may be unusable after the error
            detail = f" (the dump failed: {type(exc).__name__}: {' '.join(str(exc).split())})"
        else:
            if not with_history:
                window = (
                    f"recorded for steps {self.window.start}..{self.window.last} only"
                    if self.window.steps
                    else "not recorded"
                )
                detail = f" (state only, no stacks: allocation history was {window})"
        self.stop()
        self._note(
            f"out of memory {oom_when(step, evaluating)}: {' '.join(str(error).split())[:300]}"
        )
        return OutOfMemoryRecorded(step, path, detail, evaluating=evaluating)

    def stop(self) -> None:
        if self.recording:
            self.recording = False
            self._done = True
            # a CUDA error that ended the run may make this fail too; it must not hide it
            with contextlib.suppress(Exception):
                self._record_history(enabled=None)

    def marks(self, step: int) -> list[str]:
        """Known causes of extra time in ``step`` (the step records' marks): allocator
        history on while it ran. The dumps run between steps, after a device sync, so no
        step's clock holds them."""
        return ["memory_history"] if self.window.start <= step <= self.window.last else []


def make_snapshot_recorder(
    window: SnapshotWindow,
    run_dir: Path,
    *,
    enabled: bool,
    cuda: bool,
    note: Callable[[str], None],
    **torch_functions: Any,
) -> NullSnapshotRecorder:
    """The recorder for a run. On CUDA it always dumps at an out-of-memory error (the
    state costs nothing until then) and records history only over a window of steps > 0.
    A no-op with the instruments off, and on a device without CUDA (with a note when a
    window was asked for)."""
    if not enabled or not cuda:
        if enabled and window.steps:
            note(NEEDS_CUDA_NOTE)
        return NullSnapshotRecorder()
    return SnapshotRecorder(window, run_dir, note=note, **torch_functions)
