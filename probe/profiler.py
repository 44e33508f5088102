"""torch.profiler over a short window of training, written in TensorBoard's layout.

Nothing of the profiler may outlive its window. Two things did (issue 9):

- On CPU, the stopped profiler object kept every recorded event as Python objects, which the
  garbage collector scanned on every collection for the rest of the run (+4.0 % a step):
  the object is dropped and collected as soon as the trace is written.
- On CUDA, Kineto leaves CUPTI attached after the trace stops unless ``TEARDOWN_CUPTI=1``
  is in the environment when it stops (Kineto's ``CuptiActivityApi::teardownContext`` reads
  it with ``getenv`` at that moment, then calls ``cuptiFinalize`` from the next CUDA API
  callback). Attached, CUPTI's runtime/driver callbacks run on every kernel launch for the
  rest of the run: 1.30x steady steps at the default size on an H200 against 1.058 with
  the profiler disabled (pytorch/pytorch#144455, PR #146604). The variable is set before
  the step that ends the last window, unless the user set it; PyTorch itself sets it to 0
  only for CUDA graphs (torch.compile's cudagraphs), which this trainer does not use.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

TEARDOWN_ENV = "TEARDOWN_CUPTI"


class WindowSettings(Protocol):
    """What a profiler window needs; the reference trainer's ``ProfilerConfig`` has it."""

    enabled: bool
    wait: int
    warmup: int
    active: int
    repeat: int
    record_shapes: bool
    profile_memory: bool


@dataclass(frozen=True)
class ProfilerWindow:
    """A window chosen by step count: skip ``wait``, warm up ``warmup``, record ``active``.

    ``with_stack`` keeps each operator's Python stack, so a finding can name the user's
    line (a host sync, a slow op); it costs more per op while recording, and the window
    is a few steps only.
    """

    enabled: bool = True
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = True

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "repeat"):
            if getattr(self, name) < 0:
                raise ValueError(f"profiler window: {name} must be 0 or more")
        if self.active < 1:
            raise ValueError("profiler window: active must be 1 or more")


class NullProfiler:
    """The no-op profiler: same calls, records nothing. A context manager, like the real
    one: ``with profiler:`` starts it and its exit removes it entirely."""

    def __enter__(self) -> NullProfiler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        pass

    def step(self) -> None:
        pass

    def stop(self) -> None:
        pass

    @property
    def recording(self) -> bool:
        return False

    @property
    def state(self) -> str | None:
        """The schedule's state for the current step: "wait", "warmup", "active" or None
        (not profiling). The step records carry it, so an analysis can leave out the steps
        the profiler slowed."""
        return None


class TrainingProfiler(NullProfiler):
    """``schedule(wait, warmup, active, repeat)`` around the training steps.

    The default ``wait=1, warmup=1, active=3, repeat=1`` records three steady steps and
    then stops profiling altogether, so the rest of the run pays no profiler overhead
    (the step records say which steps were inside the window: ``profiled``).
    """

    def __init__(self, config: WindowSettings, trace_dir: Path, *, cuda: bool, worker_name: str):
        self.cuda = cuda
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.config = config
        self._cycle = config.wait + config.warmup + config.active
        self._index = 0  # profiler steps completed so far (the step being run now)
        self._running = False
        self._profile = profile(
            activities=activities,
            schedule=schedule(
                wait=config.wait,
                warmup=config.warmup,
                active=config.active,
                repeat=config.repeat,
            ),
            on_trace_ready=tensorboard_trace_handler(
                str(trace_dir), worker_name=worker_name, use_gzip=True
            ),
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_stack=bool(getattr(config, "with_stack", False)),
        )

    def start(self) -> None:
        if not self._running:
            self._profile.start()
            self._running = True

    def _finished(self) -> bool:
        return self.config.repeat > 0 and self._index >= self._cycle * self.config.repeat

    @property
    def recording(self) -> bool:
        """Whether the current step falls in an active (recorded) window."""
        if not self._running or self._finished():
            return False
        return self._index % self._cycle >= self.config.wait + self.config.warmup

    def _last_window_ends_next(self) -> bool:
        return self.config.repeat > 0 and self._index + 1 >= self._cycle * self.config.repeat

    def _detach_cupti_when_stopped(self) -> None:
        # only before the last stop: a window that starts again after a teardown would
        # re-initialise CUPTI, which some Kineto releases race on (pytorch/kineto#1169)
        if self.cuda:
            os.environ.setdefault(TEARDOWN_ENV, "1")

    @property
    def state(self) -> str | None:
        if not self._running or self._finished():
            return None
        position = self._index % self._cycle
        if position < self.config.wait:
            return "wait"
        return "warmup" if position < self.config.wait + self.config.warmup else "active"

    def step(self) -> None:
        if not self._running:
            return
        if self._last_window_ends_next():
            self._detach_cupti_when_stopped()  # this step() stops the last trace in Kineto
        self._profile.step()
        self._index += 1
        if self._finished():
            self.stop()

    def stop(self) -> None:
        if self._running:
            self._running = False
            self._detach_cupti_when_stopped()
            # __exit__, not stop(): it also forgets the profiler's step counter
            # (KinetoStepTracker) and cleans up an execution-trace observer
            self._profile.__exit__(None, None, None)
            # The trace is on disk by now; the profiler object still holds every recorded
            # event as Python objects, which the garbage collector would scan on every
            # collection for the rest of the run: measured +4.0 % on steady steps with it kept,
            # none (0.96x) once released.
            self._profile = None
            gc.collect()

    @property
    def attached(self) -> bool:
        """Whether anything of torch.profiler is still installed by this object."""
        return self._profile is not None


def make_profiler(
    config: WindowSettings, trace_dir: Path, *, enabled: bool, cuda: bool, worker_name: str
) -> NullProfiler:
    if not (enabled and config.enabled):
        return NullProfiler()
    return TrainingProfiler(config, trace_dir, cuda=cuda, worker_name=worker_name)
