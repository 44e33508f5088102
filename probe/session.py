"""One profiled process: its steps, their records, and the instruments around them.

A step is delimited in one of three ways, the first that applies:

- ``with probe.step():`` (the explicit API): the block's exit ends a step. Once used, the
  hooks below no longer end steps.
- an optimizer step (``torch.optim`` global post-hook): the *lead* optimizer's ``step()``
  ends a step. The lead is the first optimizer that steps; other optimizers' steps (a GAN's
  second one) are counted in ``run.json``'s ``optimizers`` but do not end steps, so a step
  is one training iteration whichever of them run in it. With gradient accumulation the
  optimizer steps every k batches, so a step holds k batches: its data wait, samples and
  loss cover all k (the loss is the mean of the step's ``backward()`` losses). A
  GradScaler step skipped for inf/NaN gradients still ends a step (marked ``amp_skipped``).
- a ``backward()`` on the training thread, when the script builds no ``torch.optim``
  optimizer (a hand-written update, as pytorch/examples' word_language_model without
  ``--use-optimizer``): one step per ``backward()``, with its loss. The step ends when the
  next iteration shows itself (its DataLoader fetch, else its ``backward()``), so the
  clipping and the update after a backward are still its step's (the gradient norm
  ``clip_grad_norm_`` returns among them); the last ends at its own backward.
- a DataLoader batch, while no optimizer has stepped yet (evaluation, inference): each
  batch fetched on the training thread ends the step before it. Batches fetched after
  the last optimizer step (a final evaluation) are left out: their step never ends.

Steps are the training thread's: the thread that runs the script's main module. An
optimizer built or stepped on another thread (a teacher trained in the background, a
thread per model) is counted in ``run.json``'s ``optimizers`` with its thread, and said in a
note, but neither ends a step nor becomes the lead.

The gradient norm of a step is the norm before clipping when the script clips
(``clip_grad_norm_`` returns it), else the norm of the lead optimizer's gradients as its
``step()`` begins; either stays on the device and is read with the loss a few steps later.

Each step lasts from the end of the one before (the first: from its first batch fetch or
``backward()``) to its own end, so data wait, forward, backward and the optimiser all fall
in it. ``data_wait_ms`` is the training thread's time inside DataLoader ``__next__``; it is
null for a step without such a fetch (synthetic data, or a loader iterated on another
thread, whose own time is not the training thread's wait).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diagnostics.runs import TRACE_DIR, RankRecords, RunFolder, RunWriter
from probe.deferred import DeviceScalars, PendingSteps, read_floats
from probe.key_values import READS
from probe.memory_snapshots import NullSnapshotRecorder, SnapshotWindow, make_snapshot_recorder
from probe.profiler import NullProfiler, ProfilerWindow, make_profiler
from probe.step_values import (
    HOST_FIELDS,
    CudaTimes,
    NormParts,
    NullsForMissing,
    batch_samples,
    batch_tokens,
    gradient_norm,
    host_float,
    host_step_record,
    step_record,
)
from probe.steps import RssReader, RunQueueWait, cuda_memory
from probe.system import NullSampler, make_sampler


class StepLimitReached(BaseException):
    """Raised from the hook that ends step ``--steps``: unwinds the script like an exit.

    A BaseException, as SystemExit is, so the script's own ``except Exception`` does not
    swallow it."""


# how long a CPU step may wait for its batch's read before the sampler writes it
STALE_HOST_STEPS_S = 0.5
_NOTHING_RECORDED: dict[str, Any] = {}  # a step without probe.record(): never written to

# A process the script forks (os.fork, a fork-started multiprocessing.Process; DataLoader
# workers too) is a copy of this one, sessions and their unwritten records included: left
# alone, its steps and its copy of the buffered ones were appended to the same files as the
# script's own (measured: steps 1..6 written twice by a script that forked once after step
# 3). In the copy every session goes quiet; a step it still sees leaves a marker file named
# after its pid, which the script's own process turns into a note at its end.
FORKED_STEPS_MARKER = "forked_steps.{pid}"
_LIVE_SESSIONS: weakref.WeakSet[Session] = weakref.WeakSet()


def _quiet_in_forked_child() -> None:
    for session in list(_LIVE_SESSIONS):
        session.forked_off()


os.register_at_fork(after_in_child=_quiet_in_forked_child)


class _NoRecords:
    """A forked copy's records: nothing it does is written."""

    def append_step(self, record: Any) -> None:
        pass

    def append_steps(self, records: Any) -> None:
        pass

    def append_sample(self, record: Any) -> None:
        pass

    def flush_if_stale(self) -> None:
        pass

    def write_status(self, *args: Any, **kwargs: Any) -> None:
        pass


