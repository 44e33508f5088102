"""Uploaded archives of rank traces (.zip, .tar, .tar.gz/.tgz), unpacked safely.

An archive is untrusted input, so unpacking is bounded and flat:

- nothing is written where the archive says: every trace member is written into one given
  folder under a fresh safe name made from its base name (no ``..``, no absolute paths, no
  folders), so path traversal cannot happen;
- only regular files are read (no links, devices or FIFOs); members that are not traces
  (``.json``/``.json.gz``) are skipped, and so are nested archives;
- the number of members read is bounded (``MAX_ARCHIVE_MEMBERS``) and so are the bytes
  written, counted as they are written rather than trusted from the headers, against the
  input's decompressed-byte budget (``Limits.max_decompressed_bytes``, diagnostics.trace.
  budget), one :class:`ArchiveBudget` for all archives of an upload: a zip bomb, or several
  archives each under the limit, stop at the budget with a one-line error naming it.

Each trace keeps the name ``<archive>/<member path>`` for messages, so the user sees which
file of which archive a problem is about. The decompressed size of each trace's JSON is
bounded later by the loader, as for any uploaded trace.
"""

from __future__ import annotations

import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO

from diagnostics.errors import InputError
from diagnostics.trace.budget import ENV_MAX_DECOMPRESSED_MB, Limits, human_bytes

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
TRACE_SUFFIXES = (".json", ".json.gz")
# Every member an archive may list (traces, folders, other files): enough for a few hundred
# rank files, few enough that listing them costs nothing.
MAX_ARCHIVE_MEMBERS = 1024
_CHUNK = 1024 * 1024


def is_archive_name(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _is_trace_member(name: str) -> bool:
    base = PurePosixPath(name.replace("\\", "/")).name
    return (
        name.lower().endswith(TRACE_SUFFIXES)
        and not base.startswith(".")  # macOS "._rank0.json" resource forks
        and "__MACOSX/" not in name
    )


def _safe_name(member: str, taken: set[str]) -> str:
    from diagnostics.views.uploads import safe_upload_name

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

    def copy(self, source: IO[bytes], target: Path, member: str) -> None:
        budget = self.budget
        with target.open("wb") as out:
            while chunk := source.read(_CHUNK):
                budget.written += len(chunk)
                if budget.written > budget.max_bytes:
                    raise InputError(
                        self.archive,
                        f"unpacks to more than {human_bytes(budget.max_bytes)} (stopped in "
                        f"{member}; all archives of the upload together), the limit (raise "
                        f"{ENV_MAX_DECOMPRESSED_MB} to read it)",
                    )
                out.write(chunk)


@contextmanager
def _opened(name: str, handle: BinaryIO) -> Iterator[zipfile.ZipFile | tarfile.TarFile]:
    handle.seek(0)
    try:
        if name.lower().endswith(".zip"):
            with zipfile.ZipFile(handle) as archive:
                yield archive
        else:
            # streaming mode: members are read in order, the headers are never seeked
            with tarfile.open(fileobj=handle, mode="r|*") as archive:
                yield archive
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        raise InputError(name, f"is not a readable archive ({exc})") from None


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
    out: list[tuple[str, Path]] = []
    with _opened(name, handle) as archive:
        if isinstance(archive, zipfile.ZipFile):
            infos = archive.infolist()
            if len(infos) > max_members:
                reader.member()  # raises with the count message
            for info in infos:
                reader.member()
                if info.is_dir() or not _is_trace_member(info.filename):
                    continue
                target = folder / _safe_name(info.filename, taken)
                with archive.open(info) as source:
                    reader.copy(source, target, info.filename)
                out.append((f"{name}/{info.filename}", target))
        else:
            for member in archive:
                reader.member()
                if not member.isreg() or not _is_trace_member(member.name):
                    continue
                source = archive.extractfile(member)
                if source is None:
                    continue
                target = folder / _safe_name(member.name, taken)
                with source:
                    reader.copy(source, target, member.name)
                out.append((f"{name}/{member.name}", target))
    if not out:
        raise InputError(name, "holds no trace files (.json, .json.gz)")
    return out
