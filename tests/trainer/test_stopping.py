"""The stop wish's kinds: their status, and the priority the ranks agree on."""

from __future__ import annotations

from trainer.stopping import AGREED, Stop, StopKind


def test_only_sigterm_preempts_everything_else_cancels():
    assert Stop(StopKind.PREEMPT, "SIGTERM").status == "preempted"
    for kind in (StopKind.BUDGET, StopKind.CANCEL, StopKind.INTERRUPT):
        assert Stop(kind, "x").status == "cancelled"


def test_the_most_urgent_wish_wins_and_each_has_words_for_the_other_ranks():
    # the ranks all-reduce MAX over these numbers: SIGTERM must beat a cancel, which must
    # beat the budget, or a preempted job would lose its resume checkpoint on some rank
    assert StopKind.BUDGET < StopKind.CANCEL < StopKind.INTERRUPT < StopKind.PREEMPT
    assert set(AGREED) == set(StopKind)
    for kind, stop in AGREED.items():
        assert stop.kind is kind and stop.reason
    assert "another rank" in AGREED[StopKind.BUDGET].reason
    assert AGREED[StopKind.PREEMPT].status == "preempted"
