"""Many rank files analysed in parallel, with memory bounded by the workers, not the ranks.

Each rank file is loaded and reduced to its facts (``TraceFacts``: small frames of a few
thousand rows, with the compact collective table the cross-rank matching needs) in a worker
process; only the facts come back. The parent never holds more than one rank's event table
(the primary rank's, which the rules read), so peak memory is about (workers + 1) traces,
whatever the number of ranks. Workers are a process pool sized to the usable cores (at most
``MAX_POOL_WORKERS``); they are started with ``spawn`` (no fork of a parent that may run
threads, e.g. the app).

Ranks come from each file's ``distributedInfo.rank`` or its name (``rank3``). When a file
has neither, or two files claim one rank (profiler windows of one process), the sequential
loader's numbering and merging are needed: ``analyze_rank_files`` returns None and the
caller falls back to it.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from diagnostics.errors import InputError
from diagnostics.model import TraceFacts
from diagnostics.trace.budget import Budget, Limits
from diagnostics.trace.schema import TraceMetadata

# Below this many files the pool's start-up (a second or so of imports per worker) costs
# more than it saves.
POOL_MIN_FILES = 4
# Each worker peaks at one trace's load (about 10x its JSON size: ~0.4 GB for 35 MB), so the
# pool is capped as well as sized to the cores: on a 128-core node 8 workers keep the peak
# near 4 GB for such traces while still parsing 8 at once.
MAX_POOL_WORKERS = 8


@dataclass(frozen=True)
class RankDigest:
    metadata: TraceMetadata
    facts: TraceFacts
    decompressed_bytes: int = 0  # what this file drew on the input's budget
    events: int = 0


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _digest(path: str, display: str, limits: Limits) -> RankDigest | tuple[str, str]:
    from diagnostics.facts import compute_facts
    from diagnostics.trace.loader import load_trace_file

    budget = Budget(limits)
    try:
        trace = load_trace_file(path, display_name=display, budget=budget)
        facts = compute_facts(trace.events, trace.metadata)
    except InputError as exc:  # sent back as text: exceptions with custom __init__ don't pickle
        return exc.source, exc.problem
    return RankDigest(trace.metadata, facts, budget.bytes_read, budget.events_read)


def digest_files(
    files: Sequence[Path],
    names: Sequence[str],
    limits: Limits | None = None,
    workers: int | None = None,
) -> list[RankDigest]:
    """Every file's digest, in the files' order; raises the first file's InputError.

    ``limits`` hold for the files together, as on the sequential path: each worker stops a
    file that alone goes over them (so a worker's memory stays bounded), and the sum over
    the files is checked once they are in (BudgetExceeded naming the file that crossed it).
    """
    limits = limits or Limits()
    workers = max(1, min(workers or min(usable_cores(), MAX_POOL_WORKERS), len(files)))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        results = list(
            pool.map(_digest, [str(f) for f in files], list(names), [limits] * len(files))
        )
    digests = []
    for result in results:
        if isinstance(result, tuple):
            raise InputError(*result)
        digests.append(result)
    total = Budget(limits)
    for name, digest in zip(names, digests, strict=True):
        total.take_bytes(digest.decompressed_bytes, name, compressed=name.endswith(".gz"))
        total.take_events(digest.events, name)
    return digests


def ranks_are_distinct(digests: Sequence[RankDigest]) -> bool:
    """Every file names its own rank (no default rank, no two files of one rank)."""
    ranks = [d.metadata.rank for d in digests]
    known = all(d.metadata.rank_source != "default" for d in digests)
    return known and len(set(ranks)) == len(ranks)
