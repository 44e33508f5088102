"""Lightning: a ``Callback`` that gives a profiled run its steps, loss and gradient norm.

Under ``pipeline-doctor profile`` it is attached to every ``Trainer`` the script builds, once
the script imports ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``: the finder
of :mod:`probe.integrations` waits for either package to finish importing and then wraps
``Trainer.__init__``. Nothing here imports Lightning until the script has. A script may also
pass it itself, ``Trainer(callbacks=[PipelineDoctorCallback()])``: a Trainer that already
holds one gets no second, and outside a profiled run it does nothing.

What it tells the session (probe/session.py, explicit steps):

- a step is one optimizer step of the training loop: it opens at the batch's fetch (or
  ``on_train_batch_start``) and ends at ``on_train_batch_end`` of a batch in which the
  optimizer stepped. With ``accumulate_grad_batches=k`` a step holds k batches. The global
  optimizer hooks still count the optimizers' steps (``run.json`` ``probe.optimizers``) but,
  steps being explicit, no longer end them: nothing is counted twice. Validation, sanity
  checks and ``trainer.test`` batches belong to no step.
- the loss: the training step's loss from ``outputs``. Lightning divides it by k before
  ``backward()`` (and in ``outputs``) when accumulating; it is multiplied back, and a step's
  loss is the mean over its batches.
- the gradient norm: computed in ``on_before_optimizer_step``, after ``backward()`` and before
  any ``gradient_clip_val`` clipping. The optimizer pre-hook cannot see it: Lightning runs the
  training step and ``backward()`` inside ``optimizer.step(closure)``, after that hook.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from probe import session as sessions
from probe.step_values import gradient_norm

# the unified package's name, then the standalone one; both hold the same Trainer code
PACKAGES = ("lightning.pytorch", "pytorch_lightning")

_CLASSES: dict[str, type] = {}


class _StepsFromLightning:
    """The hooks, whichever package's ``Callback`` the concrete class derives from."""

    automatic = False  # attached by the wrapper rather than by the script
    package = ""  # the Lightning package whose Callback the concrete class derives from

    def __init__(self) -> None:
        self._losses: list[Any] = []
        self._stepped = False  # the optimizer stepped in this step's batches

    def _session(self, trainer: Any) -> sessions.Session | None:
        session = sessions.active()
        if session is None:
            return None
        ours = [c for c in trainer.callbacks if isinstance(c, _StepsFromLightning)]
        return session if ours and ours[0] is self else None  # one of them drives

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        session = self._session(trainer)
        if session is None or stage != "fit":
            return
        session.expect_explicit_steps(one_fetch_per_step=True)
        ours = [c for c in trainer.callbacks if isinstance(c, _StepsFromLightning)]
        session.update_manifest(
            lightning={
                "package": self.package,
                "callbacks": len(ours),
                "attached": "automatic" if self.automatic else "by the script",
            }
        )

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        session = self._session(trainer)
        if session is not None:
            session.explicit_begin()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        session = self._session(trainer)
        if session is None or self._stepped:  # several optimizers: the first one's norm
            return
        self._stepped = True
        grads = [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if getattr(p, "grad", None) is not None
        ]
        if grads:
            session.record(grad_norm=gradient_norm(grads))

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        session = self._session(trainer)
        if session is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if hasattr(loss, "detach") and loss.numel() == 1:
            # automatic optimization returns the loss divided by accumulate_grad_batches
            accumulated = pl_module.automatic_optimization and trainer.accumulate_grad_batches
            self._losses.append(loss.detach() * (accumulated or 1))
        if not self._stepped:  # accumulating: the step goes on over the next batch
            return
        if self._losses:
            import torch

            losses = self._losses
            session.record(loss=losses[0] if len(losses) == 1 else torch.stack(losses).mean())
        self._losses, self._stepped = [], False
        session.explicit_end()


def callback_class(package: str) -> type:
    """The callback as a subclass of ``package``'s ``Callback`` (imports the package)."""
    if package not in _CLASSES:
        base = importlib.import_module(package).Callback
        _CLASSES[package] = type(
            "PipelineDoctorCallback",
            (_StepsFromLightning, base),
            {"__module__": __name__, "__doc__": __doc__, "package": package},
        )
    return _CLASSES[package]


def _default_package() -> str:
    for package in PACKAGES:  # the one the script imported, else the first installed
        if package in sys.modules:
            return package
    for package in PACKAGES:
        if importlib.util.find_spec(package.split(".")[0]) is not None:
            return package
    raise ImportError("PipelineDoctorCallback needs lightning or pytorch_lightning installed")


def __getattr__(name: str) -> Any:
    if name == "PipelineDoctorCallback":
        return callback_class(_default_package())
    raise AttributeError(name)


def patch_lightning_package(module: ModuleType) -> Callable[[], None]:
    """Wraps the Lightning package's ``Trainer.__init__`` (probe.integrations' finder calls
    it once the script has imported ``module``): a Trainer built during a profiled run gets
    the callback unless it has one. Returns the undo."""
    package = module.__name__
    trainer_class = module.Trainer
    original = trainer_class.__init__
    if getattr(original, "_probe_attaches", False):  # one package aliasing the other
        return lambda: None
    callback = callback_class(package)

    @functools.wraps(original)
    def __init__(trainer: Any, *args: Any, **kwargs: Any) -> None:
        original(trainer, *args, **kwargs)
        if sessions.active() is None:
            return
        if not any(isinstance(c, _StepsFromLightning) for c in trainer.callbacks):
            attached = callback()
            attached.automatic = True
            # last: a step's end then includes the other callbacks' batch-end work
            trainer.callbacks.append(attached)

    __init__._probe_attaches = True  # type: ignore[attr-defined]
    trainer_class.__init__ = __init__

    def undo() -> None:
        trainer_class.__init__ = original

    return undo
