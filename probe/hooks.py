"""What the instruments see of an unmodified script: torch's own entry points, wrapped.

- steps: the global optimizer hooks (``register_optimizer_step_pre_hook`` / ``_post_hook``),
  on the training thread only (another thread's optimizer is counted apart), and
  ``Optimizer.__init__`` (a script that builds none counts its steps by ``backward()``);
- data wait: ``_BaseDataLoaderIter.__next__`` (every DataLoader iterator's ``next()``),
  timed only on the training thread: a loader iterated by a background thread is that
  thread's time, not a wait of the training step;
- the loss: the tensor ``Tensor.backward`` is called on;
- the gradient norm: ``clip_grad_norm_``'s own result when the script clips (the norm
  before clipping), else computed in the optimizer pre-hook (after any clipping);
- AMP: ``torch.autocast.__enter__`` (the dtype) and ``GradScaler.step`` (a skipped step);
- processes the script starts itself (``multiprocessing``'s ``Process.start``: a
  ``torch.multiprocessing.spawn``, a ``Pool``; not a DataLoader's workers), counted for a note:
  their steps are not seen;
- DataLoaders: ``DataLoader.__init__`` (probe/loaders.py);
- key-value reads in DataLoader workers: the fetchers' ``fetch`` and the main process's
  ``_process_data`` carry them back with each batch (probe/key_values.py; pass-throughs
  until the script imports a store library, which probe/integrations patches).

A hook that breaks never breaks the script: the error becomes one note and the hook goes
quiet. Only StepLimitReached (``--steps``) is let through, on purpose.
"""

from __future__ import annotations

import functools
import multiprocessing.process
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.data import dataloader as dataloader_module

from probe.key_values import DataLoaderPlumbing
from probe.loaders import LoaderRecorder
from probe.session import Session, StepLimitReached


def _started_function(target: Any, args: Any) -> str | None:
    """The script's function a started process runs: torch.multiprocessing.spawn wraps it
    (``_wrap(fn, i, args, error_file)``), so its first argument is the one to name."""
    if getattr(target, "__module__", None) == "torch.multiprocessing.spawn" and args:
        target = args[0]
    return getattr(target, "__qualname__", None)


