"""Uploaded archives of rank traces (.zip, .tar, .tar.gz/.tgz), unpacked safely.

An archive is untrusted input, so unpacking is bounded and flat:

- nothing is written where the archive says: every trace member is written into one given
  folder under a fresh safe name made from its base name (no ``..``, no absolute paths, no
  folders), so path traversal cannot happen;
- only regular files are read (no links, devices or FIFOs); members that are not traces
  (``.json``/``.json.gz``) are skipped, and so are nested archives;
- the number of members is bounded (``MAX_ARCHIVE_MEMBERS``) before anything is built from
  them: a zip's count and central-directory size are read from its end-of-central-directory
  record before ``ZipFile`` lists a member (a million-member zip cost 600 MB before it was
  refused), a tar's members are counted as its headers stream by;
- every byte read is counted, rather than trusted from the headers, against the input's
  decompressed-byte budget (``Limits.max_decompressed_bytes``, diagnostics.trace.budget),
  one :class:`ArchiveBudget` for all archives of an upload: a zip bomb, or several archives
  each under the limit, stop at the budget with a one-line error naming it. A tar is read
  header by header (diagnostics.unpack.tar_stream), so a long-name or pax header claiming
  gigabytes is refused before it is read, and its headers and skipped members count too;
- an encrypted member, a compression method this Python cannot inflate, a corrupt member:
  one line naming the archive and the member.

Uploads are unpacked by the bounded analysis child (diagnostics.upload_analysis), never
in the server process.

Each trace keeps the name ``<archive>/<member path>`` for messages, so the user sees which
file of which archive a problem is about. The decompressed size of each trace's JSON is
bounded later by the loader, as for any uploaded trace.
"""

from __future__ import annotations

import lzma
import struct
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO

from diagnostics.errors import InputError
from diagnostics.trace.budget import ENV_MAX_DECOMPRESSED_MB, Limits, human_bytes
from diagnostics.trace.source import TRACE_SUFFIXES
from diagnostics.unpack.tar_stream import TarStream, member_text

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
# CUDA memory snapshots travel in archives too; the restricted reader reads them after
SNAPSHOT_SUFFIXES = (".pickle", ".pickle.gz")
# Every member an archive may list (traces, folders, other files): enough for a few hundred
# rank files, few enough that listing them costs nothing.
MAX_ARCHIVE_MEMBERS = 1024
# A zip's list of members: 1,024 entries of 46 bytes plus a path and its extra fields are
# a few hundred KiB; ZipFile reads the whole directory into memory before it counts.
MAX_CENTRAL_DIRECTORY_BYTES = 4 * 1024 * 1024
_CHUNK = 1024 * 1024
_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_ZIP_METHODS = {
    zipfile.ZIP_STORED: "stored",
    zipfile.ZIP_DEFLATED: "deflate",
    zipfile.ZIP_BZIP2: "bzip2",
    zipfile.ZIP_LZMA: "lzma",
}
_MEMBER_ERRORS = (
    zipfile.BadZipFile,
    OSError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    ValueError,
    NotImplementedError,
    RuntimeError,
)


