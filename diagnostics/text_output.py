"""Writing a CLI's text: to stdout, or to a file replaced in one step.

A report or reference written to ``-o FILE`` goes to a temporary file beside it first and
then replaces it, so a full disk or an interrupt never leaves half a file where the last
good one was.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """``text`` into ``path`` by a rename; raises OSError (nothing half-written is left)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def emit(text: str, output: str | None) -> None:
    """To stdout when ``output`` is None, else atomically into that file (OSError raised)."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_atomic(output, text)


def emit_or_exit_code(text: str, output: str | None) -> int:
    """``emit`` for a CLI: 0, or 2 with one ``error: FILE: cannot write (...)`` line."""
    try:
        emit(text, output)
    except OSError as exc:
        print(f"error: {output}: cannot write ({exc.strerror or exc})", file=sys.stderr)
        return 2
    return 0