class Hooks:
    """Installs and removes every hook of one session."""

    def __init__(self, session: Session, overrides: dict[str, Any], base: Path | None):
        self.session = session
        self.base = base  # the script's folder: sites under it are shown relative to it
        self._undo: list[Callable[[], None]] = []
        self._broken: set[str] = set()
        self.loaders = LoaderRecorder(overrides, self._loader_built, self._note_once, base)
        self.worker_reads = DataLoaderPlumbing(self._note_once)

    def _note_once(self, text: str) -> None:
        self.session.note(text)

    def _guarded(self, name: str, call: Callable[..., Any]) -> Callable[..., None]:
        """``call``, quiet from its first error on (made once: a closure per call and
        hook was a measurable part of a tiny step)."""
        broken = self._broken

        def guarded(*args: Any) -> None:
            if name in broken:
                return
            try:
                call(*args)
            except StepLimitReached:
                raise
            except Exception as exc:
                self._stopped(name, exc)

        return guarded

    def _stopped(self, name: str, exc: Exception) -> None:
        self._broken.add(name)
        self.session.note(
            f"instrument {name} stopped: {type(exc).__name__}: {exc} (the script ran on)"
        )

    def _loader_built(self, record: dict[str, Any]) -> None:
        manifest = self.session.manifest
        if manifest is not None:
            manifest.append_dataloader(record)

    def install(self) -> None:
        session = self.session
        optimizer_pre = self._guarded("optimizer", session.optimizer_pre)
        optimizer_post = self._guarded("optimizer", session.optimizer_post)
        background = self._guarded("optimizer", session.background_optimizer_step)
        on_training_thread = session.on_training_thread

        def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if on_training_thread():
                optimizer_pre(optimizer)
            else:
                background(optimizer)

        def post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if on_training_thread():
                optimizer_post(optimizer)

        pre = register_optimizer_step_pre_hook(pre_hook)
        post = register_optimizer_step_post_hook(post_hook)
        self._undo += [pre.remove, post.remove]
        self._patch(torch.optim.Optimizer, "__init__", self._optimizer_built)
        self.loaders.install()
        self._undo.append(self.loaders.uninstall)
        self.worker_reads.install()
        self._undo.append(self.worker_reads.uninstall)
        self._patch(dataloader_module._BaseDataLoaderIter, "__next__", self._timed_next)
        self._patch(torch.Tensor, "backward", self._seen_backward)
        # both names: scripts call torch.nn.utils.clip_grad_norm_ or import it from either
        self._patch(torch.nn.utils, "clip_grad_norm_", self._seen_clip)
        self._patch(torch.nn.utils.clip_grad, "clip_grad_norm_", self._seen_clip)
        self._patch(torch.amp.GradScaler, "step", self._scaler_step)
        self._patch(torch.amp.GradScaler, "scale", self._scaler_scale)
        self._patch(torch.amp.autocast_mode.autocast, "__enter__", self._autocast_enter)
        self._patch(multiprocessing.process.BaseProcess, "start", self._process_started)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name]
        wrapper = functools.wraps(original)(make(original))
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original))

    # --- the wrappers -----------------------------------------------------------------

    def _timed_next(self, original: Any) -> Any:
        session = self.session
        training_thread, get_ident = session.training_thread, threading.get_ident
        fetch_started = self._guarded("data wait", session.fetch_started)
        fetch_ended = self._guarded("data wait", session.fetch_ended)
        perf_counter, thread_time = time.perf_counter, time.thread_time

        def __next__(iterator: Any) -> Any:
            if get_ident() != training_thread:
                session.note(  # once: notes are kept once
                    "a DataLoader is iterated on a background thread: its time is not "
                    "the training thread's wait, so data_wait_ms counts only batches "
                    "fetched on the training thread"
                )
                return original(iterator)
            started = perf_counter()
            fetch_started(started)
            cpu_started = thread_time()
            batch = original(iterator)
            cpu_s = thread_time() - cpu_started  # the rest of the wait: I/O or workers
            ended = perf_counter()
            loader = getattr(iterator, "_probe_index", None)
            fetch_ended(started, ended, batch, loader, cpu_s)
            return batch

        return __next__

    def _seen_backward(self, original: Any) -> Any:
        training_thread, get_ident = self.session.training_thread, threading.get_ident
        backward_called = self._guarded("loss", self.session.backward_called)

        backward_done = self._guarded("steps", self.session.backward_done)
        perf_counter = time.perf_counter

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if get_ident() != training_thread:
                return original(tensor, *args, **kwargs)
            backward_called(tensor)
            result = original(tensor, *args, **kwargs)
            backward_done(perf_counter())
            return result

        return backward

    def _optimizer_built(self, original: Any) -> Any:
        session = self.session
        built = self._guarded("optimizer", session.optimizer_built)

        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            if session.on_training_thread():
                built()

        return __init__

    def _seen_clip(self, original: Any) -> Any:
        session = self.session
        clip_norm_seen = self._guarded("gradient norm", session.clip_norm_seen)

        def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
            norm = original(*args, **kwargs)
            if session.on_training_thread():
                clip_norm_seen(norm)
            return norm

        return clip_grad_norm_

    def _scaler_step(self, original: Any) -> Any:
        session = self.session
        step_started = self._guarded("GradScaler", session.scaler_step_started)
        step_ended = self._guarded("GradScaler", session.scaler_step_ended)

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not scaler.is_enabled() or not session.on_training_thread():
                return original(scaler, optimizer, *args, **kwargs)
            step_started(scaler)
            result = original(scaler, optimizer, *args, **kwargs)
            step_ended(scaler, optimizer)
            return result

        return step

    def _scaler_scale(self, original: Any) -> Any:
        session = self.session

        def scale(scaler: Any, outputs: Any) -> Any:
            scaled = original(scaler, outputs)
            if scaler.is_enabled() and isinstance(scaled, torch.Tensor):
                # backward() then sees loss x scale: the record divides it back, on the device
                scaled._probe_scale = scaler._scale  # type: ignore[attr-defined]
                session.scaled_losses = True
            return scaled

        return scale

    def _process_started(self, original: Any) -> Any:
        session = self.session
        seen = self._guarded("processes", session.process_started)

        def start(process: Any) -> Any:
            # a DataLoader's workers are the loader's, timed as its wait; any other process
            # the script starts (torch.multiprocessing.spawn, a Pool) runs unwatched
            target = getattr(process, "_target", None)
            if getattr(target, "__name__", None) != "_worker_loop":
                seen(_started_function(target, getattr(process, "_args", ())) or "a process")
            return original(process)

        return start

    def _autocast_enter(self, original: Any) -> Any:
        session = self.session

        def entered(autocast: Any) -> None:
            session.autocast_entered(getattr(autocast, "fast_dtype", None), str(autocast.device))

        autocast_entered = self._guarded("autocast", entered)

        def __enter__(autocast: Any) -> Any:
            if getattr(autocast, "_enabled", False):
                autocast_entered(autocast)
            return original(autocast)

        return __enter__