@dataclass(slots=True)
class _OpenStep:
    begin: float  # perf_counter seconds
    data_wait_s: float = 0.0
    fetches: int = 0  # batches fetched on the training thread
    samples: int | None = None
    tokens: int | None = None  # of the fetched batches with input_ids (step_values.batch_tokens)
    token_length_sum: int = 0  # sum over those batches of tokens x padded length
    losses: list[Any] | None = None  # made at the first backward(): most steps have one
    grad_norm: Any = None
    optimizer_begin: float | None = None
    optimizer_s: float | None = None
    begin_event: Any = None  # CUDA event at the step's start (the previous step's end)
    optimizer_event: Any = None
    recorded: dict[str, Any] | None = None  # probe.record(...)
    # the training thread's run-queue wait at the step's start (probe.steps.RunQueueWait)
    waited_ns: int | None = None


class Session:
    """The instruments of one process of a profiled script (``probe.child`` makes it)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        rank: int = 0,
        max_steps: int | None = None,
        window: ProfilerWindow | None = None,
        sample_hz: float = 10.0,
        read_every: int = 10,
        snapshot_window: SnapshotWindow | None = None,
    ):
        self.run_dir = run_dir
        self.rank = rank
        self.max_steps = max_steps
        self.records = RankRecords(run_dir, rank)
        self.manifest = RunWriter(path=run_dir) if rank == 0 else None
        self.training_thread = threading.get_ident()
        self._lock = threading.Lock()  # the sampler thread notes too
        self._rss = RssReader()
        # each step's wait for a CPU (cpu_wait_ms): read on the training thread only, whose
        # /proc/thread-self/schedstat it opens on its first read
        self._run_queue = RunQueueWait()
        self.device: torch.device | None = None
        self._cuda = False  # device is a CUDA device: set with it, read several times a step
        # "batches", "optimizer", "backward" or "explicit" once known
        self.mode: str | None = None
        self.optimizers_built = 0  # torch.optim optimizers built on the training thread
        # when the open step's backward() returned, in a script with no optimizer: the step
        # ends as the next iteration begins
        self._backward_returned: float | None = None
        self.steps_done = 0
        self._open: _OpenStep | None = None
        self._explicit_open = False  # inside explicit_begin() .. its step's end
        self._one_fetch_per_step = False  # expect_explicit_steps(one_fetch_per_step=...)
        self._lead: weakref.ref[Any] | None = None
        self.optimizer_steps: dict[int, dict[str, Any]] = {}
        self.amp: dict[str, Any] = {"autocast_dtypes": [], "grad_scaler": False}
        self.skipped_steps = 0
        self._scaler: Any = None  # the GradScaler whose step() is running
        self.scaled_losses = False  # GradScaler.scale() has tagged a loss (probe.hooks)
        self._lead_stepped = False
        # False: a step's loss is the mean of its backward() losses (a loop that averages
        # micro-batches itself); True: their sum (HF Trainer scales each micro-batch's
        # loss by its share of the optimizer step before backward)
        self.micro_batch_losses_add_up = False
        self._scalars: DeviceScalars | None = None
        # CPU steps ended, not yet written: (host figures, loss, norm, scale, store reads)
        self._host_steps: list[tuple[tuple[Any, ...], Any, Any, float | None, Any]] = []
        # the sampler thread writes CPU steps left waiting (a script that stops stepping,
        # then is killed, keeps them): perf_counter at the oldest waiting one's end
        self._host_lock = threading.Lock()
        self._host_waiting_since: float | None = None
        self._wall_offset = time.time() - time.perf_counter()
        self._params: dict[int, tuple[list[tuple[int, int]], list[Any]]] = {}
        self._profiler_done = False
        self._nan: torch.Tensor | None = None  # a device NaN for figures a step lacks
        self._read_every = read_every
        self.pending: PendingSteps | None = None
        self._window = window or ProfilerWindow()
        self.profiler: NullProfiler = NullProfiler()
        self._sampler: NullSampler = make_sampler(
            self._on_sample, self.note, enabled=sample_hz > 0, sample_hz=sample_hz
        )
        self.notes: list[str] = []
        self._snapshot_window = snapshot_window or SnapshotWindow()
        self.snapshots: NullSnapshotRecorder = NullSnapshotRecorder()
        # loader index -> [batches, seconds waited, of which CPU seconds of this thread]
        self.loader_waits: dict[Any, list[float]] = {}
        # key-value store reads (probe/key_values.py): active once the script imports a store.
        # The counter is the process's; a session in a process that an earlier one patched
        # (an in-process caller) starts it inactive, or its steps would carry store fields
        # for reads it never saw.
        READS.forget_everything()
        self.key_values = READS
        self.forked = False  # this is a forked copy of the session's process (forked_off)
        self.limit_reached = False  # the --steps stop was raised
        # called when a step ends past --steps (the script caught the stop): probe.child
        # ends the run there; the default, for sessions outside a script run, stops again
        self.on_limit_ignored: Any = None
        # processes the script started itself, not DataLoader workers: target -> count
        self.processes_started: dict[str, int] = {}
        _LIVE_SESSIONS.add(self)

    # --- lifetime ------------------------------------------------------------------------

    def start(self) -> None:
        self._sampler.start()
        self.pending = PendingSteps(self._write, self._complete)
        # before the script runs, so that a window from step 1 sees its model being built;
        # rank 0 only: the snapshots' names carry no rank
        self.snapshots = make_snapshot_recorder(
            self._snapshot_window,
            self.run_dir,
            enabled=self.rank == 0,
            cuda=torch.cuda.is_available(),
            note=self.note,
        )
        self.snapshots.step_begins(1)

    def _on_sample(self, row: dict[str, Any]) -> None:
        self.records.append_sample(row)
        # a script that stops stepping (a long evaluation, or a hang before a SIGKILL)
        # still shows its last steps: CPU steps waiting for their batch read are written
        # after STALE_HOST_STEPS_S, and buffered lines after the records' interval
        since = self._host_waiting_since
        if since is not None and time.perf_counter() - since >= STALE_HOST_STEPS_S:
            self._write_host_steps()
        self.records.flush_if_stale()

    def _start_profiler(self) -> None:
        """At the first step: the window counts steps, and the device is known by then."""
        cuda = self.device is not None and self.device.type == "cuda"
        self.profiler = make_profiler(
            self._window,
            self.run_dir / TRACE_DIR,
            enabled=self._window.enabled,
            cuda=cuda,
            worker_name=f"{self.run_dir.name}.rank{self.rank}",
        )
        self.profiler.start()

    def close(self) -> None:
        """Ends what is open: a batch-counted step is written, a partial optimizer step is
        not (it never stepped); every pending record is flushed (one device sync at most)."""
        if self._open is not None and self.mode == "batches" and self._open.fetches:
            with contextlib.suppress(StepLimitReached):
                self.end_step(time.perf_counter())
        if self._backward_returned is not None:
            with contextlib.suppress(StepLimitReached):
                self._end_backward_step(self._backward_returned)
        self._open = None
        with contextlib.suppress(Exception):  # a broken tensor must not hide the end
            self._write_host_steps()
        if self.pending is not None:
            with contextlib.suppress(Exception):  # a broken device must not hide the end
                self.pending.flush()
        self.profiler.stop()
        self.snapshots.stop()
        self._sampler.stop()

    def forked_off(self) -> None:
        """In a process forked from this session's (``os.register_at_fork``): nothing more
        is written, and the unwritten records, the script's own process's, are dropped."""
        self.forked = True
        self.records = _NoRecords()  # type: ignore[assignment]
        self.manifest = None
        self._host_steps = []
        self._open = None
        self.pending = None

    def process_started(self, target: str) -> None:
        if not self.forked:
            self.processes_started[target] = self.processes_started.get(target, 0) + 1

    def _forked_step_seen(self) -> None:
        marker = self.run_dir / FORKED_STEPS_MARKER.format(pid=os.getpid())
        if not marker.exists():
            with contextlib.suppress(OSError):
                marker.touch()

    def forked_steppers(self) -> list[int]:
        """The pids of forked copies that stepped (their markers, removed as read)."""
        pids = []
        for marker in self.run_dir.glob(FORKED_STEPS_MARKER.format(pid="*")):
            suffix = marker.name.rsplit(".", 1)[-1]
            if suffix.isdigit():
                pids.append(int(suffix))
            with contextlib.suppress(OSError):
                marker.unlink()
        return sorted(pids)

    def note(self, text: str) -> None:
        """A note in run.json (rank 0), once."""
        if text in self.notes:
            return
        self.notes.append(text)
        if self.manifest is not None:
            with self._lock, contextlib.suppress(OSError):
                self.manifest.add_note(text)

    def update_manifest(self, **fields: Any) -> None:
        if self.manifest is not None:
            with self._lock:
                self.manifest.update_manifest(**fields)

    # --- what the hooks report --------------------------------------------------------------

    def on_training_thread(self) -> bool:
        return threading.get_ident() == self.training_thread

    def _ensure_open(self, now: float) -> _OpenStep:
        if self._open is None:
            self._open = _OpenStep(begin=now, waited_ns=self._cpu_waited_ns())
            if self._cuda:
                self._open.begin_event = self._event()
        return self._open

    def _cpu_waited_ns(self) -> int | None:
        return self._run_queue.read() if self.on_training_thread() else None

    def _event(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def fetch_started(self, now: float) -> None:
        """A DataLoader ``__next__`` on the training thread is about to run."""
        self._end_backward_step(now)
        if self.mode in (None, "batches") and self._open is not None and self._open.fetches:
            self.mode = "batches"
            self.end_step(now)
        elif (
            self.mode == "explicit"
            and self._one_fetch_per_step
            and not self._explicit_open
            and self._open
            and self._open.fetches
        ):
            # a second fetch outside any explicit step (an evaluation loop): the batch
            # fetched before it was not a step's, so its wait and time are not the next one's
            self._open = None
        self._ensure_open(now)

    def fetch_ended(
        self, started: float, ended: float, batch: Any, loader: Any = None, cpu_s: float = 0.0
    ) -> None:
        step = self._ensure_open(started)
        step.data_wait_s += ended - started
        totals = self.loader_waits.setdefault(loader, [0, 0.0, 0.0])
        totals[0] += 1
        totals[1] += ended - started
        totals[2] += cpu_s
        step.fetches += 1
        samples = batch_samples(batch)
        if samples is not None:
            step.samples = (step.samples or 0) + samples
        tokens = batch_tokens(batch)
        if tokens is not None:
            count, length = tokens
            step.tokens = (step.tokens or 0) + count
            step.token_length_sum += count * length

    def backward_called(self, loss: torch.Tensor) -> None:
        if self._backward_returned is not None:
            self._end_backward_step(time.perf_counter())
        if self.device is None:
            self._set_device(loss.device)
        step = self._open or self._ensure_open(time.perf_counter())
        if loss.numel() == 1:
            # GradScaler.scale(loss)'s output; the attribute is looked up only once a
            # scaler has scaled a loss (a missing one costs a caught AttributeError)
            scale = getattr(loss, "_probe_scale", None) if self.scaled_losses else None
            value = loss.detach() / scale if scale is not None else loss.detach()
            if step.losses is None:
                step.losses = [value]
            else:
                step.losses.append(value)

    def backward_done(self, now: float) -> None:
        """A ``backward()`` on the training thread returned: in a script with no optimizer,
        its step ends as the next iteration begins (_end_backward_step)."""
        if self.mode in (None, "backward") and not self.optimizers_built:
            self.mode = "backward"
            self._backward_returned = now

    def _end_backward_step(self, now: float) -> None:
        if self._backward_returned is not None:
            self._backward_returned = None
            self.end_step(now)

    def _set_device(self, device: torch.device) -> None:
        if device.type == "cuda":
            self._write_host_steps()  # steps before the first CUDA tensor were CPU steps
        self.device = device
        self._cuda = device.type == "cuda"
        if device.type == "cuda":
            self._scalars = DeviceScalars(device, self._read_every)
            if self.pending is not None:
                self.pending.ship_on_flush(self._scalars)
        environment: dict[str, Any] = {"device": device.type}
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            environment.update(
                gpu_name=props.name,
                gpu_memory_bytes=int(props.total_memory),
                gpu_count=torch.cuda.device_count(),
                gpu_compute_capability=f"{props.major}.{props.minor}",
            )
        if self.manifest is not None:
            with self._lock:
                merged = {**RunFolder(self.run_dir).manifest().environment, **environment}
                self.manifest.update_manifest(environment=merged)

    def optimizer_built(self) -> None:
        """A ``torch.optim`` optimizer was built on the training thread: steps are counted
        by optimizer steps, never by ``backward()``."""
        self.optimizers_built += 1

    def _count_optimizer_step(self, optimizer: Any, thread: str) -> None:
        info = self.optimizer_steps.get(id(optimizer))
        if info is None:
            info = self.optimizer_steps[id(optimizer)] = {
                "class": type(optimizer).__name__,
                "steps": 0,
                "thread": thread,
            }
        info["steps"] += 1

    def background_optimizer_step(self, optimizer: Any) -> None:
        """An optimizer stepped on a thread other than the training thread."""
        if self.forked:
            return
        self._count_optimizer_step(optimizer, "background")
        self.note(
            "an optimizer stepped on a background thread: steps are the training thread's "
            "(the thread that runs the script's main module), so its steps are counted in "
            "run.json's optimizers but are not step records"
        )

    def optimizer_pre(self, optimizer: Any) -> None:
        if self.forked:
            return
        self._count_optimizer_step(optimizer, "training")
        lead = self._lead() if self._lead is not None else None
        if lead is None:
            self._lead, lead = weakref.ref(optimizer), optimizer
        if lead is not optimizer:
            return
        now = time.perf_counter()
        if self.mode == "explicit" and self._open is None:
            return  # an optimizer step outside the framework's steps: not one of them
        step = self._ensure_open(now)
        step.optimizer_begin = now
        if self._cuda:
            step.optimizer_event = self._event()
        if step.grad_norm is not None:  # clip_grad_norm_ gave it: the norm before clipping
            return
        grads = [p.grad for p in self._params_of(optimizer) if p.grad is not None]
        if grads:
            # on the device, before the update; read with the step's other scalars later
            step.grad_norm = gradient_norm(grads)

    def _params_of(self, optimizer: Any) -> list[Any]:
        """The optimizer's parameters, flattened once and again only when its groups
        change (add_param_group): a per-step walk of every group costs a large model."""
        groups = optimizer.param_groups
        shape = [(id(group["params"]), len(group["params"])) for group in groups]
        cached = self._params.get(id(optimizer))
        if cached is None or cached[0] != shape:
            cached = (shape, [p for group in groups for p in group["params"]])
            self._params[id(optimizer)] = cached
        return cached[1]

    def clip_norm_seen(self, norm: Any) -> None:
        """``clip_grad_norm_``'s result: the norm before clipping, which the optimizer
        pre-hook (after the clip) can no longer see. The step's last clip wins."""
        if isinstance(norm, torch.Tensor):
            self._ensure_open(time.perf_counter()).grad_norm = norm.detach()

    def optimizer_post(self, optimizer: Any) -> None:
        if self._lead is None or self._lead() is not optimizer:
            return
        self._lead_stepped = True
        now = time.perf_counter()
        if self._open is not None and self._open.optimizer_begin is not None:
            self._open.optimizer_s = now - self._open.optimizer_begin
        if self.mode == "explicit":
            return  # timed inside the explicit step, which ends it (HF on_step_end)
        self.mode = "optimizer"
        self.end_step(now)

    def scaler_step_started(self, scaler: Any) -> None:
        self._scaler = scaler
        self.amp["grad_scaler"] = True
        self._lead_stepped = False

    def scaler_step_ended(self, scaler: Any, optimizer: Any) -> None:
        """GradScaler skipped the optimizer step (inf/NaN gradients): the step still ends,
        with the scale it was skipped at."""
        lead = self._lead() if self._lead is not None else None
        if self._lead_stepped or self.mode == "explicit" or lead not in (None, optimizer):
            self._scaler = None
            return
        self.skipped_steps += 1
        if lead is None:
            self._lead = weakref.ref(optimizer)
        self.mode = "optimizer"
        if self._open is not None:
            if self._open.recorded is None:
                self._open.recorded = {}
            self._open.recorded.setdefault("marks", "amp_skipped")
        try:
            self.end_step(time.perf_counter())
        finally:
            self._scaler = None

    def autocast_entered(self, dtype: Any, device_type: str) -> None:
        text = f"{device_type}:{str(dtype).removeprefix('torch.')}"
        if text not in self.amp["autocast_dtypes"]:
            self.amp["autocast_dtypes"].append(text)

    def expect_explicit_steps(self, *, one_fetch_per_step: bool = False) -> None:
        """A framework callback delimits steps from now on (set before its loops run: the
        batches fetched before its first step, a sanity evaluation's among them, must not
        end batch-counted steps). ``one_fetch_per_step``: the framework fetches each
        training batch just before opening its step (Lightning), so a second fetch outside
        any step is an evaluation's and drops the first; HF's Trainer fetches all of an
        update's micro-batches before ``on_step_begin`` and keeps the default."""
        self.mode = "explicit"
        self._one_fetch_per_step = one_fetch_per_step

    def explicit_begin(self) -> None:
        self.mode = "explicit"
        self._explicit_open = True
        self._ensure_open(time.perf_counter())

    def discard_open_step(self) -> None:
        """What was opened since the last explicit end is not a training step (a framework's
        evaluation between two steps fetched batches): dropped, so its fetches are not the
        next step's data wait."""
        if self.mode == "explicit":
            self._open = None

    def explicit_end(self) -> None:
        if self._open is not None:
            self.end_step(time.perf_counter())

    def record(self, **values: Any) -> None:
        allowed = {"loss", "grad_norm", "batch_size"}
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise TypeError(
                f"probe.record: unknown field {unknown[0]!r}; allowed: loss, grad_norm, batch_size"
            )
        step = self._ensure_open(time.perf_counter())
        if step.recorded is None:
            step.recorded = {}
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                value = value.detach()
                if self.device is None:
                    self._set_device(value.device)
            step.recorded[key] = value

    # --- ending a step ---------------------------------------------------------------------

    def end_step(self, now: float) -> None:
        if self.forked:
            self._forked_step_seen()
            return
        if self.limit_reached and self.on_limit_ignored is not None:
            self.on_limit_ignored()  # ends the process
            return
        step = self._open
        if step is None:
            return
        # read at once, beside the step's end time: a wait for a CPU after it (starting the
        # profiler, below, on the first step) is not this step's
        waited_ns = self._cpu_waited_ns()
        self._open = None
        self._explicit_open = False
        if self.steps_done == 0:
            self._start_profiler()
        self.steps_done += 1
        recorded = step.recorded or _NOTHING_RECORDED
        marks = [recorded["marks"]] if recorded.get("marks") else []
        profiled = False
        if not self._profiler_done:
            state = self.profiler.state
            if state in ("warmup", "active"):
                marks.append(f"profiler_{state}")
            profiled = self.profiler.recording
            # a finished (or disabled) window never records again: stop asking it
            self._profiler_done = state is None and not profiled
        if self.steps_done == 1:
            marks.append("epoch_start")  # the first step pays for warm-up: not steady
        marks.extend(self.snapshots.marks(self.steps_done))
        samples = recorded.get("batch_size", step.samples)
        loss = recorded.get("loss")
        if loss is None and step.losses:
            if len(step.losses) == 1:
                loss = step.losses[0]
            else:
                stacked = torch.stack(step.losses)
                loss = stacked.sum() if self.micro_batch_losses_add_up else stacked.mean()
        grad_norm = recorded.get("grad_norm", step.grad_norm)
        scale = None
        if self._scaler is not None and self._scaler.is_enabled():
            scale = self._scaler._get_scale_async()
        data_wait_ms = step.data_wait_s * 1e3 if step.fetches else None
        store = self.key_values.take() if self.key_values.active else None
        optimizer_ms = step.optimizer_s * 1e3 if step.optimizer_s is not None else None
        # the token-weighted mean padded length: tokens x (6N + 12·L·H·Q·seq_len) is then the
        # sum of the micro-batches' model FLOPs, each over its own length
        seq_len = step.token_length_sum / step.tokens if step.tokens else None
        cpu_wait_ms = (
            (waited_ns - step.waited_ns) / 1e6
            if waited_ns is not None and step.waited_ns is not None
            else None
        )
        row = (
            self.steps_done,
            "batches" if self.mode == "batches" else "train",
            now + self._wall_offset,  # time.time() at the step's end, without a second clock
            samples,
            self._rss.read(),
            profiled,
            ",".join(marks) or None,
            data_wait_ms,
            (now - step.begin) * 1e3,
            optimizer_ms,
            step.tokens,
            seq_len,
            cpu_wait_ms,
        )
        if self._cuda:
            record = dict(zip(HOST_FIELDS, row, strict=True))
            record.update(cuda_memory(self.device))  # type: ignore[arg-type]
            if store is not None:
                record.update(store)
            times = CudaTimes(record, step.begin_event, step.optimizer_event, self._event())
            assert self.pending is not None
            self.pending.push(record, times, self._device_scalars(loss, grad_norm, scale))
        else:
            # the scale now: GradScaler.update() rewrites its tensor in place; the loss and
            # norm are read with the batch's others when it is written
            with self._host_lock:
                self._host_steps.append((row, loss, grad_norm, host_float(scale), store))
                if self._host_waiting_since is None:
                    self._host_waiting_since = now
            if len(self._host_steps) >= self._read_every:
                self._write_host_steps()
        self.profiler.step()
        self.snapshots.step_ended(self.steps_done)
        self.snapshots.step_begins(self.steps_done + 1)
        if self.max_steps is not None and self.steps_done >= self.max_steps:
            self.limit_reached = True
            raise StepLimitReached(self.steps_done)

    def _write_host_steps(self) -> None:
        """The CPU steps ended since the last batch, completed and written together: their
        losses and norms read in one stack each, their lines appended under one lock."""
        # the lock keeps the lines in step order when the sampler thread writes too
        with self._host_lock:
            rows, self._host_steps = self._host_steps, []
            self._host_waiting_since = None
            self._wall_offset = time.time() - time.perf_counter()  # follows NTP's slewing
            if not rows:
                return
            losses = read_floats([loss for _, loss, _, _, _ in rows])
            norms = read_floats([norm for _, _, norm, _, _ in rows])
            self.records.append_steps(
                [
                    host_step_record(row, loss, norm, scale, store)
                    for (row, _, _, scale, store), loss, norm in zip(
                        rows, losses, norms, strict=True
                    )
                ]
            )

    def _device_scalars(self, loss: Any, grad_norm: Any, scale: Any) -> Any:
        assert self._scalars is not None and self.device is not None
        if self._nan is None:
            self._nan = torch.full((), math.nan, device=self.device)
        nan = self._nan

        def on_device(value: Any) -> torch.Tensor:
            if isinstance(value, torch.Tensor):
                return value.to(self.device)
            return nan if value is None else torch.tensor(float(value), device=self.device)

        if isinstance(grad_norm, NormParts):
            grad_norm = grad_norm.total()
        loss_t, norm_t = on_device(loss), on_device(grad_norm)
        finite = torch.isfinite(loss_t) & torch.isfinite(norm_t)
        handle = self._scalars.add(loss_t, norm_t, finite, scale)
        return NullsForMissing(handle, loss is None, grad_norm is None)

    def _complete(
        self, record: dict[str, Any], times: dict[str, Any], values: dict[str, Any]
    ) -> dict[str, Any]:
        return step_record({**record, **times}, values, host_clock=False)

    def _write(self, record: dict[str, Any]) -> None:
        self.records.append_step(record)


_ACTIVE: Session | None = None


def active() -> Session | None:
    """The session of this process, when it runs under ``pipeline-doctor profile``."""
    return _ACTIVE


def activate(session: Session | None) -> None:
    global _ACTIVE
    _ACTIVE = session
