"""HF ``transformers.Trainer`` under the probe: a ``TrainerCallback`` that marks its steps.

Attached by itself when a profiled script builds a ``Trainer`` (``Trainer.__init__`` is
patched as the script imports ``transformers.trainer``: see probe/integrations), or by
hand, which is the same outside ``pipeline-doctor profile`` (then it does nothing)::

    from probe.integrations.hf import PipelineDoctorCallback
    trainer.add_callback(PipelineDoctorCallback())

What it does with the session (docs/PROFILE.md):

- ``on_step_begin`` / ``on_step_end`` delimit a step (the session's explicit mode): one
  step per optimizer update, ``state.global_step`` of them, however many micro-batches
  ``gradient_accumulation_steps`` puts in each. The global optimizer hooks still time the
  optimizer and see the gradient norm inside that step, but no longer end steps, so an
  update is never counted twice. The step opens at its first batch fetch (the Trainer
  fetches a step's micro-batches before ``on_step_begin``), so its data wait is in it.
- the loss: the Trainer divides each micro-batch's loss by its share of the update before
  ``backward()`` (or normalises it by the update's token count), so the step's loss is
  the sum of what ``backward()`` saw, not their mean.
- the gradient norm: the Trainer's own ``clip_grad_norm_`` (the norm before clipping; with
  ``max_grad_norm=0`` it calls it with an infinite bound), seen by the clip hook, on the
  device, for every step.
- evaluation inside ``train()`` (``eval_strategy``) fetches its batches between two
  steps: ``on_evaluate`` drops what they opened, so their wait is not the next step's.
- the model's shape (``on_train_begin``'s ``model``): run.json's ``model_shape``, what
  the analysis's MFU of a script run needs (probe/model_shape.py; a note says why when
  the model cannot be sized).
- ``on_log``'s ``loss`` is a mean over ``logging_steps`` updates and its ``grad_norm`` the
  last update's, both already read with ``.item()``, and they arrive after the step has
  ended: the per-step device values above are kept, and ``on_log`` only counts the logs.

Several instances on one Trainer (attached automatically and added by hand) act once: the
first one to see a training run owns it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from transformers import TrainerCallback

from probe import session as sessions
from probe.model_shape import model_shape

_OWNER = "_pipeline_doctor_callback"  # on TrainerState: the callback driving this run


class PipelineDoctorCallback(TrainerCallback):
    """Drives the running probe session's steps from the Trainer's own (no-op without one)."""

    def __init__(self) -> None:
        self.steps_begun = 0
        self.steps_ended = 0
        self.logs_seen = 0

    def _owns(self, state: Any) -> bool:
        owner = getattr(state, _OWNER, None)
        if owner is None:
            setattr(state, _OWNER, self)
            return True
        return owner is self

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        session = sessions.active()
        if session is not None and self._owns(state):
            # the Trainer fetches a step's micro-batches before on_step_begin: in the
            # session's batch mode the second fetch would end a step of its own
            session.expect_explicit_steps()
            session.micro_batch_losses_add_up = True
            _record_model_shape(session, kwargs.get("model"))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        session = sessions.active()
        if session is not None and self._owns(state):
            self.steps_begun += 1
            session.explicit_begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        session = sessions.active()
        if session is not None and self._owns(state):
            self.steps_ended += 1
            session.explicit_end()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # evaluation runs between on_step_end and the next step's first fetch: its batches
        # opened a step that is no training step's (their wait is not the next step's)
        session = sessions.active()
        if session is not None and self._owns(state):
            session.discard_open_step()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
        if sessions.active() is not None and self._owns(state):
            self.logs_seen += 1


def _record_model_shape(session: Any, model: Any) -> None:
    """run.json's ``model_shape`` for the analysis's MFU, or a note why there is none. Once
    per training run; a failure here must not stop the script's training."""
    try:
        shape, reason = model_shape(model, getattr(model, "config", None))
    except Exception as exc:  # the user's model, whatever it raises
        shape, reason = None, f"reading the model failed ({type(exc).__name__}: {exc})"
    if shape is not None:
        session.update_manifest(model_shape={"source": "hf_trainer", **shape})
    else:
        session.note(f"no model FLOPs (MFU) for this run: {reason}")


def attached(trainer: Any) -> list[PipelineDoctorCallback]:
    """The PipelineDoctorCallbacks on ``trainer``."""
    return [c for c in trainer.callback_handler.callbacks if isinstance(c, PipelineDoctorCallback)]


def patch_trainer_module(module: ModuleType) -> Callable[[], None]:
    """Wraps ``module.Trainer.__init__`` to attach one callback while a session runs."""
    trainer_class = module.Trainer
    original = trainer_class.__dict__["__init__"]
    counts = {"trainers": 0, "callbacks_attached": 0}  # run.json: integrations.hf_trainer

    @functools.wraps(original)
    def __init__(trainer: Any, *args: Any, **kwargs: Any) -> None:
        original(trainer, *args, **kwargs)
        session = sessions.active()
        if session is None:
            return
        counts["trainers"] += 1
        if not attached(trainer):  # the script may have passed one in callbacks=[...]
            trainer.add_callback(PipelineDoctorCallback())
            counts["callbacks_attached"] += 1
        session.update_manifest(integrations={"hf_trainer": dict(counts)})

    trainer_class.__init__ = __init__
    return lambda: setattr(trainer_class, "__init__", original)
