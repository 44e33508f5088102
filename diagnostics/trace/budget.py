"""What one input may cost: decompressed bytes and events, counted over all its files.

An upload may hold several files and a folder many ranks: a per-file cap lets sixteen files
just under it through, sixteen times over. One :class:`Budget` is made per input and
every file of that input draws on it, so the limits hold for the input as a whole. Going
over raises :class:`BudgetExceeded`, a one-line :class:`InputError` naming the limit and
how to raise it (CLI flag and environment variable).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diagnostics.errors import InputError
from diagnostics.limit_values import MAX_DECOMPRESSED_MB, MAX_EVENTS, limit_from_env
from diagnostics.process_limits import address_space_limit

# 2 GiB of JSON is about 8 million Kineto events: far more than any one profiler window
# writes, yet small enough that a bomb stops long before it hurts the machine.
DEFAULT_MAX_DECOMPRESSED_BYTES = 2 * 1024**3
# The event table and the facts cost about 0.5 KB of memory per event (216k events of
# hta_v100_rank1_of_2_large peak at 224 MB): 5 million events is ~2.5 GB at the peak,
# 23x the largest real trace in ../shared/traces, and it is reached by the issue's
# 1.5 GiB bomb long before that bomb's 12 GB.
DEFAULT_MAX_EVENTS = 5_000_000

# The command line analyses the user's own files on the user's own machine: its defaults
# follow that machine's memory instead of the served app's fixed budget (which a 1 GB,
# 5.6 M-event trace exceeds). Half of the memory, at the peak's cost per event: the
# synthetic 1 GB trace of bench/bench_analyzer.py peaks at 2.0 GB for 5.6 M events
# (357 bytes each); 512 leaves room for traces richer in args.
CLI_MEMORY_SHARE = 0.5
PEAK_BYTES_PER_EVENT = 512
# Kineto JSON is 190 bytes per event minified (that trace) and up to about twice that
# pretty-printed: the byte limit follows the event limit at 400.
JSON_BYTES_PER_EVENT = 400

ENV_MAX_DECOMPRESSED_MB = MAX_DECOMPRESSED_MB.env
ENV_MAX_EVENTS = MAX_EVENTS.env


class BudgetExceeded(InputError):
    """The input is larger than a configured limit (never a reason to skip just one file)."""


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


@dataclass(frozen=True)
class Limits:
    """Budgets for one input (all of its files together)."""

    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    max_events: int = DEFAULT_MAX_EVENTS

    def __post_init__(self) -> None:
        if self.max_decompressed_bytes <= 0 or self.max_events <= 0:
            raise ValueError("limits must be positive")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The defaults, overridden by PIPELINE_DOCTOR_MAX_DECOMPRESSED_MB / _MAX_EVENTS."""
        environ = os.environ if environ is None else environ
        mib = limit_from_env(MAX_DECOMPRESSED_MB, DEFAULT_MAX_DECOMPRESSED_BYTES / 2**20, environ)
        events = limit_from_env(MAX_EVENTS, DEFAULT_MAX_EVENTS, environ)
        return cls(max_decompressed_bytes=max(1, int(mib * 2**20)), max_events=int(events))

    @classmethod
    def for_command_line(
        cls, environ: Mapping[str, str] | None = None, memory_bytes: int | None = None
    ) -> Limits:
        """The CLI's defaults: sized to this machine's memory (never below the app's), each
        overridden by its environment variable as in :meth:`from_env`."""
        environ = os.environ if environ is None else environ
        memory = host_memory_bytes() if memory_bytes is None else memory_bytes
        events = max(DEFAULT_MAX_EVENTS, int(memory * CLI_MEMORY_SHARE / PEAK_BYTES_PER_EVENT))
        json_bytes = max(DEFAULT_MAX_DECOMPRESSED_BYTES, events * JSON_BYTES_PER_EVENT)
        mib = limit_from_env(MAX_DECOMPRESSED_MB, json_bytes / 2**20, environ)
        events = limit_from_env(MAX_EVENTS, events, environ)
        return cls(max_decompressed_bytes=max(1, int(mib * 2**20)), max_events=int(events))


def host_memory_bytes() -> int:
    """Physical memory, or less where this process may use less: an address-space limit
    (ulimit -v) or a cgroup's memory.max (a container)."""
    sizes = [os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
    limit = address_space_limit()
    if limit is not None:
        sizes.append(limit)
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as handle:
            text = handle.read().strip()
        if text.isdigit():
            sizes.append(int(text))
    except OSError:
        pass
    return min(sizes)


class SharedTotals:
    """One input's running totals, shared by the processes that read its files at once.

    The rank pool reads several files in parallel, one per worker process: with a budget
    each, a refusal would only come once every file is in (N workers, each up to the whole
    budget). Every worker's :class:`Budget` adds to these counters instead, so the first
    block that takes the input over a limit is refused, in whichever worker reads it. Hand
    it to a worker when the process starts (pool initializer), not with each task.
    """

    def __init__(self, context: Any = None):
        import multiprocessing

        # [decompressed bytes, events], under the array's own lock
        self._counts = (context or multiprocessing.get_context()).Array("q", 2)

    def _add(self, index: int, n: int) -> int:
        with self._counts.get_lock():
            self._counts[index] += n
            return int(self._counts[index])

    def add_bytes(self, n: int) -> int:
        return self._add(0, n)

    def add_events(self, n: int) -> int:
        return self._add(1, n)

    @property
    def bytes_read(self) -> int:
        return int(self._counts[0])

    @property
    def events_read(self) -> int:
        return int(self._counts[1])


class Budget:
    """What is left of one input's :class:`Limits` while its files are read.

    ``bytes_read`` and ``events_read`` are what was read through this budget. The limits
    hold for their sum, or, given ``totals``, for the totals of every budget sharing them
    (files read in parallel by other processes). Files read by one process are read one
    after another (the inflate thread of one file at a time draws on it), so plain
    counters suffice there.
    """

    def __init__(self, limits: Limits | None = None, totals: SharedTotals | None = None):
        self.limits = limits or Limits()
        self.totals = totals
        self.bytes_read = 0
        self.events_read = 0

    def take_bytes(self, n: int, display: str, *, compressed: bool) -> None:
        self.bytes_read += n
        total = self.totals.add_bytes(n) if self.totals is not None else self.bytes_read
        if total > self.limits.max_decompressed_bytes:
            what = "decompresses to" if compressed else "is"
            raise BudgetExceeded(
                display,
                f"{what} more than {human_bytes(self.limits.max_decompressed_bytes)} of JSON "
                f"(all files of the input together), the limit (raise --max-decompressed-mb "
                f"or {ENV_MAX_DECOMPRESSED_MB} to read it)",
            )

    def take_events(self, n: int, display: str) -> None:
        self.events_read += n
        total = self.totals.add_events(n) if self.totals is not None else self.events_read
        if total > self.limits.max_events:
            raise BudgetExceeded(
                display,
                f"holds more than {self.limits.max_events:,} events (all files of the input "
                f"together), the limit (raise --max-events or {ENV_MAX_EVENTS} to read it)",
            )
