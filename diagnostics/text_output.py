"""Writing a CLI's text: to stdout, or to a file replaced in one step; and its error lines.

A report or reference written to ``-o FILE`` goes to a temporary file beside it first and
then replaces it, so a full disk or an interrupt never leaves half a file where the last
good one was. Replacing is a rename, and a rename replaces whatever the name is: run as
root, ``-o /dev/full`` turned the device node into a regular file, and a symbolic link,
a FIFO or ``/dev/stdout`` were replaced the same way. So ``-o`` writes only to a regular
file or a new name; anything else is refused, untouched, with one line. ``-o -`` is
standard output.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from diagnostics.errors import InputError
from diagnostics.printable import printable

STDOUT = "-"


class OutputRefused(InputError):
    """An ``-o`` path that is not a regular file or a new name (it is left untouched)."""


def _refusal(mode: int) -> str | None:
    """Why ``-o`` will not replace a path of this kind, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    to_stdout = "-o - writes to standard output"
    if stat.S_ISLNK(mode):
        kind, hint = "a symbolic link", "give the file it points to"
    elif stat.S_ISDIR(mode):
        kind, hint = "a directory", "give a file name inside it"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind, hint = "a device", to_stdout
    elif stat.S_ISFIFO(mode):
        kind, hint = "a named pipe", to_stdout
    elif stat.S_ISSOCK(mode):
        kind, hint = "a socket", to_stdout
    else:
        kind, hint = "of an unknown kind", to_stdout
    return f"is {kind}, not a regular file: left untouched ({hint})"


def check_output_path(path: str | os.PathLike[str]) -> None:
    """Raises OutputRefused unless ``path`` is a regular file or does not exist yet.

    ``lstat``: a symbolic link is judged as itself, since the rename would replace the
    link, never write through it.
    """
    name = os.fspath(path)
    if not name or name.endswith(os.sep):
        # "" is no file, and "new/" would be written as a file named "new"
        raise OutputRefused(name or "-o", "is not a file name (-o - writes to standard output)")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputRefused(path, f"cannot write ({exc.strerror or exc})") from None
    refusal = _refusal(mode)
    if refusal is not None:
        raise OutputRefused(path, refusal)


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """``text`` into ``path`` by a rename; raises OutputRefused for a path that is not a
    regular file or a new name, OSError for a failed write (nothing half-written is left)."""
    path = Path(path)
    check_output_path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        if path.exists():  # the file keeps its permissions (a private 0600 report stays private)
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        # checked again just before the rename: something may have been put there meanwhile
        check_output_path(path)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def emit(text: str, output: str | None) -> None:
    """To stdout when ``output`` is None or ``-``, else atomically into that file
    (OutputRefused or OSError raised)."""
    if output is None or output == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_atomic(output, text)


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