def is_archive_name(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _is_trace_member(name: str) -> bool:
    base = PurePosixPath(name.replace("\\", "/")).name
    return (
        name.lower().endswith(TRACE_SUFFIXES + SNAPSHOT_SUFFIXES)
        and not base.startswith(".")  # macOS "._rank0.json" resource forks
        and "__MACOSX/" not in name
    )


def _safe_name(member: str, taken: set[str]) -> str:
    from diagnostics.unpack.names import safe_upload_name

    safe = safe_upload_name(member)
    stem, dot, ext = safe.partition(".")
    candidate, n = safe, 1
    while candidate in taken:
        candidate, n = f"{stem}-{n}{dot}{ext}", n + 1
    taken.add(candidate)
    return candidate


class ArchiveBudget:
    """Bytes unpacked out of all archives of one input, against its byte budget.

    Members are counted as written (a .json.gz member as its compressed bytes, which the
    loader then counts again, inflated, against the same limit)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.written = 0


class _Archive:
    def __init__(self, archive: str, max_members: int, budget: ArchiveBudget):
        self.archive, self.max_members, self.budget = archive, max_members, budget
        self.members = 0

    def member(self) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise InputError(
                self.archive, f"holds more than {self.max_members} members; upload fewer files"
            )

    def take(self, size: int, member: str) -> None:
        budget = self.budget
        budget.written += size
        if budget.written > budget.max_bytes:
            stopped = f"stopped in {member_text(member)}; " if member else ""
            raise InputError(
                self.archive,
                f"unpacks to more than {human_bytes(budget.max_bytes)} ({stopped}all "
                f"archives of the upload together), the limit (raise "
                f"{ENV_MAX_DECOMPRESSED_MB} to read it)",
            )

    def copy(self, source: IO[bytes], target: Path, member: str) -> None:
        with target.open("wb") as out:
            while True:
                try:
                    chunk = source.read(_CHUNK)
                except InputError:
                    raise
                except _MEMBER_ERRORS as exc:
                    raise InputError(
                        self.archive, f"member {member_text(member)}: cannot be read ({exc})"
                    ) from None
                if not chunk:
                    return
                if not isinstance(source, TarStream):  # a tar's reads are counted as read
                    self.take(len(chunk), member)
                out.write(chunk)


def _central_directory(name: str, handle: BinaryIO) -> tuple[int, int]:
    """(members, central-directory bytes) as the end-of-central-directory record says,
    read from the archive's last 64 KiB before ZipFile builds anything."""
    handle.seek(0, 2)
    size = handle.tell()
    tail_start = max(0, size - (22 + 0xFFFF))
    handle.seek(tail_start)
    tail = handle.read()
    at = tail.rfind(_EOCD)
    if at < 0 or len(tail) - at < 22:
        raise InputError(name, "is not a readable archive (no zip end-of-central-directory)")
    _, _, _, _, members, directory_bytes, _, _ = struct.unpack("<4s4H2LH", tail[at : at + 22])
    locator = at - 20
    if locator >= 0 and tail[locator : locator + 4] == _EOCD64_LOCATOR:
        (offset,) = struct.unpack("<Q", tail[locator + 8 : locator + 16])
        handle.seek(offset)
        record = handle.read(56)
        if len(record) == 56 and record[:4] == _EOCD64:
            members, directory_bytes = struct.unpack("<QQ", record[32:48])
    return members, directory_bytes


def _zip_members(name: str, handle: BinaryIO, reader: _Archive) -> zipfile.ZipFile:
    members, directory_bytes = _central_directory(name, handle)
    if members > reader.max_members:
        raise InputError(
            name,
            f"holds more than {reader.max_members} members ({members:,}, its directory "
            "says); upload fewer files",
        )
    if directory_bytes > MAX_CENTRAL_DIRECTORY_BYTES:
        raise InputError(
            name,
            f"lists its members in {human_bytes(directory_bytes)}, over the "
            f"{human_bytes(MAX_CENTRAL_DIRECTORY_BYTES)} {reader.max_members} members take; "
            "upload fewer files",
        )
    handle.seek(0)
    try:
        return zipfile.ZipFile(handle)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, struct.error) as exc:
        raise InputError(name, f"is not a readable archive ({exc})") from None


def _check_zip_member(name: str, info: zipfile.ZipInfo) -> None:
    if info.flag_bits & 0x1:
        raise InputError(
            name,
            f"member {member_text(info.filename)}: is encrypted (password-protected); upload it unencrypted",
        )
    if info.compress_type not in _ZIP_METHODS:
        raise InputError(
            name,
            f"member {member_text(info.filename)}: uses zip compression method {info.compress_type}, "
            f"which cannot be read here (use {', '.join(_ZIP_METHODS.values())})",
        )


