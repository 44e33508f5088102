"""Checkpoints: save and restore a trainer exactly, loading only tensors and plain types.

A checkpoint is read with ``torch.load(weights_only=True)``: its unpickler builds tensors,
dicts, lists, tuples, strings and numbers and refuses everything else, so a crafted
``step_*.pt`` placed in a run folder cannot run code on ``resume``. That is why every RNG
state is stored as a tensor or plain values (format 2):

- Python ``random``: ``{"version": int, "state": int64 tensor, "gauss_next": float | None}``
- NumPy (MT19937): ``{"keys": int64 tensor, "pos", "has_gauss", "cached_gaussian"}``
  (format 1 pickled the NumPy tuple with its ndarray, which ``weights_only`` refuses)
- torch CPU and CUDA: the byte tensors torch itself returns

A file that does not load (torn, truncated, foreign, another format) is set aside as
``<name>.corrupt`` and the one before it is tried, so one bad file never loses a run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from diagnostics.runs import CHECKPOINT_DIR
from trainer.position import Position
from trainer.run_io import os_error_behind


class Trainer(Protocol):
    """What a checkpoint saves and restores: the loop's Trainer has it (named by its
    attributes, so this module does not import the loop that imports it)."""

    config: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any
    vocab: Any
    cuda: bool
    position: Position
    total_loss: float | torch.Tensor
    nonfinite_steps: int
    first_nonfinite_step: int | None
    evaluations: list[dict[str, Any]]


log = logging.getLogger("trainer")

CHECKPOINT_FORMAT = 2
CHECKPOINTS_KEPT = 2  # the newest two: one may be torn if the process dies mid-save
CORRUPT_SUFFIX = ".corrupt"


class CheckpointError(Exception):
    """A checkpoint file that cannot be used: ``"<file>: <what is wrong>"``."""


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINT_DIR / f"step_{step:08d}.pt"


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints, oldest first (set-aside ``.corrupt`` files excluded)."""
    return sorted((run_dir / CHECKPOINT_DIR).glob("step_*.pt"))


# --- RNG states as tensors and plain values ---------------------------------------------


def capture_rng(cuda: bool) -> dict[str, Any]:
    version, state, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    if kind != "MT19937":  # pragma: no cover - the legacy global generator is always MT
        raise ValueError(f"NumPy global generator {kind} is not MT19937")
    return {
        "python": {
            "version": int(version),
            "state": torch.tensor(state, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
        "numpy": {
            # uint32 words held in int64: torch has no uint32 tensor that round-trips here
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if cuda else None,
    }


def restore_rng(rng: dict[str, Any], cuda: bool) -> None:
    # a checkpoint loaded with map_location="cuda" holds these tensors on the GPU
    python = rng["python"]
    random.setstate(
        (
            int(python["version"]),
            tuple(int(x) for x in python["state"].cpu().tolist()),
            python["gauss_next"],
        )
    )
    numpy = rng["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy["keys"].cpu().numpy().astype(np.uint32),
            int(numpy["pos"]),
            int(numpy["has_gauss"]),
            float(numpy["cached_gaussian"]),
        )
    )
    torch.set_rng_state(rng["torch"].cpu())
    if cuda and rng["cuda"] is not None:
        torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])


# --- save -------------------------------------------------------------------------------


def capture(trainer: Trainer) -> dict[str, Any]:
    """Everything a resumed run needs to continue bit-exactly, as tensors and plain types."""
    total_loss = trainer.total_loss
    return {
        "format": CHECKPOINT_FORMAT,
        "position": vars(trainer.position).copy(),
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "rng": capture_rng(trainer.cuda),
        "total_loss": float(
            total_loss.detach() if isinstance(total_loss, torch.Tensor) else total_loss
        ),
        "nonfinite_steps": trainer.nonfinite_steps,
        "first_nonfinite_step": trainer.first_nonfinite_step,
        "evaluations": trainer.evaluations,
        "config": trainer.config.to_dict(),
        "vocab_kept_ids": trainer.vocab.kept_ids,
    }


def save(run_dir: Path, step: int, state: dict[str, Any]) -> Path:
    """Writes ``step_<step>.pt`` atomically and keeps the newest CHECKPOINTS_KEPT."""
    path = checkpoint_path(run_dir, step)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        # our own file object: torch then reports a failed write as a RuntimeError whose
        # context is the OSError, which names the cause (a full disk) for the run's status
        with tmp.open("wb") as handle:
            torch.save(state, handle)
        os.replace(tmp, path)  # a kill mid-save leaves only the .tmp, never a torn .pt
    except RuntimeError as exc:
        cause = os_error_behind(exc)
        if cause is None:
            raise
        raise cause from exc
    finally:
        # a failed save (a full disk) leaves no partial file to fill the disk further
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    for old in checkpoints(run_dir)[:-CHECKPOINTS_KEPT]:
        old.unlink(missing_ok=True)
    log.info("checkpoint %s", path.name)
    return path


# --- load -------------------------------------------------------------------------------


