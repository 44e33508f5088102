"""Writing a CLI's text: to stdout, or to ``-o`` as Unix tools write; and its error lines.

``-o`` writes where ``cp``, ``tee`` and ``curl -o`` write. A regular file (or a new name)
is replaced in one step: the text goes to a temporary file beside it first and is renamed
over it, so a full disk or an interrupt never leaves half a file where the last good one
was. A symbolic link is written through: its final target is replaced, and the link stays a
link. A character device or a named pipe is written in place (``-o /dev/null``), and
``/dev/stdout``, ``/dev/stderr`` and ``/dev/fd/N`` are that descriptor, as ``-o -`` is
standard output. What is never done is the fault this guards against: a rename onto a
device, a pipe or a link, which replaced it with a regular file (run as root, ``-o
/dev/full`` once turned the device node into a file). A directory, a socket and a block
device (a disk: a report is never meant for one) are refused, untouched, with one line.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from diagnostics.errors import InputError
from diagnostics.printable import printable

STDOUT = "-"
_FD_PATH = re.compile(r"^/(?:dev/fd|proc/self/fd)/(\d+)$")
_NAMED_FDS = {"/dev/stdout": 1, "/dev/stderr": 2}


class OutputRefused(InputError):
    """An ``-o`` path that cannot be written as Unix tools write (it is left untouched)."""


@dataclass(frozen=True)
class _Destination:
    how: str  # "replace" (a regular file or new name), "in_place" (a device or pipe), "fd"
    path: str  # for "replace": the file itself, a link's final target
    fd: int = -1


def _refusal(mode: int) -> str:
    """Why ``-o`` will not write to a path of this kind, in words."""
    to_stdout = "-o - writes to standard output"
    if stat.S_ISDIR(mode):
        kind, hint = "a directory", "give a file name inside it"
    elif stat.S_ISBLK(mode):
        kind, hint = "a block device", "a report is not written onto a disk"
    elif stat.S_ISSOCK(mode):
        kind, hint = "a socket", to_stdout
    else:
        kind, hint = "of an unknown kind", to_stdout
    return f"is {kind}, not a file: left untouched ({hint})"


def _destination(path: str | os.PathLike[str]) -> _Destination:
    """Where ``-o path`` writes, and how; raises OutputRefused for what it will not write."""
    name = os.fspath(path)
    if not name or name.endswith(os.sep):
        # "" is no file, and "new/" would be written as a file named "new"
        raise OutputRefused(name or "-o", "is not a file name (-o - writes to standard output)")
    normal = os.path.normpath(name)
    fd = _NAMED_FDS.get(normal)
    numbered = _FD_PATH.match(normal)
    if fd is not None or numbered:
        return _Destination("fd", name, fd if fd is not None else int(numbered.group(1)))
    try:
        mode = os.lstat(name).st_mode
    except FileNotFoundError:
        return _Destination("replace", name)
    except OSError as exc:
        raise OutputRefused(path, f"cannot write ({exc.strerror or exc})") from None
    target = name
    if stat.S_ISLNK(mode):
        target = os.path.realpath(name)
        try:
            mode = os.stat(name).st_mode
        except FileNotFoundError:  # a dangling link: its target is created, as tee does
            return _Destination("replace", target)
        except OSError as exc:  # a loop of links
            raise OutputRefused(path, f"cannot write ({exc.strerror or exc})") from None
    if stat.S_ISREG(mode):
        return _Destination("replace", target)
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return _Destination("in_place", name)
    raise OutputRefused(path, _refusal(mode))


def check_output_path(path: str | os.PathLike[str]) -> None:
    """Raises OutputRefused unless ``-o path`` can be written (see the module docstring);
    checked before a long analysis, so a refusal costs nothing."""
    _destination(path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _replace(path: Path, text: str, display: str | os.PathLike[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        if path.exists():  # the file keeps its permissions (a private 0600 report stays private)
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        # checked again just before the rename: something other than a regular file may
        # have been put there meanwhile, and a rename would replace it
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise OutputRefused(display, "changed while the report was written: left untouched")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_output(path: str | os.PathLike[str], text: str) -> None:
    """``text`` to ``-o path`` as Unix tools write it; raises OutputRefused for a path it
    will not write, OSError for a failed write (a replaced file is never half-written)."""
    where = _destination(path)
    if where.how == "replace":
        _replace(Path(where.path), text, path)
        return
    if where.how == "fd" and where.fd in (1, 2):
        stream = sys.stdout if where.fd == 1 else sys.stderr
        stream.write(text)
        stream.flush()
        return
    if where.how == "fd":
        _write_all(where.fd, text.encode("utf-8"))
        return
    # O_NOCTTY: writing to a terminal device must not make it this process's terminal;
    # no O_CREAT: if the node vanished since the check, nothing is created in its place
    fd = os.open(where.path, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _write_all(fd, text.encode("utf-8"))
    finally:
        os.close(fd)


def emit(text: str, output: str | None) -> None:
    """To stdout when ``output`` is None or ``-``, else to ``-o output`` (OutputRefused or
    OSError raised)."""
    if output is None or output == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_output(output, text)


def print_stderr(line: str) -> None:
    """One line on stderr, with any control character of a name in it made visible."""
    print(printable(line), file=sys.stderr)


def write_error_line(output: str | None, exc: OSError) -> str:
    """The one line for a failed write to ``output``."""
    where = "standard output" if output in (None, STDOUT) else output
    return f"error: {where}: cannot write ({exc.strerror or exc})"


def emit_or_exit_code(text: str, output: str | None) -> int:
    """``emit`` for a CLI: 0, or 2 with one ``error: FILE: ...`` line."""
    try:
        emit(text, output)
    except OutputRefused as exc:
        print_stderr(f"error: {exc}")
        return 2
    except OSError as exc:
        print_stderr(write_error_line(output, exc))
        return 2
    return 0
