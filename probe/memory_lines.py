"""Line-level memory with memory_profiler, for the training step and ``__getitem__``.

memory_profiler traces every line of a wrapped function and reads the process RSS after
each one, so it slows the wrapped code down a lot: it runs only with ``--memory-lines``.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable
from typing import Any, TypeVar

from memory_profiler import LineProfiler

F = TypeVar("F", bound=Callable[..., Any])


class NullMemoryLines:
    def wrap(self, func: F) -> F:
        return func

    def rows(self) -> list[dict[str, Any]]:
        return []


class MemoryLines(NullMemoryLines):
    def __init__(self) -> None:
        # include_children stays off: DataLoader workers are counted by the system sampler
        self._profiler = LineProfiler(backend="psutil", include_children=False)

    def wrap(self, func: F) -> F:
        return self._profiler(func)  # type: ignore[return-value]

    def rows(self) -> list[dict[str, Any]]:
        """One row per executed line: MEMORY_LINE_SCHEMA of diagnostics.runs."""
        code_map = self._profiler.code_map
        rows = []
        for filename, code, linenos in code_map._toplevel:
            measures = code_map[code]
            for line in linenos:
                measure = measures.get(line)
                if measure is None:
                    continue
                increment_mib, mem_usage_mib, occurrences = measure
                rows.append(
                    {
                        "function": getattr(code, "co_qualname", code.co_name),
                        "filename": filename,
                        "line": line,
                        "mem_usage_mib": float(mem_usage_mib),
                        "increment_mib": float(increment_mib),
                        "occurrences": int(occurrences),
                        "source": linecache.getline(filename, line).rstrip(),
                    }
                )
        return rows


def make_memory_lines(enabled: bool) -> NullMemoryLines:
    return MemoryLines() if enabled else NullMemoryLines()
