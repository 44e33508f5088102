"""Bytes of a trace file, decompressed as a stream with a hard cap.

A trace upload is untrusted: a few megabytes of gzip can inflate to terabytes. Reading
goes block by block and stops with an :class:`InputError` as soon as the decompressed
total passes the input's byte budget (diagnostics.trace.budget), so memory stays bounded whatever the file holds. Gzip is
recognised by its magic bytes, not the file name (a ``.json.gz`` that is plain JSON, or a
``.json`` that is gzip, both load).
"""

from __future__ import annotations

import os
import queue
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

from diagnostics.errors import InputError
from diagnostics.trace.budget import DEFAULT_MAX_DECOMPRESSED_BYTES, Budget, Limits

__all__ = ["DEFAULT_MAX_DECOMPRESSED_BYTES", "iter_blocks", "prefetch"]

GZIP_MAGIC = b"\x1f\x8b"
# Compressed bytes read per call, and the most decompressed bytes one block may carry.
_READ_BYTES = 1 << 20
BLOCK_BYTES = 1 << 20


def iter_blocks(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    display: str | None = None,
    block_bytes: int = BLOCK_BYTES,
    budget: Budget | None = None,
) -> Iterator[bytes]:
    """Yields the file's (decompressed) content in blocks of at most ``block_bytes``.

    Every block is drawn from ``budget`` (shared by all files of one input); without one,
    this file alone may decompress to ``max_bytes``.
    """
    path = Path(path)
    display = display or str(path)
    if budget is None:
        budget = Budget(Limits(max_decompressed_bytes=max_bytes))
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise InputError(display, "no such file") from None
    except IsADirectoryError:
        raise InputError(display, "is a folder, expected a trace file") from None
    except OSError as exc:
        raise InputError(display, f"cannot be read ({exc.strerror or exc})") from None
    with handle:
        try:
            head = handle.read(2)
            handle.seek(0)
        except OSError as exc:
            raise InputError(display, f"cannot be read ({exc.strerror or exc})") from None
        if head == GZIP_MAGIC:
            yield from _gunzip(handle, display, budget, block_bytes)
        else:
            yield from _plain(handle, display, budget, block_bytes)


def _plain(handle, display: str, budget: Budget, block_bytes: int) -> Iterator[bytes]:
    while True:
        block = _read(handle, display, block_bytes)
        if not block:
            return
        budget.take_bytes(len(block), display, compressed=False)
        yield block


def _read(handle, display: str, size: int) -> bytes:
    try:
        return handle.read(size)
    except OSError as exc:
        raise InputError(display, f"cannot be read ({exc.strerror or exc})") from None


def _only_padding_left(handle, display: str, rest: bytes) -> bool:
    """True when nothing but NUL padding follows a gzip member (some tools pad files)."""
    while True:
        if rest.strip(b"\0"):
            return False
        rest = _read(handle, display, _READ_BYTES)
        if not rest:
            return True


def _gunzip(handle, display: str, budget: Budget, block_bytes: int) -> Iterator[bytes]:
    """Inflates gzip members one after another (``cat a.gz b.gz`` is valid gzip)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pending = b""
    while True:
        if not pending:
            pending = _read(handle, display, _READ_BYTES)
            if not pending:
                break
        try:
            out = inflater.decompress(pending, block_bytes)
        except zlib.error as exc:
            raise InputError(display, f"is not valid gzip ({exc})") from None
        pending = inflater.unconsumed_tail
        if out:
            budget.take_bytes(len(out), display, compressed=True)
            yield out
        if inflater.eof:
            # what follows the member is unused_data alone: Python 3.11 leaves the same
            # bytes in unconsumed_tail too, and feeding both inflated the next member twice
            rest = inflater.unused_data
            pending = b""
            if not rest:
                rest = _read(handle, display, _READ_BYTES)
            if not rest:
                return
            if not rest.startswith(GZIP_MAGIC):
                if _only_padding_left(handle, display, rest):
                    return
                raise InputError(display, "has data after the end of its gzip stream")
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            pending = rest
    # Input exhausted: whatever inflate still holds back, then the end-of-stream check.
    try:
        out = inflater.flush()
    except zlib.error as exc:
        raise InputError(display, f"is not valid gzip ({exc})") from None
    if out:
        budget.take_bytes(len(out), display, compressed=True)
        yield out
    if not inflater.eof:
        raise InputError(display, "is a truncated gzip file (the stream ends early)")


_DONE = object()


def prefetch(blocks: Iterator[bytes], depth: int = 2) -> Iterator[bytes]:
    """Runs ``blocks`` (reading and inflating) in a thread, ``depth`` blocks ahead.

    zlib releases the GIL while it inflates, so decompression overlaps the JSON decode of
    the previous block. At most ``depth`` blocks wait in the queue: memory stays bounded.
    Errors (an InputError for a bomb or a truncated file) reach the consumer in order.
    """
    handoff: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for block in blocks:
                if not put(block):
                    return
            put(_DONE)
        except BaseException as exc:  # handed over: the consumer raises it in its thread
            put(exc)

    worker = threading.Thread(target=produce, name="trace-inflate", daemon=True)
    worker.start()
    try:
        while True:
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        worker.join()
