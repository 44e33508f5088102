"""Derived trace facts: pure functions from the event table to small frames.

``compute_facts(events, metadata) -> TraceFacts`` runs them all (``compute_rank_facts``
only those the cross-rank summary reads); each module holds one topic
(steps, breakdown, gpu, idle, operators, copies, syncs, launches, memory, ranks) and its
docstring says how it counts.
"""

from diagnostics.facts.assemble import compute_facts, compute_rank_facts
from diagnostics.facts.breakdown import breakdown_pct
from diagnostics.facts.idle import idle_breakdown_pct
from diagnostics.facts.operators import top
from diagnostics.facts.ranks import StepTimeSpread, rank_summary, step_time_spread
from diagnostics.facts.summary import trace_summary

__all__ = [
    "StepTimeSpread",
    "breakdown_pct",
    "compute_facts",
    "compute_rank_facts",
    "idle_breakdown_pct",
    "rank_summary",
    "step_time_spread",
    "top",
    "trace_summary",
]
