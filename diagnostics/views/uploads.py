"""Uploaded traces: safe names, a private temporary copy for the analyser, and saving."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from diagnostics.unpack.names import MAX_UPLOAD_FILES, safe_upload_name


def is_trace_name(name: str) -> bool:
    return name.lower().endswith((".json", ".json.gz"))


def upload_key(files: Iterable[tuple[str, int, str]]) -> str:
    """A stable key for a set of uploads (name, size, content digest), order-independent."""
    return "|".join(sorted(f"{name}:{size}:{digest}" for name, size, digest in files))


def saved_upload_dir(runs_dir: str | Path, now: float | None = None) -> Path:
    """Where 'Save upload' keeps files: <runs_dir>/uploads/<UTC stamp>/."""
    now = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f"-{int((now % 1) * 1000):03d}"
    return Path(runs_dir) / "uploads" / stamp


def _unique_names(names: Sequence[str]) -> list[str]:
    """Safe disk names, numbered where two uploads would share one."""
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        safe = safe_upload_name(name)
        count = seen.get(safe, 0)
        seen[safe] = count + 1
        if count:
            stem, dot, ext = safe.partition(".")
            safe = f"{stem}-{count}{dot}{ext}"
        unique.append(safe)
    return unique


def write_uploads(files: Sequence[tuple[str, BinaryIO]], folder: Path) -> list[Path]:
    """Streams uploads into folder in 1 MiB chunks (never a second in-memory copy)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for (_, handle), safe in zip(files, _unique_names([n for n, _ in files]), strict=True):
        path = folder / safe
        handle.seek(0)
        with path.open("wb") as out:
            shutil.copyfileobj(handle, out, length=1024 * 1024)
        paths.append(path)
    return paths


def upload_limits_text(environ: dict[str, str] | None = None) -> str:
    """The limits an upload is analysed under, for the page (what the environment sets)."""
    from diagnostics.isolated import ChildLimits
    from diagnostics.trace.budget import Limits
    from diagnostics.views.fmt import fmt_bytes

    try:
        limits, child = Limits.from_env(environ), ChildLimits.from_env(environ)
    except ValueError as exc:
        return f"limits misconfigured: {exc}"
    return (
        f"at most **{fmt_bytes(limits.max_decompressed_bytes)}** decompressed and "
        f"**{limits.max_events:,} events** for all files together, analysed within "
        f"**{fmt_bytes(child.memory_bytes)}** of memory and **{child.timeout_s:g} s**"
    )


def write_inputs(
    files: Sequence[tuple[str, BinaryIO]], folder: Path, max_unpacked_bytes: int
) -> tuple[list[str], list[Path]]:
    """The uploaded files written into ``folder`` and their archives unpacked beside them,
    in this process: (the names the user sees, the paths). All archives of the upload draw
    on one byte budget, ``max_unpacked_bytes`` (the input's decompressed-byte limit). The
    Upload page instead writes the files only and has its bounded child unpack them
    (diagnostics.upload_analysis)."""
    from diagnostics.unpack.archives import unpack_archives

    names = [name for name, _ in files]
    return unpack_archives(write_uploads(files, folder), names, max_unpacked_bytes)


def analyse_uploads(
    files: Sequence[tuple[str, BinaryIO]],
    analyse: Callable[..., Any],
    temp_root: str | Path | None = None,
) -> Any:
    """Analyses uploaded traces from a private temporary folder that is always removed.

    ``analyse`` is ``diagnostics.analyze.analyze_files``; it receives the temporary paths
    and the names the user uploaded, so messages name the user's file, not the temp copy.
    An archive (.zip, .tar.gz) of rank traces is unpacked, bounded, beside them
    (diagnostics.unpack.archives).
    Raises InputError (from the analyser, or here for a file that is not a trace).
    """
    from diagnostics.errors import InputError
    from diagnostics.unpack.archives import is_archive_name

    def too_many(count: int) -> InputError:
        return InputError(
            f"{count} files",
            f"too many at once; upload at most {MAX_UPLOAD_FILES} (one per rank)",
        )

    if len(files) > MAX_UPLOAD_FILES:
        raise too_many(len(files))
    for name, _ in files:
        if not is_trace_name(name) and not is_archive_name(name):
            raise InputError(
                name, "not a trace file; upload .json or .json.gz files, or a .zip/.tar.gz of them"
            )
    folder = Path(tempfile.mkdtemp(prefix="pipeline-doctor-upload-", dir=temp_root))
    try:
        from diagnostics.trace.budget import Limits

        names, paths = write_inputs(files, folder, Limits.from_env().max_decompressed_bytes)
        if len(paths) > MAX_UPLOAD_FILES:
            raise too_many(len(paths))
        return analyse(paths, display_names=names)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def save_uploads(
    files: Sequence[tuple[str, BinaryIO]], runs_dir: str | Path, now: float | None = None
) -> Path:
    """Keeps the uploads the user chose to save under <runs_dir>/uploads/<stamp>/."""
    folder = saved_upload_dir(runs_dir, now)
    write_uploads(files, folder)
    return folder