def _extract_zip(
    name: str, handle: BinaryIO, folder: Path, reader: _Archive, taken: set[str]
) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    with _zip_members(name, handle, reader) as archive:
        infos = archive.infolist()
        for _ in infos:
            reader.member()  # a directory that lied about its count
        wanted = [i for i in infos if not i.is_dir() and _is_trace_member(i.filename)]
        for info in wanted:
            _check_zip_member(name, info)
        for info in wanted:
            target = folder / _safe_name(info.filename, taken)
            try:
                source = archive.open(info)
            except _MEMBER_ERRORS as exc:
                raise InputError(
                    name, f"member {member_text(info.filename)}: cannot be read ({exc})"
                ) from None
            with source:
                reader.copy(source, target, info.filename)
            out.append((f"{name}/{info.filename}", target))
    return out


def _extract_tar(
    name: str, handle: BinaryIO, folder: Path, reader: _Archive, taken: set[str]
) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    stream = TarStream(name, handle, reader.take)
    for member in stream:
        reader.member()
        if not member.regular or not _is_trace_member(member.name):
            continue  # its data is skipped (and counted) before the next header
        target = folder / _safe_name(member.name, taken)
        reader.copy(stream, target, member.name)
        out.append((f"{name}/{member.name}", target))
    return out


def extract_traces(
    name: str,
    handle: BinaryIO,
    folder: Path,
    *,
    max_members: int = MAX_ARCHIVE_MEMBERS,
    max_bytes: int | None = None,
    budget: ArchiveBudget | None = None,
) -> list[tuple[str, Path]]:
    """The archive's trace files written flat into ``folder``: [(display name, path)].

    ``budget`` is shared by every archive of one input; without it this archive alone may
    unpack ``max_bytes`` (default: the input byte budget from the environment)."""
    folder.mkdir(parents=True, exist_ok=True)
    if budget is None:
        budget = ArchiveBudget(max_bytes or Limits.from_env().max_decompressed_bytes)
    reader = _Archive(name, max_members, budget)
    taken: set[str] = set()
    handle.seek(0)
    extract = _extract_zip if name.lower().endswith(".zip") else _extract_tar
    try:
        out = extract(name, handle, folder, reader, taken)
    except InputError:
        raise
    except MemoryError:
        raise InputError(name, "needs more memory to unpack than this analysis has") from None
    except _MEMBER_ERRORS as exc:
        raise InputError(name, f"is not a readable archive ({exc})") from None
    if not out:
        raise InputError(
            name, "holds no trace files (.json, .json.gz) or memory snapshots (.pickle, .pickle.gz)"
        )
    return out


def _extract_file(
    name: str, path: Path, folder: Path, budget: ArchiveBudget
) -> list[tuple[str, Path]]:
    try:
        with path.open("rb") as handle:
            return extract_traces(name, handle, folder, budget=budget)
    except OSError as exc:  # opening it; reading errors are the archive's own lines
        raise InputError(name, f"cannot be read ({exc.strerror or exc})") from None


def unpack_archives(
    paths: Sequence[Path], names: Sequence[str], max_bytes: int
) -> tuple[list[str], list[Path]]:
    """Each archive among ``paths`` replaced by its trace members, unpacked into a folder
    beside it (``<archive>.unpacked``); all archives draw on one byte budget, ``max_bytes``.
    Other files stay as they are. Returns (the names the user sees, the paths)."""
    budget = ArchiveBudget(max_bytes)
    out_names: list[str] = []
    out_paths: list[Path] = []
    for path, name in zip(paths, names, strict=True):
        if not is_archive_name(name):
            out_names.append(name)
            out_paths.append(Path(path))
            continue
        folder = Path(path).with_name(Path(path).name + ".unpacked")
        for shown, member in _extract_file(name, Path(path), folder, budget):
            out_names.append(shown)
            out_paths.append(member)
    return out_names, out_paths
