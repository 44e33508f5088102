"""The one error type a user sees: bad input, told in one line.

The CLI prints ``str(error)`` and exits 2; the app shows it. The message always starts
with the file (or folder) it is about, then what is wrong with it.
"""

from __future__ import annotations

import os


class InputError(ValueError):
    """A trace, folder or run the analyser cannot read: ``"<file>: <what is wrong>"``."""

    def __init__(self, source: str | os.PathLike[str], problem: str):
        self.source = str(source)
        self.problem = " ".join(problem.split())  # one line, whatever the cause said
        super().__init__(f"{self.source}: {self.problem}")
