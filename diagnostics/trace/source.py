"""Bytes of a trace file, decompressed as a stream with a hard cap.

A trace upload is untrusted: a few megabytes of gzip can inflate to terabytes. Reading
goes block by block and stops with an :class:`InputError` as soon as the decompressed
total passes the input's byte budget (diagnostics.trace.budget), so memory stays bounded whatever the file holds. Gzip is
recognised by its magic bytes, not the file name (a ``.json.gz`` that is plain JSON, or a
``.json`` that is gzip, both load).

Gzip is inflated with ISA-L (the ``isal`` package) where it is installed, stdlib zlib
otherwise (:func:`default_inflater`); bench/bench_inflate.py measures both. They go through
the same code and give the same bytes and the same messages: a decoder's own error text is
never shown (zlib's and ISA-L's differ, and classify the same damage differently), and the
one header check ISA-L skips (reserved FLG bits, which zlib refuses) is made here for both.
Damaged deflate data itself can still part them: ISA-L accepts some Huffman tables zlib
refuses, so where zlib says corrupt, ISA-L may read on and find the stream truncated (or,
if the checksum still matches, whole). In a fuzz run of 13,500 randomly damaged files that
was 1.3 % of them. Intact files, and every case tests/diagnostics/trace/test_source.py
builds, give the same bytes and messages with both (before an error, ISA-L may have handed
out a few bytes fewer: it reads ahead).
"""

from __future__ import annotations

import os
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from diagnostics.errors import InputError
from diagnostics.trace.budget import DEFAULT_MAX_DECOMPRESSED_BYTES, Budget, Limits

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "ISAL",
    "ZLIB",
    "BytesRead",
    "Inflater",
    "default_inflater",
    "iter_blocks",
    "prefetch",
]

# What a trace file's name ends with (in a folder of ranks; for an early decode helper).
TRACE_SUFFIXES = (".json", ".json.gz")
GZIP_MAGIC = b"\x1f\x8b"
# Compressed bytes read per call, and the most decompressed bytes one block may carry.
_READ_BYTES = 1 << 20
BLOCK_BYTES = 1 << 20
# The gzip header's FLG byte (RFC 1952 2.3.1): bits 5-7 are reserved and must be zero.
_FLG_OFFSET = 3
_FLG_RESERVED = 0xE0
# One text for every decoder error: zlib and ISA-L word (and even classify) them differently.
CORRUPT_GZIP = "is not valid gzip (its compressed data is corrupt)"


class Inflater(NamedTuple):
    """A gzip decoder: ``new()`` is a fresh zlib-style Decompress object for one member."""

    name: str
    new: Callable[[], Any]
    error: type[Exception]


ZLIB = Inflater("zlib", lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), zlib.error)


def _isal_inflater() -> Inflater | None:
    try:
        from isal import isal_zlib
    except ImportError:
        return None
    # isal_zlib.Decompress has zlib's interface: decompress(data, max_length) bounded by
    # max_length, unconsumed_tail, unused_data, eof, flush(); wbits 16 + 15 reads gzip.
    return Inflater(
        "isal", lambda: isal_zlib.decompressobj(16 + isal_zlib.MAX_WBITS), isal_zlib.error
    )


ISAL = _isal_inflater()  # None where the isal package is not installed


class BytesRead:
    """How much of a file its reader has taken so far, as stored (compressed, for gzip):
    set by the thread that reads, read by any other (a progress report)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class _Counted:
    """A file handle that adds what each read returns to a BytesRead."""

    __slots__ = ("_handle", "_read")

    def __init__(self, handle: Any, read: BytesRead) -> None:
        self._handle, self._read = handle, read

    def read(self, size: int) -> bytes:
        data = self._handle.read(size)
        self._read.count += len(data)
        return data


def default_inflater() -> Inflater:
    """ISA-L where ``isal`` imports, stdlib zlib otherwise."""
    return ISAL or ZLIB


def iter_blocks(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    display: str | None = None,
    block_bytes: int = BLOCK_BYTES,
    budget: Budget | None = None,
    inflater: Inflater | None = None,
    read: BytesRead | None = None,
) -> Iterator[bytes]:
    """Yields the file's (decompressed) content in blocks of at most ``block_bytes``.

    Every block is drawn from ``budget`` (shared by all files of one input); without one,
    this file alone may decompress to ``max_bytes``. ``inflater`` (gzip only) defaults to
    :func:`default_inflater`. ``read`` counts the file's bytes as they are read.
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
        stream = handle if read is None else _Counted(handle, read)
        if head == GZIP_MAGIC:
            yield from _gunzip(stream, display, budget, block_bytes, inflater or default_inflater())
        else:
            yield from _plain(stream, display, budget, block_bytes)


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


def _member_start(handle, display: str, data: bytes) -> bytes:
    """``data`` (a member's first bytes), its FLG byte checked: ISA-L ignores reserved bits."""
    while len(data) <= _FLG_OFFSET:
        more = _read(handle, display, _READ_BYTES)
        if not more:
            return data  # too short for a header: inflate sees a truncated stream
        data += more
    if data[_FLG_OFFSET] & _FLG_RESERVED:
        raise InputError(display, CORRUPT_GZIP)
    return data


def _gunzip(
    handle, display: str, budget: Budget, block_bytes: int, inflater: Inflater
) -> Iterator[bytes]:
    """Inflates gzip members one after another (``cat a.gz b.gz`` is valid gzip)."""
    member = inflater.new()
    pending = _member_start(handle, display, _read(handle, display, _READ_BYTES))
    while True:
        if not pending:
            pending = _read(handle, display, _READ_BYTES)
            if not pending:
                break
        try:
            out = member.decompress(pending, block_bytes)
        except inflater.error:
            raise InputError(display, CORRUPT_GZIP) from None
        pending = member.unconsumed_tail
        if out:
            budget.take_bytes(len(out), display, compressed=True)
            yield out
        if member.eof:
            # what follows the member is unused_data alone: Python 3.11's zlib leaves the
            # same bytes in unconsumed_tail too, and feeding both inflated the next member
            # twice (ISA-L leaves unconsumed_tail empty)
            rest = member.unused_data
            pending = b""
            while len(rest) < len(GZIP_MAGIC):  # the next member's magic may straddle reads
                more = _read(handle, display, _READ_BYTES)
                if not more:
                    break
                rest += more
            if not rest:
                return
            if not rest.startswith(GZIP_MAGIC):
                if _only_padding_left(handle, display, rest):
                    return
                raise InputError(display, "has data after the end of its gzip stream")
            member = inflater.new()
            pending = _member_start(handle, display, rest)
    # Input exhausted: whatever inflate still holds back, then the end-of-stream check.
    try:
        out = member.flush()
    except inflater.error:
        raise InputError(display, CORRUPT_GZIP) from None
    if out:
        budget.take_bytes(len(out), display, compressed=True)
        yield out
    if not member.eof:
        raise InputError(display, "is a truncated gzip file (the stream ends early)")


_DONE = object()


def prefetch(blocks: Iterator[bytes], depth: int = 2) -> Iterator[bytes]:
    """Runs ``blocks`` (reading and inflating) in a thread, ``depth`` blocks ahead.

    zlib and ISA-L release the GIL while they inflate, so decompression overlaps the JSON
    decode of the previous block. At most ``depth`` blocks wait in the queue: memory stays
    bounded. Errors (an InputError for a bomb or a truncated file) reach the consumer in order.
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
