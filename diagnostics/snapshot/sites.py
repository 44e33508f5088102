"""Where a block was allocated (its site) and what it is (its category), from its frames.

Site: the first frame of the stack, innermost first, that is in user code: not a torch
internal (a path under ``torch/``), not an unsymbolised ``??`` frame, not C++ (frames of
``stacks="all"`` that do not end in ``.py``), not frozen importlib. A stack of C++ frames
only (autograd's engine thread runs no Python) is named by its operator: the backward node
(``DivBackward0 (autograd backward)``), else the ATen op (``aten::bmm``), not by the
capture and allocator frames nearest the allocation. Any other stack with no user frame
keeps its innermost named frame. Neither is user code (``user_code=False``).

Category (:data:`CATEGORIES`) is inferred, never read: the allocator records no intent.
The method, in the order it is applied (CATEGORY_METHOD says it in the result):

1. a frame in autograd's ``AccumulateGrad`` (C++ stacks): gradients;
2. the phase its frames show: ``backward`` (``Tensor.backward``/``autograd.backward``),
   ``optimizer`` (a frame under ``torch/optim/``), ``init`` (``Module._apply``/``.to``,
   a module's ``__init__``/``reset_parameters``, ``torch/nn/init.py``), ``forward`` (a
   module's ``_call_impl``/``forward``);
3. with the phase, whether the block outlived the stretch of that phase it was allocated
   in (the trace entries show when it was freed): init -> parameters; optimizer ->
   optimizer state when ``_init_group`` made it or it outlived the step, else temporaries;
   backward -> gradients when it outlived the backward pass, else temporaries; forward ->
   activations when it outlived the forward pass (saved for backward), else temporaries.
   A block still live at dump time counts as outliving its phase.
4. anything else (no frames, no phase, allocated before the recording began): unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diagnostics.snapshot.schema import Frame, Stack

CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "unknown",
)
PHASES = ("init", "forward", "backward", "optimizer", "other", "unknown")

CATEGORY_METHOD = (
    "inferred from each block's allocation frames and phase: AccumulateGrad frames -> "
    "gradients; Module._apply/.to/__init__/reset_parameters -> parameters; torch/optim "
    "frames -> optimizer state (made by _init_group, or outliving the step) or temporaries; "
    "Tensor.backward frames -> gradients (outliving the backward pass) or temporaries; "
    "module forward frames -> activations (outliving the forward pass) or temporaries; no "
    "frames or no phase -> unknown"
)

_INIT_NAMES = frozenset({"_apply", "to", "cuda", "reset_parameters", "load_state_dict"})
_FORWARD_NAMES = frozenset({"_call_impl", "_wrapped_call_impl", "forward"})


@dataclass(frozen=True)
class Site:
    key: str  # "path:line in function" of the chosen frame; "(no frames)" without one
    label: str  # "file.py:line in function"
    user_code: bool
    stack_text: str  # the stack's Python frames, innermost first, one per line


def _is_unknown(frame: Frame) -> bool:
    return frame.filename.startswith("??") or frame.name == "??" or not frame.filename


def _is_torch(frame: Frame) -> bool:
    path = frame.filename.replace("\\", "/")
    return "/torch/" in path or path.startswith("torch/") or path.startswith("<frozen")


def _is_python(frame: Frame) -> bool:
    return frame.filename.endswith(".py")


def user_frame(stack: Stack) -> Frame | None:
    for frame in stack:
        if _is_unknown(frame) or not _is_python(frame) or _is_torch(frame):
            continue
        return frame
    return None


NO_FRAMES = Site("(no frames)", "(no frames recorded)", False, "")
BEFORE_WINDOW = Site(
    "(before the recording)",
    "(allocated before the recording began)",
    False,
    "",
)


# In a stack of C++ frames only (an allocation on autograd's engine thread, which runs no
# Python), the frames nearest the allocation are the capture and the allocator itself; the
# operator is what names the site: the backward node, else the ATen op.
_BACKWARD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply")
_ATEN_OP = re.compile(r"at::_ops::(\w+)::call\(")


def _operator_site(stack: Stack) -> Site | None:
    for pattern, label in ((_BACKWARD_NODE, "{} (autograd backward)"), (_ATEN_OP, "aten::{}")):
        for frame in stack:
            found = pattern.search(frame.name)
            if found:
                name = label.format(found.group(1))
                return Site(name, name, False, "\n".join(f.label() for f in stack[:40]))
    return None


def site_of(stack: Stack | None) -> Site:
    if not stack:
        return NO_FRAMES
    if not any(_is_python(f) for f in stack):
        by_operator = _operator_site(stack)
        if by_operator is not None:
            return by_operator
    shown = [f for f in stack if not _is_unknown(f) and _is_python(f)] or [
        f for f in stack if not _is_unknown(f)
    ]
    text = "\n".join(f.label() for f in shown[:40])
    chosen = user_frame(stack)
    user = chosen is not None
    if chosen is None:
        chosen = shown[0] if shown else None
    if chosen is None:
        return Site("(unsymbolised frames)", "(unsymbolised frames only)", False, text)
    base = chosen.filename.replace("\\", "/").rsplit("/", 1)[-1]
    return Site(chosen.label(), f"{base}:{chosen.line} in {chosen.name}", user, text)


def phase_of(stack: Stack | None) -> str:
    if not stack:
        return "unknown"
    found = set()
    for frame in stack:
        path = frame.filename.replace("\\", "/")
        if (
            "AccumulateGrad" in frame.name
            or "autograd::Engine" in frame.name
            or frame.name == "backward"
            and (path.endswith("torch/_tensor.py") or path.endswith("torch/autograd/__init__.py"))
        ):
            found.add("backward")
        elif "/torch/optim/" in path or path.startswith("torch/optim/"):
            found.add("optimizer")
        elif (path.endswith("torch/nn/modules/module.py") and frame.name in _INIT_NAMES) or (
            "/torch/nn/" in path
            and (frame.name in ("__init__", "reset_parameters") or path.endswith("nn/init.py"))
        ):
            found.add("init")
        elif frame.name in _FORWARD_NAMES:
            found.add("forward")
    for phase in ("backward", "optimizer", "init", "forward"):
        if phase in found:
            return phase
    return "other"


def made_by_accumulate_grad(stack: Stack | None) -> bool:
    return bool(stack) and any("AccumulateGrad" in f.name for f in stack or ())


def made_by_init_group(stack: Stack | None) -> bool:
    return bool(stack) and any(
        f.name in ("_init_group", "_init_state") and "optim" in f.filename for f in stack or ()
    )


def category_of(stack: Stack | None, phase: str, outlived_phase: bool | None) -> str:
    """One of CATEGORIES. ``outlived_phase``: whether the block was still live when the
    stretch of ``phase`` it was allocated in ended (None: not known from the trace)."""
    if made_by_accumulate_grad(stack):
        return "gradients"
    if phase == "init":
        return "parameters"
    if phase == "optimizer":
        if made_by_init_group(stack):
            return "optimizer_state"
        if outlived_phase is None:
            return "unknown"
        return "optimizer_state" if outlived_phase else "temporaries"
    if phase in ("backward", "forward"):
        if outlived_phase is None:
            return "unknown"
        if not outlived_phase:
            return "temporaries"
        return "gradients" if phase == "backward" else "activations"
    return "unknown"
