"""A core shared with a busy process, for tests of the wait for a CPU (cpu_wait_ms)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@contextlib.contextmanager
def one_core_beside_a_busy_rival() -> Iterator[None]:
    """This process and a busy-looping one pinned to the same core, the rival running."""
    before = os.sched_getaffinity(0)
    core = min(before)
    os.sched_setaffinity(0, {core})
    rival = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 20\nwhile time.time() < end: pass"]
    )
    try:
        os.sched_setaffinity(rival.pid, {core})
        spin(0.05)  # let the rival get going
        yield
    finally:
        rival.kill()
        rival.wait()
        os.sched_setaffinity(0, before)
