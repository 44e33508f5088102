"""What the instruments see of an unmodified script: torch's own entry points, wrapped.

- steps: the global optimizer hooks (``register_optimizer_step_pre_hook`` / ``_post_hook``);
- data wait: ``_BaseDataLoaderIter.__next__`` (every DataLoader iterator's ``next()``),
  timed only on the training thread: a loader iterated by a background thread is that
  thread's time, not a wait of the training step;
- the loss: the tensor ``Tensor.backward`` is called on;
- the gradient norm: ``clip_grad_norm_``'s own result when the script clips (the norm
  before clipping), else computed in the optimizer pre-hook (after any clipping);
- AMP: ``torch.autocast.__enter__`` (the dtype) and ``GradScaler.step`` (a skipped step);
- DataLoaders: ``DataLoader.__init__`` (probe/loaders.py).

A hook that breaks never breaks the script: the error becomes one note and the hook goes
quiet. Only StepLimitReached (``--steps``) is let through, on purpose.
"""

from __future__ import annotations

import functools
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

from probe.loaders import LoaderRecorder
from probe.session import Session, StepLimitReached


class Hooks:
    """Installs and removes every hook of one session."""

    def __init__(self, session: Session, overrides: dict[str, Any], base: Path | None):
        self.session = session
        self._undo: list[Callable[[], None]] = []
        self._broken: set[str] = set()
        self.loaders = LoaderRecorder(overrides, self._loader_built, self._note_once, base)

    def _note_once(self, text: str) -> None:
        self.session.note(text)

    def _guard(self, name: str, call: Callable[[], Any]) -> None:
        if name in self._broken:
            return
        try:
            call()
        except StepLimitReached:
            raise
        except Exception as exc:
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
        pre = register_optimizer_step_pre_hook(
            lambda optimizer, args, kwargs: self._guard(
                "optimizer", lambda: session.optimizer_pre(optimizer)
            )
        )
        post = register_optimizer_step_post_hook(
            lambda optimizer, args, kwargs: self._guard(
                "optimizer", lambda: session.optimizer_post(optimizer)
            )
        )
        self._undo += [pre.remove, post.remove]
        self.loaders.install()
        self._undo.append(self.loaders.uninstall)
        self._patch(dataloader_module._BaseDataLoaderIter, "__next__", self._timed_next)
        self._patch(torch.Tensor, "backward", self._seen_backward)
        # both names: scripts call torch.nn.utils.clip_grad_norm_ or import it from either
        self._patch(torch.nn.utils, "clip_grad_norm_", self._seen_clip)
        self._patch(torch.nn.utils.clip_grad, "clip_grad_norm_", self._seen_clip)
        self._patch(torch.amp.GradScaler, "step", self._scaler_step)
        self._patch(torch.amp.GradScaler, "scale", self._scaler_scale)
        self._patch(torch.amp.autocast_mode.autocast, "__enter__", self._autocast_enter)

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

        def __next__(iterator: Any) -> Any:
            if not session.on_training_thread():
                session.note(  # once: notes are kept once
                    "a DataLoader is iterated on a background thread: its time is not "
                    "the training thread's wait, so data_wait_ms counts only batches "
                    "fetched on the training thread"
                )
                return original(iterator)
            started = time.perf_counter()
            self._guard("data wait", lambda: session.fetch_started(started))
            cpu_started = time.thread_time()
            batch = original(iterator)
            cpu_s = time.thread_time() - cpu_started  # the rest of the wait: I/O or workers
            ended = time.perf_counter()
            loader = getattr(iterator, "_probe_index", None)
            self._guard(
                "data wait", lambda: session.fetch_ended(started, ended, batch, loader, cpu_s)
            )
            return batch

        return __next__

    def _seen_backward(self, original: Any) -> Any:
        session = self.session

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if session.on_training_thread():
                self._guard("loss", lambda: session.backward_called(tensor))
            return original(tensor, *args, **kwargs)

        return backward

    def _seen_clip(self, original: Any) -> Any:
        session = self.session

        def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
            norm = original(*args, **kwargs)
            if session.on_training_thread():
                self._guard("gradient norm", lambda: session.clip_norm_seen(norm))
            return norm

        return clip_grad_norm_

    def _scaler_step(self, original: Any) -> Any:
        session = self.session

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not scaler.is_enabled():
                return original(scaler, optimizer, *args, **kwargs)
            self._guard("GradScaler", lambda: session.scaler_step_started(scaler))
            result = original(scaler, optimizer, *args, **kwargs)
            self._guard("GradScaler", lambda: session.scaler_step_ended(scaler, optimizer))
            return result

        return step

    def _scaler_scale(self, original: Any) -> Any:
        def scale(scaler: Any, outputs: Any) -> Any:
            scaled = original(scaler, outputs)
            if scaler.is_enabled() and isinstance(scaled, torch.Tensor):
                # backward() then sees loss x scale: the record divides it back, on the device
                scaled._probe_scale = scaler._scale  # type: ignore[attr-defined]
            return scaled

        return scale

    def _autocast_enter(self, original: Any) -> Any:
        session = self.session

        def __enter__(autocast: Any) -> Any:
            if getattr(autocast, "_enabled", False):
                self._guard(
                    "autocast",
                    lambda: session.autocast_entered(
                        getattr(autocast, "fast_dtype", None), str(autocast.device)
                    ),
                )
            return original(autocast)

        return __enter__
