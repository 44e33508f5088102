"""The analysis inputs every rule and renderer reads: a trace's facts and a run's data
(``diagnostics.sources``), with the headline numbers computed from them once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import polars as pl

from diagnostics.metrics import KeyMetrics, compute_key_metrics
from diagnostics.sources import RunData, TraceFacts

if TYPE_CHECKING:
    from diagnostics.facts.comm_ranks import CollectiveMatch
    from diagnostics.snapshot.analysis import SnapshotFacts
    from diagnostics.snapshot.compare import SnapshotGrowth


@dataclass(frozen=True)
class AnalysisInputs:
    """What the rules see. Either part may be absent: a bare trace has no run, a run
    recorded with instruments off has no trace.

    Every field is one a rule reads; what only the summary needs (the per-rank facts and
    metadata, the trace-to-run step mapping) stays in ``diagnostics.analyze``. The run's own
    records (CPU count, vocabulary usage) are read from ``run.environment``, their one source.
    """

    trace: TraceFacts | None = None
    run: RunData | None = None
    events: pl.DataFrame | None = None  # the event table, for rules that need raw names
    # the primary rank's collectives matched across ranks (per-rank waiting versus
    # transfer); None for a single rank (diagnostics.facts.ranks.rank_collectives)
    collective_match: CollectiveMatch | None = None
    # a CUDA memory snapshot analysed (diagnostics.snapshot): an uploaded one, or a run
    # folder's latest memory/*.pickle; None without one
    snapshot: SnapshotFacts | None = None
    # the same job's earlier snapshot compared with ``snapshot``: growth by site; None
    # unless two snapshots were given
    snapshot_growth: SnapshotGrowth | None = None

    @cached_property
    def metrics(self) -> KeyMetrics:
        """The headline numbers (diagnostics.metrics), computed once: the rules quote these,
        so a finding's title says what the cards and reports say."""
        return compute_key_metrics(self.trace, self.run)
