"""Why a run stops before its last step: one typed wish, shared by the loop and the ranks.

The loop asks after every step (signals, a cancel request, the wall-time budget); in a
distributed run the ranks all-reduce the wish's priority so every rank stops after the same
step, and a rank that did not see the cause itself gets the agreed wish's words.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from diagnostics.runs import RunState


class StopKind(IntEnum):
    """In increasing priority: when ranks disagree, the highest wins (all-reduce MAX)."""

    BUDGET = 1  # train.max_runtime_s reached
    CANCEL = 2  # the app's cancel request
    INTERRUPT = 3  # SIGINT
    PREEMPT = 4  # SIGTERM: checkpoint for resume


@dataclass(frozen=True)
class Stop:
    kind: StopKind
    reason: str

    @property
    def status(self) -> RunState:
        return "preempted" if self.kind is StopKind.PREEMPT else "cancelled"


# what a rank records when another rank's wish stopped the job
AGREED = {
    StopKind.BUDGET: Stop(
        StopKind.BUDGET, "train.max_runtime_s budget reached on another rank; resume to finish"
    ),
    StopKind.CANCEL: Stop(StopKind.CANCEL, "cancel requested"),
    StopKind.INTERRUPT: Stop(StopKind.INTERRUPT, "interrupted (SIGINT) on another rank"),
    StopKind.PREEMPT: Stop(
        StopKind.PREEMPT, "SIGTERM received by another rank: checkpointed for resume"
    ),
}
