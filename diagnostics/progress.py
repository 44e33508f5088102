"""How far a long analysis has got: so many of a known number of parts done.

A folder of many rank files takes seconds to minutes (docs/BENCHMARKS.md: 64 ranks of 35 MB
each), and so does one large trace (a 1 GB one: half of it reading, then the facts). The
work reports each part as it ends (``WorkDone``: a rank file, a MB of the input read, a
fact computed) to a callback: the CLI prints it to stderr (:class:`StderrProgress`), the
bounded child writes it to a file that its parent reads while it waits
(:class:`ProgressFile`, :func:`read_progress`), and the app draws a bar from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO


@dataclass(frozen=True)
class WorkDone:
    what: str  # the parts, counted: "rank files analysed", "files read"
    done: int
    total: int
    elapsed_s: float  # since the work began

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total > 0 else 1.0

    def text(self) -> str:
        return (
            f"{self.done} of {self.total} {self.what} ({100 * self.fraction:.0f} %, "
            f"{self.elapsed_s:.0f} s)"
        )


ProgressCallback = Callable[[WorkDone], None]

# Work quicker than this shows no progress on stderr (a 50 MB trace, a handful of ranks)
SHOWN_AFTER_S = 2.0
# Off a terminal (a log file, CI), at most one progress line this often, and the last
LINE_EVERY_S = 5.0


# A read reports each time it has got this much further through its files, and at the end
READ_REPORT_FRACTION = 0.01
MB = 2**20  # as the CLI's --max-decompressed-mb counts
# An input smaller than this as stored is analysed in a second or two (16 MB of gzip is
# about 170 MB of JSON: 2 s on two cores), so the analysis of one says nothing of its
# progress: the CLI stays quiet, whatever the host's load, and an error stays one line.
LONG_INPUT_BYTES = 16 * MB


class ReadProgress:
    """Reports how much of an input's files has been read, in MB as stored (compressed,
    for gzip) of their total size: most of a single large trace's analysis is its read,
    and its decompressed size is not known before the end.

    The loader passes each file's blocks through :meth:`following`, which reports from the
    thread that takes them, about every READ_REPORT_FRACTION of the total.
    """

    def __init__(self, paths: Sequence[str | os.PathLike[str]], report: ProgressCallback) -> None:
        self.sizes = {os.fspath(Path(p)): stored_size(p) for p in paths}
        self.total_bytes = sum(self.sizes.values())
        self.what = "MB of the trace read" if len(paths) == 1 else f"MB of {len(paths)} files read"
        self.report = report
        self.done_before = 0  # the files already read
        self._next_at = 0
        self._last: WorkDone | None = None
        self._step = max(1, int(self.total_bytes * READ_REPORT_FRACTION))
        self._start = time.monotonic()

    def start(self) -> None:
        self._report(0)

    def following(
        self,
        path: str | os.PathLike[str],
        blocks: Iterator[bytes],
        bytes_read: Callable[[], int],
    ) -> Iterator[bytes]:
        """The blocks of the file at ``path`` as they come, reporting on the way how much
        of the files has been read; ``bytes_read`` says how much of this one."""
        try:
            for block in blocks:
                done = self.done_before + bytes_read()
                if done >= self._next_at:
                    self._report(done)
                yield block
        finally:  # read to its end, or given up (left out, over a budget): done with it
            self.done_before += max(bytes_read(), self.sizes.get(os.fspath(Path(path)), 0))
        self._report(self.done_before)

    def _report(self, done: int) -> None:
        self._next_at = done + self._step
        total_mb = -(-self.total_bytes // MB)  # rounded up: a small file is "1 MB"
        done_mb = total_mb if done >= self.total_bytes else done // MB
        if self._last is not None and self._last.done == done_mb:
            return  # nothing new to say (a file's last block, then its end)
        self._last = WorkDone(self.what, done_mb, total_mb, time.monotonic() - self._start)
        self.report(self._last)


def stored_size(path: str | os.PathLike[str]) -> int:
    """The file's size on disk; 0 when it cannot be had (its read will name the file:
    progress is never worth failing for)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class Counter:
    """Counts the parts of one piece of work as they end and reports each to ``report``."""

    def __init__(self, what: str, total: int, report: ProgressCallback | None) -> None:
        self.what, self.total, self.report = what, total, report
        self.done = 0
        self._start = time.monotonic()

    def start(self) -> None:
        """Says the work has begun (0 done): a bar appears before the first part ends."""
        if self.report is not None:
            self.report(WorkDone(self.what, 0, self.total, 0.0))

    def one_done(self) -> None:
        self.done += 1
        if self.report is not None:
            elapsed = time.monotonic() - self._start
            self.report(WorkDone(self.what, self.done, self.total, elapsed))


class StderrProgress:
    """Progress on standard error for a CLI, once the work has lasted SHOWN_AFTER_S.

    On a terminal one line is rewritten in place and cleared by :meth:`close`, so nothing of
    it is left above the answer or an error line. Elsewhere (a log, CI) a line is printed at
    most every LINE_EVERY_S and when the work completes; quick work prints nothing.
    """

    def __init__(
        self, stream: TextIO | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.after_s, self.every_s, self.clock = SHOWN_AFTER_S, LINE_EVERY_S, clock
        self.started = clock()
        self.last_line: float | None = None
        self.live = False  # a rewritten line is on the terminal
        try:
            self.terminal = self.stream.isatty()
        except (AttributeError, ValueError):
            self.terminal = False

    def __call__(self, work: WorkDone) -> None:
        now = self.clock()
        if now - self.started < self.after_s:
            return
        if self.terminal:
            self._write(f"\r\033[K{work.text()}")
            self.live = True
            return
        complete = work.done >= work.total
        if self.last_line is None or now - self.last_line >= self.every_s or complete:
            self._write(work.text() + "\n")
            self.last_line = now

    def close(self) -> None:
        if self.live:
            self._write("\r\033[K")
            self.live = False

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed stderr never fails the work
            self.stream.write(text)
            self.stream.flush()


class ProgressFile:
    """The bounded child's progress, written for its parent: the latest ``WorkDone`` as a
    small JSON file, replaced whole (the parent never reads half of one)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __call__(self, work: WorkDone) -> None:
        temporary = self.path.with_suffix(".tmp")
        with contextlib.suppress(OSError):  # progress is never worth failing the analysis
            temporary.write_text(json.dumps(asdict(work)), encoding="utf-8")
            os.replace(temporary, self.path)


def read_progress(path: str | os.PathLike[str]) -> WorkDone | None:
    """What a ProgressFile holds now; None when there is nothing (yet) or it is not one."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        return WorkDone(
            str(doc["what"]), int(doc["done"]), int(doc["total"]), float(doc["elapsed_s"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