def load(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """A checkpoint's state; CheckpointError when it is not a loadable format-2 file."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # torn zip, foreign pickle, refused global: all unusable
        problem = " ".join(str(exc).split())[:300]
        raise CheckpointError(
            f"{path.name}: not loadable ({type(exc).__name__}: {problem})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        found = state.get("format", 1) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"{path.name}: checkpoint format {found!r}, this trainer reads {CHECKPOINT_FORMAT}"
        )
    missing = set(_FIELD_CHECKS) - set(state)
    if missing:
        raise CheckpointError(f"{path.name}: missing {', '.join(sorted(missing))}")
    for field, (ok, expected) in _FIELD_CHECKS.items():
        if not ok(state[field]):
            found = type(state[field]).__name__
            raise CheckpointError(f"{path.name}: {field} is {found}, expected {expected}")
    return state


def _position_ok(value: Any) -> bool:
    fields = vars(Position())
    return (
        isinstance(value, dict)
        and set(value) == set(fields)
        and all(type(value[k]) is type(default) for k, default in fields.items())
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# What apply() reads, checked on load: a file that passes is applied whole or not at all
# (a partly applied state would leave a model no checkpoint describes).
_FIELD_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "position": (_position_ok, "the training position's fields"),
    "model": (lambda v: isinstance(v, dict), "a state dict"),
    "optimizer": (lambda v: isinstance(v, dict) and "param_groups" in v, "a state dict"),
    "scaler": (lambda v: isinstance(v, dict), "a state dict"),
    "rng": (lambda v: isinstance(v, dict), "the RNG states"),
    "total_loss": (_number, "a number"),
    "nonfinite_steps": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an int"),
    "first_nonfinite_step": (lambda v: v is None or isinstance(v, int), "an int or None"),
    "evaluations": (lambda v: isinstance(v, list), "a list"),
}


def check_fits(trainer: Trainer, state: dict[str, Any]) -> str | None:
    """Why ``state`` cannot be applied to ``trainer``'s model and optimiser (a tensor of
    another shape, a missing or extra parameter, another number of parameter groups), or
    None when it can."""
    own = trainer.model.state_dict()
    theirs = state["model"]
    if set(own) != set(theirs):
        differing = sorted(set(own) ^ set(theirs))
        return f"model parameters differ ({', '.join(differing[:3])}...)"
    for key, tensor in own.items():
        other = theirs[key]
        if not isinstance(other, torch.Tensor) or other.shape != tensor.shape:
            shape = tuple(other.shape) if isinstance(other, torch.Tensor) else type(other).__name__
            return f"model parameter {key} is {shape}, the model's is {tuple(tensor.shape)}"
    groups = trainer.optimizer.state_dict()["param_groups"]
    saved = state["optimizer"]["param_groups"]
    if not isinstance(saved, list) or [
        len(g.get("params", ())) for g in saved if isinstance(g, dict)
    ] != [len(g["params"]) for g in groups]:
        return "optimizer parameter groups differ from the model's"
    return None


def apply(trainer: Trainer, state: dict[str, Any], name: str) -> None:
    """Restores ``trainer`` from a loaded state (model, optimiser, RNGs, position, ...)."""
    if not trainer.vocab.same_kept_ids(state.get("vocab_kept_ids")):
        raise ValueError(
            f"{name}: the checkpoint's pruned vocabulary differs from the one rebuilt "
            "from the run's tokenizer.json and data; cannot resume exactly"
        )
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scaler.load_state_dict(state["scaler"])
    trainer.position = Position(**state["position"])
    trainer.total_loss = float(state["total_loss"])
    trainer.nonfinite_steps = int(state["nonfinite_steps"])
    trainer.first_nonfinite_step = state["first_nonfinite_step"]
    trainer.evaluations = list(state["evaluations"])
    restore_rng(state["rng"], trainer.cuda)


@dataclass(frozen=True)
class Restored:
    path: Path | None  # None: no intact checkpoint, the run starts over
    state: dict[str, Any] | None
    set_aside: tuple[str, ...]  # "<file>: <why>" for each file renamed to .corrupt


def set_aside(path: Path) -> Path:
    """Renames an unusable checkpoint out of the way (kept for a post-mortem, not deleted)."""
    target = path.with_name(path.name + CORRUPT_SUFFIX)
    os.replace(path, target)
    return target


def load_latest_intact(
    run_dir: Path,
    device: torch.device | str,
    note: Callable[[str], None] | None = None,
    fits: Callable[[dict[str, Any]], str | None] | None = None,
) -> Restored:
    """The newest checkpoint that loads (and, given ``fits``, that fits the model: ``fits``
    says why not, or None); each newer one that does not is set aside."""
    problems: list[str] = []
    for path in reversed(checkpoints(run_dir)):
        try:
            state = load(path, device)
            misfit = fits(state) if fits is not None else None
            if misfit is not None:
                raise CheckpointError(f"{path.name}: {misfit}")
        except CheckpointError as exc:
            set_aside(path)
            problems.append(str(exc))
            message = f"checkpoint {exc}; set aside as {path.name}{CORRUPT_SUFFIX}"
            log.warning("%s", message)
            if note is not None:
                note(message)
            continue
        return Restored(path, state, tuple(problems))
    return Restored(None, None, tuple(problems))
