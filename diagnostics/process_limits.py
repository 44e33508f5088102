"""Small Linux process controls for the analysis child, the rank pool's workers and the
decode helper.

Standard library only (ctypes, resource), so the CLI's parent and the app's server import it
without paying for polars.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import threading
from collections.abc import Callable
from typing import IO

# prctl(2): deliver a signal to this process when the thread that started it ends
_PR_SET_PDEATHSIG = 1


def usable_cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def address_space_limit() -> int | None:
    """This process's soft RLIMIT_AS in bytes, or None when it is unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def address_space_used() -> int:
    """This process's mapped address space now (VmSize), what RLIMIT_AS is checked against."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def libc_function(name: str) -> Callable[..., int] | None:
    """The C library's function ``name`` (None where this C library has none)."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):  # not Linux, or not glibc
        return None


def die_with_parent_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child SIGKILLed when its parent dies.

    Without it a killed server (or CLI) leaves its analysis running on, as an orphan that
    may hold gigabytes. The library lookup happens here, in the parent: between fork and exec
    the function only calls prctl and getppid.
    """
    prctl = libc_function("prctl")
    if prctl is None:
        return None
    parent = os.getpid()
    return lambda: _die_with(prctl, parent)


def die_with_parent(parent: int) -> None:
    """The same as :func:`die_with_parent_preexec`, from inside an already started process
    (a pool worker) whose parent had pid ``parent``."""
    prctl = libc_function("prctl")
    if prctl is not None:
        _die_with(prctl, parent)


def _die_with(prctl: Callable[..., int], parent: int) -> None:
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


class KeptOutput:
    """Reads a child's output as it comes, keeping only its first and last ``keep_bytes``.

    A child under an address-space limit may write without end (jemalloc's message in a
    loop wrote 1.8 GB in 100 s to a file); the pipe is drained, never stored whole.
    """

    def __init__(self, stream: IO[bytes], keep_bytes: int):
        self.keep_bytes = keep_bytes
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self._stream = stream
        self._thread = threading.Thread(target=self._read, name="kept-output", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: self._stream.read1(65536), b""):
                self.total += len(chunk)
                if len(self.head) < self.keep_bytes:
                    self.head += chunk[: self.keep_bytes - len(self.head)]
                self.tail += chunk
                del self.tail[: -self.keep_bytes]

    def text(self, wait_s: float = 2.0) -> str:
        # a grandchild still holding the pipe must not hold the caller too
        self._thread.join(wait_s)
        if self.total <= self.keep_bytes:
            kept = bytes(self.tail)
        else:
            kept = bytes(self.head) + b"\n...\n" + bytes(self.tail)
        return kept.decode("utf-8", "replace")
