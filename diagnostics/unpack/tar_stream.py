"""A tar stream read header by header, with every byte it reads counted and capped.

``tarfile`` reads a GNU long-name (``././@LongLink``) or pax record whole, however large its
header says it is: a 7 MB ``.tar.gz`` whose long-name header claimed 1.5 GiB took the
reading process to 3.1 GB. Here the 512-byte header blocks are parsed directly, an extension
record (long name, long link name, pax) over ``MAX_EXTENSION_BYTES`` is refused before any
of it is read, and every byte of the stream (headers, records, member data read or skipped)
is drawn from the caller's budget through ``take``, so memory stays at one block whatever the
headers claim. Only what a trace archive needs is read: a member's name, type and size.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from diagnostics.errors import InputError
from diagnostics.trace.budget import human_bytes

BLOCK = 512
# A long name is a path: 64 KiB is far more than any file system allows (PATH_MAX 4 KiB).
# A pax record holds a few such values (path, linkpath, times, owner names).
MAX_EXTENSION_BYTES = 64 * 1024
# Extension records allowed before one member (tar writes at most a pax and a long name
# and a long link name for one file); more in a row is a stream of headers, not files.
MAX_EXTENSIONS_PER_MEMBER = 8
_READ = 1024 * 1024
_REGULAR = (b"0", b"\0", b"7")
_EXTENSIONS = {
    b"L": "GNU long-name",
    b"K": "GNU long-link-name",
    b"x": "pax",
    b"g": "pax global",
}
_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError)


@dataclass(frozen=True)
class TarMember:
    name: str
    size: int
    regular: bool


def member_text(name: str) -> str:
    """A member name for a one-line message (control characters as '?', cut at 200)."""
    cleaned = "".join(c if c.isprintable() else "?" for c in name)
    return cleaned if len(cleaned) <= 200 else cleaned[:200] + "…"


def _number(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256, for sizes of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _checksum_ok(block: bytes) -> bool:
    try:
        stored = _number(block[148:156])
    except ValueError:
        return False
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
    signed = unsigned - 2 * sum(b for b in block[:148] + block[156:] if b > 127)
    return stored in (unsigned, signed)


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax(record: bytes) -> dict[str, str]:
    """The ``"<length> <key>=<value>\\n"`` records of a pax header."""
    values, pos = {}, 0
    while pos < len(record) and record[pos:].strip(b"\0"):
        space = record.find(b" ", pos)
        length = int(record[pos:space]) if space > pos else 0
        end = pos + length
        if length <= 0 or end > len(record) or record[end - 1 : end] != b"\n":
            raise ValueError("a malformed pax record")
        key, eq, value = record[space + 1 : end - 1].partition(b"=")
        if not eq:
            raise ValueError("a malformed pax record")
        values[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return values


def decompressed(handle: BinaryIO) -> BinaryIO:
    """The tar stream inside ``handle``: gzip, bzip2 or xz by their magic bytes, else plain."""
    head = handle.read(6)
    handle.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=handle, mode="rb")  # type: ignore[return-value]
    if head.startswith(b"BZh"):
        return bz2.BZ2File(handle)  # type: ignore[return-value]
    if head.startswith(b"\xfd7zXZ\0"):
        return lzma.LZMAFile(handle)  # type: ignore[return-value]
    return handle


class TarStream:
    """Members of a tar stream in order; ``copy`` or skip each one's data before the next.

    ``take(n, member)`` is called before each ``n`` bytes are read (headers included) and
    raises when the budget is spent."""

    def __init__(self, archive: str, handle: BinaryIO, take: Callable[[int, str], None]):
        self.archive, self.take = archive, take
        self.stream = decompressed(handle)
        self.left = 0  # data and padding of the current member still unread
        self.data_left = 0  # its data alone
        self.current = ""

    def _error(self, member: str, problem: str) -> InputError:
        where = f"member {member_text(member)}: " if member else ""
        return InputError(self.archive, f"{where}{problem}")

    def _read(self, size: int, member: str) -> bytes:
        self.take(size, member)
        try:
            data = self.stream.read(size)
        except _ERRORS as exc:
            raise self._error(member, f"is not a readable archive ({exc})") from None
        return data

    def _exactly(self, size: int, member: str) -> bytes:
        data = self._read(size, member)
        if len(data) != size:
            raise self._error(member, "the archive ends inside this member (truncated)")
        return data

    def read(self, size: int = _READ) -> bytes:
        """Up to ``size`` bytes of the current member's data; b"" at its end."""
        want = min(size, self.data_left)
        if want <= 0:
            return b""
        data = self._exactly(want, self.current)
        self.data_left -= len(data)
        self.left -= len(data)
        return data

    def _skip_rest(self) -> None:
        while self.left > 0:
            chunk = self._exactly(min(_READ, self.left), self.current)
            self.left -= len(chunk)
        self.data_left = 0

    def __iter__(self) -> Iterator[TarMember]:
        extended: dict[str, str] = {}
        extensions = 0
        previous = ""
        while True:
            self._skip_rest()
            block = self._read(BLOCK, previous)
            if not block or not block.strip(b"\0"):
                return  # the end-of-archive blocks (or a stream that stops between members)
            if len(block) < BLOCK:
                raise self._error(previous, "the archive ends inside a header (truncated)")
            if not _checksum_ok(block):
                where = f" after {member_text(previous)}" if previous else ""
                raise InputError(
                    self.archive, f"is not a readable archive (a bad tar header{where})"
                )
            name = _text(block[0:100])
            if block[257:263] == b"ustar\0" and block[345:500].strip(b"\0"):
                name = _text(block[345:500]) + "/" + name
            kind = block[156:157]
            try:
                size = _number(block[124:136])
            except ValueError:
                raise self._error(name, "a header with an unreadable size") from None
            padded = -(-size // BLOCK) * BLOCK
            if kind in _EXTENSIONS:
                extensions += 1
                if extensions > MAX_EXTENSIONS_PER_MEMBER:
                    raise self._error(
                        name, f"more than {MAX_EXTENSIONS_PER_MEMBER} extension headers in a row"
                    )
                if size > MAX_EXTENSION_BYTES:
                    raise self._error(
                        name,
                        f"its {_EXTENSIONS[kind]} header claims {human_bytes(size)}, over the "
                        f"{human_bytes(MAX_EXTENSION_BYTES)} such a header may hold; refused",
                    )
                record = self._exactly(padded, name)[:size]
                if kind == b"L":
                    extended["path"] = _text(record)
                elif kind == b"x":
                    try:
                        extended.update(_pax(record))
                    except ValueError as exc:
                        raise self._error(name, f"{exc}") from None
                previous = name
                continue
            name = extended.get("path", name)
            if "size" in extended:
                try:
                    size = int(extended["size"])
                except ValueError:
                    raise self._error(name, "a pax size that is not a number") from None
                if size < 0:
                    raise self._error(name, "a negative pax size")
                padded = -(-size // BLOCK) * BLOCK
            extended, extensions = {}, 0
            self.current, previous = name, name
            self.left, self.data_left = padded, size
            yield TarMember(name=name, size=size, regular=kind in _REGULAR)
