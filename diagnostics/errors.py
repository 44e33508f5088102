"""The one error type a user sees: bad input, told in one line.

The CLI prints ``str(error)`` and exits 2; the app shows it. The message always starts
with the file (or folder, or field) it is about, then what is wrong with it. Both parts
are shown through :func:`diagnostics.printable.printable`: a newline or a terminal
control character in a file name cannot split the line or reach the terminal.
"""

from __future__ import annotations

import os

from diagnostics.printable import printable


class InputError(ValueError):
    """A trace, folder or run the analyser cannot read: ``"<file>: <what is wrong>"``."""

    def __init__(self, source: str | os.PathLike[str], problem: str):
        self.source = printable(os.fspath(source) if isinstance(source, os.PathLike) else source)
        # one line, whatever the cause said
        self.problem = printable(" ".join(problem.split()))
        super().__init__(f"{self.source}: {self.problem}")


class AnalysisBug(InputError):
    """A bug in the analyser met while it read an input in the bounded child
    (diagnostics.isolated). Still one line, and an InputError so that the page shows it as
    one; the CLI exits 1 for it, as for a bug in its own process, not 2 as for bad input."""
