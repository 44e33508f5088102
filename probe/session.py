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
- a DataLoader batch, while no optimizer has stepped yet (evaluation, inference): each
  batch fetched on the training thread ends the step before it. Batches fetched after
  the last optimizer step (a final evaluation) are left out: their step never ends.

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
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from diagnostics.runs import TRACE_DIR, RankRecords, RunFolder, RunWriter
from probe.deferred import DeviceScalars, HostScalars, PendingSteps
from probe.profiler import NullProfiler, ProfilerWindow, make_profiler
from probe.step_values import (
    CudaTimes,
    NormParts,
    NullsForMissing,
    batch_samples,
    gradient_norm,
    host_float,
)
from probe.steps import Resolved, RssReader, cuda_memory
from probe.system import NullSampler, make_sampler


class StepLimitReached(BaseException):
    """Raised from the hook that ends step ``--steps``: unwinds the script like an exit.

    A BaseException, as SystemExit is, so the script's own ``except Exception`` does not
    swallow it."""


@dataclass
class _OpenStep:
    begin: float  # perf_counter seconds
    data_wait_s: float = 0.0
    fetches: int = 0  # batches fetched on the training thread
    samples: int | None = None
    losses: list[Any] = field(default_factory=list)
    grad_norm: Any = None
    optimizer_begin: float | None = None
    optimizer_s: float | None = None
    begin_event: Any = None  # CUDA event at the step's start (the previous step's end)
    optimizer_event: Any = None
    recorded: dict[str, Any] = field(default_factory=dict)  # probe.record(...)


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
    ):
        self.run_dir = run_dir
        self.rank = rank
        self.max_steps = max_steps
        self.records = RankRecords(run_dir, rank)
        self.manifest = RunWriter(path=run_dir) if rank == 0 else None
        self.training_thread = threading.get_ident()
        self._lock = threading.Lock()  # the sampler thread notes too
        self._rss = RssReader()
        self.device: torch.device | None = None
        self.mode: str | None = None  # "batches", "optimizer" or "explicit" once known
        self.steps_done = 0
        self._open: _OpenStep | None = None
        self._lead: weakref.ref[Any] | None = None
        self.optimizer_steps: dict[int, dict[str, Any]] = {}
        self.amp: dict[str, Any] = {"autocast_dtypes": [], "grad_scaler": False}
        self.skipped_steps = 0
        self._scaler: Any = None  # the GradScaler whose step() is running
        self._lead_stepped = False
        self._scalars: DeviceScalars | None = None
        self._host_scalars = HostScalars(read_every)
        self._nan: torch.Tensor | None = None  # a device NaN for figures a step lacks
        self._read_every = read_every
        self.pending: PendingSteps | None = None
        self._window = window or ProfilerWindow()
        self.profiler: NullProfiler = NullProfiler()
        self._sampler: NullSampler = make_sampler(
            self._on_sample, self.note, enabled=sample_hz > 0, sample_hz=sample_hz
        )
        self.notes: list[str] = []
        # loader index -> [batches, seconds waited, of which CPU seconds of this thread]
        self.loader_waits: dict[Any, list[float]] = {}

    # --- lifetime ------------------------------------------------------------------------

    def start(self) -> None:
        self._sampler.start()
        self.pending = PendingSteps(self._write, self._complete, self._host_scalars)

    def _on_sample(self, row: dict[str, Any]) -> None:
        self.records.append_sample(row)
        # a script that stops stepping (a long evaluation) still shows its last steps
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
        self._open = None
        if self.pending is not None:
            with contextlib.suppress(Exception):  # a broken device must not hide the end
                self.pending.flush()
        self.profiler.stop()
        self._sampler.stop()

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
            self._open = _OpenStep(begin=now)
            if self._cuda:
                self._open.begin_event = self._event()
        return self._open

    @property
    def _cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    def _event(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def fetch_started(self, now: float) -> None:
        """A DataLoader ``__next__`` on the training thread is about to run."""
        if self.mode in (None, "batches") and self._open is not None and self._open.fetches:
            self.mode = "batches"
            self.end_step(now)
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

    def backward_called(self, loss: torch.Tensor) -> None:
        if self.device is None:
            self._set_device(loss.device)
        step = self._ensure_open(time.perf_counter())
        if loss.numel() == 1:
            scale = getattr(loss, "_probe_scale", None)  # GradScaler.scale(loss)'s output
            step.losses.append(loss.detach() / scale if scale is not None else loss.detach())

    def _set_device(self, device: torch.device) -> None:
        self.device = device
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

    def optimizer_pre(self, optimizer: Any) -> None:
        info = self.optimizer_steps.setdefault(
            id(optimizer), {"class": type(optimizer).__name__, "steps": 0}
        )
        info["steps"] += 1
        if self._lead is None or self._lead() is None:
            self._lead = weakref.ref(optimizer)
        if self._lead() is not optimizer or self.mode == "explicit":
            return
        now = time.perf_counter()
        step = self._ensure_open(now)
        step.optimizer_begin = now
        if self._cuda:
            step.optimizer_event = self._event()
        grads = [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if getattr(p, "grad", None) is not None
        ]
        if grads and step.grad_norm is None:
            # on the device, before the update; read with the step's other scalars later
            step.grad_norm = gradient_norm(grads)

    def clip_norm_seen(self, norm: Any) -> None:
        """``clip_grad_norm_``'s result: the norm before clipping, which the optimizer
        pre-hook (after the clip) can no longer see. The step's last clip wins."""
        if isinstance(norm, torch.Tensor):
            self._ensure_open(time.perf_counter()).grad_norm = norm.detach()

    def optimizer_post(self, optimizer: Any) -> None:
        if self._lead is None or self._lead() is not optimizer or self.mode == "explicit":
            return
        self._lead_stepped = True
        now = time.perf_counter()
        self.mode = "optimizer"
        if self._open is not None and self._open.optimizer_begin is not None:
            self._open.optimizer_s = now - self._open.optimizer_begin
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
            self._open.recorded.setdefault("marks", "amp_skipped")
        try:
            self.end_step(time.perf_counter())
        finally:
            self._scaler = None

    def autocast_entered(self, dtype: Any, device_type: str) -> None:
        text = f"{device_type}:{str(dtype).removeprefix('torch.')}"
        if text not in self.amp["autocast_dtypes"]:
            self.amp["autocast_dtypes"].append(text)

    def explicit_begin(self) -> None:
        self.mode = "explicit"
        self._ensure_open(time.perf_counter())

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
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                value = value.detach()
                if self.device is None:
                    self._set_device(value.device)
            step.recorded[key] = value

    # --- ending a step ---------------------------------------------------------------------

    def end_step(self, now: float) -> None:
        step = self._open
        if step is None:
            return
        self._open = None
        if self.steps_done == 0:
            self._start_profiler()
        self.steps_done += 1
        marks = [m for m in (step.recorded.get("marks"),) if m]
        state = self.profiler.state
        if state in ("warmup", "active"):
            marks.append(f"profiler_{state}")
        if self.steps_done == 1:
            marks.append("epoch_start")  # the first step pays for warm-up: not steady
        samples = step.recorded.get("batch_size", step.samples)
        record = {
            "step": self.steps_done,
            "phase": "batches" if self.mode == "batches" else "train",
            "wall_time": time.time(),
            "batch_size": samples,
            "rss_bytes": self._rss.read(),
            "profiled": self.profiler.recording,
            "marks": ",".join(marks) or None,
            **(cuda_memory(self.device) if self.device is not None else {}),
        }
        host = {
            "data_wait_ms": step.data_wait_s * 1e3 if step.fetches else None,
            "step_time_ms": (now - step.begin) * 1e3,
            "optimizer_ms": step.optimizer_s * 1e3 if step.optimizer_s is not None else None,
        }
        loss = step.recorded.get("loss")
        if loss is None and step.losses:
            loss = step.losses[0] if len(step.losses) == 1 else torch.stack(step.losses).mean()
        grad_norm = step.recorded.get("grad_norm", step.grad_norm)
        scale = None
        if self._scaler is not None and self._scaler.is_enabled():
            scale = self._scaler._get_scale_async()
        if self._cuda:
            times: Any = CudaTimes(host, step.begin_event, step.optimizer_event, self._event())
            scalars: Any = self._device_scalars(loss, grad_norm, scale)
        else:
            times = Resolved(host)
            # the scale now: GradScaler.update() rewrites its tensor in place
            scalars = self._host_scalars.add(loss, grad_norm, host_float(scale))
        assert self.pending is not None
        self.pending.push(record, times, scalars)
        self.profiler.step()
        if self.max_steps is not None and self.steps_done >= self.max_steps:
            raise StepLimitReached(self.steps_done)

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
        step_ms = times["step_time_ms"]
        data_ms = times.get("data_wait_ms")
        optimizer_ms = times.get("optimizer_ms")
        compute_ms = None
        if not self._cuda and data_ms is not None:
            compute_ms = max(0.0, step_ms - data_ms - (optimizer_ms or 0.0))
        batch = record.get("batch_size")
        return {
            "step": record["step"],
            "epoch": None,
            "phase": record["phase"],
            "wall_time": record["wall_time"],
            "step_time_ms": step_ms,
            "data_wait_ms": data_ms,
            "h2d_ms": None,  # the copy is inside the user's code: not told apart
            "compute_ms": compute_ms,
            "optimizer_ms": optimizer_ms,
            "loss": values.get("loss"),
            "grad_norm": values.get("grad_norm"),
            "amp_scale": values.get("amp_scale"),
            "batch_size": batch,
            "samples_per_s": batch / max(step_ms, 1e-6) * 1e3 if batch else None,
            **{k: record.get(k) for k in ("rss_bytes", "profiled", "marks")},
            **{
                k: record[k]
                for k in ("cuda_allocated_bytes", "cuda_reserved_bytes", "cuda_peak_bytes")
                if k in record
            },
        }

    def _write(self, record: dict[str, Any]) -> None:
        self.records.append_step(record)


_ACTIVE: Session | None = None


def active() -> Session | None:
    """The session of this process, when it runs under ``pipeline-doctor profile``."""
    return _ACTIVE


def activate(session: Session | None) -> None:
    global _ACTIVE
    _ACTIVE = session
