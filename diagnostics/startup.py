"""The analyser's imports at a command's start, with the cyclic garbage collector paused.

Importing the analyser (polars and about 110 modules of ours) creates some 60,000 objects,
and the collector, which runs every 700 new ones, scanned them over and over: 10 ms of the
0.17 s the imports take. Nothing made while importing is garbage, so the collector waits
until the imports are done; then the objects are frozen (``gc.freeze``), so that later
collections skip them too.
"""

from __future__ import annotations

import gc


def import_analyser() -> None:
    """Imports diagnostics.analyze (and so every module an analysis runs)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        import diagnostics.analyze  # noqa: F401
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
