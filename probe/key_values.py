"""Key-value store reads of a profiled script, per step, from every process that loads data.

A store library's reads (LMDB's, through probe/integrations/lmdb.py) are counted into
:data:`READS`, this process's counter. What a step record gets (``store_reads``,
``store_keys``, ``store_read_ms``: the fields the reference trainer writes, so
per-sample-lookups reads both):

- ``store_reads``: read transactions that read, each counted once in every step (or
  worker batch) it reads in: one ``get`` in its own transaction per sample is one read per
  sample; ``getmulti``, or many ``get``\\ s in one transaction, is one read for the batch;
- ``store_keys``: values asked for (a ``get`` is one, a ``getmulti`` its keys);
- ``store_read_ms``: time inside the library's calls (a read transaction's begin and end,
  its gets), not the script's own decoding between them.

DataLoader workers read in their own processes. A forked worker inherits this module, its
hooks and, when the script imported the library before the fork, the library's patch (a
worker that imports it itself patches it then: the import hook is inherited too). There,
each batch the worker fetches leaves it as a :class:`CountedBatch`: the batch with the
reads made while fetching it, through the DataLoader's own queue (and pin-memory thread).
The main process unwraps it before the script sees the batch and adds its reads to the step
that fetched it. A worker started by ``spawn`` or ``forkserver`` runs none of this: its
batches arrive bare, and while reads are being counted such a step's store fields are null
(unknown), not zero.

Nothing here imports a store library: the counter stays inactive, and every hook a pass-
through, until the script itself imports one.
"""

from __future__ import annotations

import contextlib
import linecache
import multiprocessing
import os
from pathlib import Path
from typing import Any

from torch.utils.data import dataloader as dataloader_module
from torch.utils.data._utils import fetch as fetch_module
from torch.utils.data._utils import pin_memory as pin_memory_module
from torch.utils.data._utils import worker as worker_module

from probe.step_values import STORE_FIELDS

_UNKNOWN = dict.fromkeys(STORE_FIELDS)

# a site's entry: [call, function, calls, keys]
Site = list


class KeyValueReads:
    """One process's reads since the last :meth:`take`, and (main process) the run's totals
    per reading line of the script."""

    __slots__ = (
        "active",
        "library",
        "reads",
        "keys",
        "seconds",
        "generation",
        "sites",
        "unknown",
        "site_totals",
        "totals",
        "unknown_steps",
        "single_key_calls",
    )

    def __init__(self) -> None:
        self.active = False  # a store library is patched here (or a worker sent reads)
        self.library: str | None = None
        self.site_totals: dict[tuple[str, int], Site] = {}
        self.totals = [0, 0, 0.0]  # reads, keys, seconds of the steps taken
        self.unknown_steps = 0
        # every single-key read of the process, never reset: which of them note their line
        self.single_key_calls = 0
        self.reset()

    def forget_everything(self) -> None:
        """Inactive, with no totals: as at import, for a new session in the same process."""
        self.__init__()  # type: ignore[misc]

    def reset(self) -> None:
        """Forgets what was counted since the last take (a forked worker starts empty)."""
        self.reads = 0
        self.keys = 0
        self.seconds = 0.0
        # a transaction counts once per take: it remembers the generation it last read in
        self.generation = 0
        self.sites: dict[tuple[str, int], Site] = {}
        self.unknown = False

    def activate(self, library: str) -> None:
        self.active = True
        self.library = self.library or library

    def receive(self, batch: CountedBatch) -> None:
        """A worker's batch: its reads become this process's, for the step fetching it."""
        self.activate(batch.library)
        self.reads += batch.reads
        self.keys += batch.keys
        self.seconds += batch.seconds
        _merge_sites(self.sites, batch.sites)

    def take(self) -> dict[str, Any]:
        """The step's store fields, and a fresh count for the next step."""
        if self.unknown:
            fields = _UNKNOWN
            self.unknown_steps += 1
        else:
            fields = {
                "store_reads": self.reads,
                "store_keys": self.keys,
                "store_read_ms": self.seconds * 1e3,
            }
            self.totals[0] += self.reads
            self.totals[1] += self.keys
            self.totals[2] += self.seconds
        _merge_sites(self.site_totals, self.sites)
        generation = self.generation + 1
        self.reset()
        self.generation = generation
        return fields

    def batch(self, batch: Any) -> CountedBatch:
        """A worker's fetched batch with the reads made for it; the count starts again."""
        counted = CountedBatch(
            batch, self.library or "", self.reads, self.keys, self.seconds, self.sites
        )
        generation = self.generation + 1
        self.reset()
        self.generation = generation
        return counted

    def summary(self, base: Path | None) -> dict[str, Any] | None:
        """For run.json's ``probe.key_value_reads``: the totals and each line that read,
        most keys first; None when no store library was seen."""
        if not self.active:
            return None
        sites = []
        for (file, line), (call, function, calls, keys) in sorted(
            self.site_totals.items(), key=lambda item: -item[1][3]
        ):
            shown = file
            if base is not None:
                with contextlib.suppress(ValueError):  # a file outside the script's folder
                    shown = str(Path(file).relative_to(base))
            sites.append(
                {
                    "site": f"{shown}:{line}",
                    "file": file,
                    "line": line,
                    "function": function,
                    "call": call,
                    # single-key calls are sampled (probe/integrations/lmdb.py SITE_SAMPLE):
                    # the sampled ones times the rate; getmulti calls are each counted
                    "calls": calls,
                    "keys": keys,
                    "code": linecache.getline(file, line).strip() or None,
                }
            )
        reads, keys, seconds = self.totals
        return {
            "library": self.library,
            "reads": reads,
            "keys": keys,
            "read_ms": seconds * 1e3,
            "steps_unknown": self.unknown_steps,
            "sites": sites,
        }


