"""Many rank files analysed in parallel, with memory bounded by the workers, not the ranks.

Each rank file is loaded and reduced to the facts the per-rank table and the cross-rank
matching read (``RankFacts``: small frames of a few thousand rows, with the compact
collective table) in a worker process; only those come back. Rank 0's worker also computes
its full facts and sends its event table back with them: it is the primary rank, whose
events the rules read, and the parent need not load it a second time. The parent never holds
more than that one rank's event table, so peak memory is about (workers + 1) traces,
whatever the number of ranks. Workers are a process pool sized to the usable cores (at most
``MAX_POOL_WORKERS``); they are started with ``spawn`` (no fork of a parent that may run
threads, e.g. the app). The input's byte and event budgets hold for all workers together
(one set of shared totals), and an address-space limit on the starting process (the
analysis child's) is shared among its workers, not given to each.

Ranks come from each file's ``distributedInfo.rank`` or its name (``rank3``). When a file
has neither, or two files claim one rank (profiler windows of one process), the sequential
loader's numbering and merging are needed: ``analyze_rank_files`` returns None and the
caller falls back to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnostics.errors import InputError
from diagnostics.process_limits import (
    address_space_limit,
    address_space_used,
    die_with_parent,
    usable_cores,
)
from diagnostics.progress import Counter, ProgressCallback
from diagnostics.sources import RankFacts, TraceFacts
from diagnostics.trace.budget import Budget, Limits, SharedTotals
from diagnostics.trace.schema import LoadedTrace, TraceMetadata

# Below this many files the pool's start-up (a second or so of imports per worker) costs
# more than it saves.
POOL_MIN_FILES = 4
# Each worker peaks at one trace's load (about 10x its JSON size: ~0.4 GB for 35 MB), so the
# pool is capped as well as sized to the cores: on a 128-core node 8 workers keep the peak
# near 4 GB for such traces while still parsing 8 at once.
MAX_POOL_WORKERS = 8
# The rank whose worker sends back its whole trace and full facts: the primary rank when the
# ranks are 0..N-1, as every launcher numbers them. Otherwise the parent loads the lowest.
PRIMARY_RANK = 0


@dataclass(frozen=True)
class RankDigest:
    metadata: TraceMetadata
    facts: RankFacts
    decompressed_bytes: int = 0  # what this file drew on the input's budget
    events: int = 0
    # PRIMARY_RANK's file only: its trace and full facts (the parent's analysis input)
    primary: tuple[LoadedTrace, TraceFacts] | None = None
    # what the caller's per-file function made of the loaded trace (an upload's identity
    # row and stored drill-down), so that no file is read twice
    extra: Any = None


# A function of one loaded trace, run in its worker; it and its result must pickle.
PerFile = Callable[[LoadedTrace], Any]


# A worker reading one real rank file maps 1.0-1.4 GB of address space (216k events: 1.4
# GB VmPeak for 259 MB resident; most of it polars' and jemalloc's reservations). Under an
# address-space limit the pool runs no more workers than get this much each.
MIN_WORKER_ADDRESS_SPACE = 2 * 1024**3

_totals: SharedTotals | None = None  # the input's shared totals, set in each worker


def _start_worker(totals: SharedTotals, parent: int, address_space: int | None) -> None:
    global _totals
    _totals = totals
    die_with_parent(parent)  # a killed analysis child takes its workers with it
    if address_space is not None:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (address_space, hard))


def pool_plan(workers: int, address_space: int | None, used: int) -> tuple[int, int | None]:
    """(workers, each worker's address-space limit) for a pool started by a process that
    maps ``used`` bytes under a limit of ``address_space`` (None: unlimited).

    A limit holds for the pool as a whole, not once per worker: the workers share what the
    starting process leaves free (it waits while they run), in parts of at least
    MIN_WORKER_ADDRESS_SPACE where the limit allows, so N workers never use N limits.
    """
    if address_space is None:
        return workers, None
    free = max(address_space - used, 0)
    workers = max(1, min(workers, free // MIN_WORKER_ADDRESS_SPACE))
    return workers, max(free // workers, 1)


def _digest(
    path: str, display: str, limits: Limits, per_file: PerFile | None = None
) -> RankDigest | tuple[str, str]:
    from diagnostics.facts import compute_facts, compute_rank_facts
    from diagnostics.trace.loader import load_trace_file

    budget = Budget(limits, totals=_totals)
    primary = None
    try:
        # the pool already keeps every core busy: no decode helper per worker
        trace = load_trace_file(
            path,
            display_name=display,
            budget=budget,
            parallel_decode=False,
            with_flows=per_file is not None,  # the analysis reads none; a drill-down may
        )
        extra = per_file(trace) if per_file is not None else None
        if trace.metadata.rank == PRIMARY_RANK:
            full = compute_facts(trace.events, trace.metadata)
            facts, primary = RankFacts.of(full), (trace, full)
        else:
            facts = compute_rank_facts(trace.events, trace.metadata)
    except InputError as exc:  # sent back as text: exceptions with custom __init__ don't pickle
        return exc.source, exc.problem
    return RankDigest(trace.metadata, facts, budget.bytes_read, budget.events_read, primary, extra)


def digest_files(
    files: Sequence[Path],
    names: Sequence[str],
    limits: Limits | None = None,
    workers: int | None = None,
    totals: SharedTotals | None = None,
    progress: ProgressCallback | None = None,
    per_file: Sequence[PerFile] | None = None,
) -> list[RankDigest]:
    """Every file's digest, in the files' order; raises the first file's InputError.

    ``limits`` hold for the files together, as on the sequential path: every worker draws
    on one set of ``totals`` (made here unless given), so the block that takes the input
    over a limit is refused in whichever worker reads it, and the others stop at their next
    block. Under an address-space limit the workers share it (:func:`pool_plan`). Raises
    MemoryError when a worker dies under such a limit (polars aborts on a failed allocation).
    ``progress`` hears of each file as its worker finishes it. ``per_file`` (one function
    per file, or None) runs in the worker on the loaded trace; its result is the digest's
    ``extra``.
    """
    # imported here: the pool serves folders of POOL_MIN_FILES ranks or more, and these
    # cost 9 ms of every other analysis's start-up
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    limits = limits or Limits()
    context = multiprocessing.get_context("spawn")
    totals = totals or SharedTotals(context)
    workers = max(1, min(workers or min(usable_cores(), MAX_POOL_WORKERS), len(files)))
    workers, worker_space = pool_plan(workers, address_space_limit(), address_space_used())
    counter = Counter("rank files analysed", len(files), progress)
    counter.start()
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_start_worker,
        initargs=(totals, os.getpid(), worker_space),
    ) as pool:
        extras = per_file if per_file is not None else [None] * len(files)
        futures = [
            pool.submit(_digest, str(f), name, limits, extra)
            for f, name, extra in zip(files, names, extras, strict=True)
        ]
        try:
            for future in as_completed(futures):
                if isinstance(future.result(), tuple):  # a refused file: the rest is not read
                    pool.shutdown(wait=True, cancel_futures=True)
                    break
                counter.one_done()
            # the first refused file in the files' order, whichever worker ended first
            for future in futures:
                if future.done() and not future.cancelled():
                    result = future.result()
                    if isinstance(result, tuple):
                        raise InputError(*result)
        except BrokenProcessPool:
            pool.shutdown(wait=True, cancel_futures=True)
            if worker_space is not None:
                raise MemoryError(f"a rank worker died under {worker_space} bytes") from None
            raise
    return [future.result() for future in futures]


def ranks_are_distinct(digests: Sequence[RankDigest]) -> bool:
    """Every file names its own rank (no default rank, no two files of one rank)."""
    ranks = [d.metadata.rank for d in digests]
    known = all(d.metadata.rank_source != "default" for d in digests)
    return known and len(set(ranks)) == len(ranks)
