"""A second process that decodes chunks of a trace's event array beside the loading one.

Decoding a chunk (msgspec's parse and the columns built from it) holds the GIL, so a
thread cannot share it; a helper process can. The loading process (diagnostics.trace.decode)
still finds every cut, keeps every order-dependent state (B/E pairing, the timestamp base,
the budgets) and hands the event table its chunks in file order; the helper only turns a
chunk's text into raw columns, with the same code the loading process runs
(diagnostics.trace.chunk_decode). A chunk it cannot do alone (not one valid array, B/E
events) it declines, and the loading process takes that chunk and the rest of the file back
and decodes them itself: the result is the same either way.

Text and columns travel through memory files (``memfd``), :data:`SLOTS` each way, and only
fixed-size headers through the pipes, so neither process ever waits on the other's reading.
The helper is started with ``subprocess`` (never ``fork``: polars starts threads when it is
imported), dies with its parent, and holds at most its :data:`SLOTS` chunks.

This module imports nothing heavy, so that a command can start a helper (:func:`start_spare`)
before it imports the analyser: the helper's own imports (0.15 s) then overlap the
command's.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from diagnostics.trace.helper_protocol import (
    DECODED,
    HAS_BASE,
    READY,
    REPLY,
    REQUEST,
    SLOTS,
    read_exactly,
)
from diagnostics.trace.source import GZIP_MAGIC, TRACE_SUFFIXES

if TYPE_CHECKING:
    from diagnostics.trace.chunk_decode import DecodedChunk

# A file this large on disk (gzip: compressed) holds more than a chunk or two of JSON:
# worth a helper. Smaller ones are decoded before a helper would be ready.
SPARE_MIN_BYTES = {True: 1 << 20, False: 12 << 20}  # gzip?, plain


def can_help() -> bool:
    """A helper needs a second core to run on, and memory files (Linux)."""
    from diagnostics.process_limits import usable_cores

    return hasattr(os, "memfd_create") and usable_cores() > 1


class DecodeHelper:
    """The loading process's side: starts the helper and trades chunks with it."""

    def __init__(self) -> None:
        fds: list[int] = []
        try:
            fds.extend(os.memfd_create(f"trace-text-{i}") for i in range(SLOTS))
            fds.extend(os.memfd_create(f"trace-columns-{i}") for i in range(SLOTS))
            root = str(Path(__file__).resolve().parents[2])
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    f"import sys; sys.path.insert(0, {root!r}); "
                    "from diagnostics.trace.chunk_decode import main; main()",
                    str(os.getpid()),
                    *map(str, fds),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                pass_fds=fds,
            )  # no preexec_fn (unsafe in a threaded parent): the helper ties itself to us
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        self.texts, self.results = fds[:SLOTS], fds[SLOTS:]
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.requests = self.proc.stdin.fileno()
        self.replies = self.proc.stdout.fileno()
        self.ready = False
        self.alive = True
        self.busy: dict[int, int] = {}  # slot -> seq of the chunk in it

    def _check_ready(self) -> bool:
        if not self.ready and self.alive and select.select([self.replies], [], [], 0)[0]:
            self.ready = os.read(self.replies, 1) == READY
            self.alive = self.ready
        return self.ready

    def free_slot(self) -> int | None:
        """A slot the helper can take a chunk in now (None: not started yet, or full)."""
        if not self.alive or not self._check_ready():
            return None
        return next((slot for slot in range(SLOTS) if slot not in self.busy), None)

    def submit(
        self, slot: int, seq: int, text: memoryview, base_us: int | None, flags: int = 0
    ) -> bool:
        """Hands the helper a chunk (a JSON array's text); False if it cannot take it.
        ``flags``: helper_protocol's STRICT, NORMALISE, WITHOUT_FLOWS."""
        flags |= HAS_BASE if base_us is not None else 0
        try:
            if os.pwrite(self.texts[slot], text, 0) != len(text):
                raise OSError("short write")
            os.write(self.requests, REQUEST.pack(seq, slot, len(text), flags, base_us or 0))
        except OSError:  # the helper died (killed, out of memory): the caller decodes
            self.alive = False
            return False
        self.busy[slot] = seq
        return True

    def text_in(self, slot: int, size: int) -> bytes:
        """The text handed over in ``slot`` (for a chunk taken back)."""
        return os.pread(self.texts[slot], size, 0)

    def next_result(self, wait: bool) -> tuple[int, DecodedChunk | None] | None:
        """(seq, chunk or None if declined) for the oldest chunk the helper has finished;
        None when nothing is finished (and ``wait`` is false). A dead helper declines
        every chunk it held."""
        from diagnostics.trace.chunk_decode import decode_payload

        if not self.busy:
            return None
        if self.alive:
            if not wait and not select.select([self.replies], [], [], 0)[0]:
                return None
            header = read_exactly(self.replies, REPLY.size)
            if header is not None:
                seq, slot, status, size = REPLY.unpack(header)
                del self.busy[slot]
                if status != DECODED:
                    return seq, None
                try:
                    return seq, decode_payload(os.pread(self.results[slot], size, 0))
                except Exception:  # noqa: BLE001 - a damaged reply: decode it here instead
                    return seq, None
            self.alive = False
        slot = min(self.busy, key=self.busy.__getitem__)
        return self.busy.pop(slot), None

    def close(self) -> None:
        self.alive = False
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for fd in (*self.texts, *self.results):
            os.close(fd)


_spare: DecodeHelper | None = None


def start_spare(path: str | os.PathLike[str]) -> None:
    """Starts a helper now for a trace file large enough to use one, so that it is ready
    when the file's decode begins (:func:`take_spare`). Anything amiss: no helper."""
    global _spare
    if _spare is not None or not str(path).endswith(TRACE_SUFFIXES) or not can_help():
        return
    try:
        with open(path, "rb") as handle:
            gzip = handle.read(2) == GZIP_MAGIC
            size = os.fstat(handle.fileno()).st_size
        if size >= SPARE_MIN_BYTES[gzip]:
            _spare = DecodeHelper()
    except OSError:
        _spare = None


def take_spare() -> DecodeHelper | None:
    global _spare
    spare, _spare = _spare, None
    return spare