def _merge_sites(into: dict[tuple[str, int], Site], sites: dict[tuple[str, int], Site]) -> None:
    for key, (call, function, calls, keys) in sites.items():
        found = into.get(key)
        if found is None:
            into[key] = [call, function, calls, keys]
        else:
            found[2] += calls
            found[3] += keys


READS = KeyValueReads()
# a forked child (a DataLoader worker) must not send the parent's reads as its own
os.register_at_fork(after_in_child=READS.reset)


class CountedBatch:
    """A worker's batch with the reads made to fetch it, on its way to the main process."""

    __slots__ = ("batch", "library", "reads", "keys", "seconds", "sites")

    def __init__(
        self,
        batch: Any,
        library: str,
        reads: int,
        keys: int,
        seconds: float,
        sites: dict[tuple[str, int], Site],
    ):
        self.batch = batch
        self.library = library
        self.reads = reads
        self.keys = keys
        self.seconds = seconds
        self.sites = sites

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.batch, self.library, self.reads, self.keys, self.seconds, self.sites)
        return (CountedBatch, fields)

    def pin_memory(self) -> CountedBatch:
        # the DataLoader's pin-memory thread calls this for an object it does not know
        pinned = pin_memory_module.pin_memory(self.batch)
        return CountedBatch(pinned, self.library, self.reads, self.keys, self.seconds, self.sites)


def _workers_counted(iterator: Any, worker: int | None) -> bool:
    """Whether the iterator's workers run these hooks: forked ones do, spawned ones not."""
    counted = getattr(iterator, "_probe_workers_counted", None)
    if counted is None:
        workers = getattr(iterator, "_workers", None) or []
        process = workers[worker] if worker is not None and worker < len(workers) else None
        method = getattr(process, "_start_method", None) or multiprocessing.get_start_method()
        counted = method == "fork"
        iterator._probe_workers_counted = counted
    return counted


class DataLoaderPlumbing:
    """The hooks that bring workers' reads to the main process; pass-throughs while no
    store library is patched (a script that never imports one)."""

    def __init__(self, note: Any):
        self._note = note
        self._undo: list[Any] = []

    def install(self) -> None:
        for fetcher in (fetch_module._MapDatasetFetcher, fetch_module._IterableDatasetFetcher):
            self._patch(fetcher, "fetch", _counted_fetch)
        self._patch(
            dataloader_module._MultiProcessingDataLoaderIter,
            "_process_data",
            lambda original: _unwrapping_process_data(original, self._note),
        )

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner: Any, name: str, make: Any) -> None:
        original = owner.__dict__[name]
        wrapper = make(original)
        wrapper.__wrapped__ = original
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original))


def _counted_fetch(original: Any) -> Any:
    reads = READS

    def fetch(fetcher: Any, possibly_batched_index: Any) -> Any:
        batch = original(fetcher, possibly_batched_index)
        if reads.active and worker_module._worker_info is not None:
            return reads.batch(batch)
        return batch

    return fetch


def _unwrapping_process_data(original: Any, note: Any) -> Any:
    reads = READS

    def _process_data(iterator: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        data = original(iterator, data, *args, **kwargs)
        if type(data) is CountedBatch:
            reads.receive(data)
            return data.batch
        if reads.active:
            worker = args[0] if args else kwargs.get("worker_idx")
            if not _workers_counted(iterator, worker):
                reads.unknown = True
                note(
                    "DataLoader workers started by spawn or forkserver run without the "
                    "instruments: their key-value reads are not counted, and the store "
                    "fields of the steps they fed are null"
                )
        return data

    return _process_data
