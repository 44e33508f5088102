"""A process that loads traces keeps the C-heap memory it frees, for the next chunk.

A load makes and drops buffers of a few MB for every chunk: the inflated blocks (made on the
inflate thread, dropped on the loading one), the chunk's text, the decode helper's columns
on their way back. With glibc's thresholds where they start (buffers from 128 KiB mapped
anew, raised only as mapped ones are freed, and the free top of the heap given back past
twice that), the kernel faulted in and zeroed the same memory again and again: 310,000 of
the 1 GB trace's 880,000 page faults. :func:`keep_freed_memory` sets the thresholds where
glibc's own adjustment tops out (buffers up to 32 MiB from the heap, up to 64 MiB of free
heap kept), so the same pages serve every chunk; :func:`give_freed_memory_back` returns
what is free once a load is done (``malloc_trim``). polars allocates with its own allocator,
which this does not touch. Where the C library is not glibc, nothing changes.
"""

from __future__ import annotations

from diagnostics.process_limits import libc_function

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's ceiling for its own adjustment (64-bit)
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES  # as glibc keeps it when it adjusts

_mallopt = libc_function("mallopt")
_malloc_trim = libc_function("malloc_trim")


def keep_freed_memory() -> bool:
    """glibc keeps freed buffers for reuse (the thresholds above); False where it cannot."""
    if _mallopt is None:
        return False
    return bool(
        _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and _mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


def give_freed_memory_back() -> None:
    """The heap's free memory back to the system (the thresholds stay)."""
    if _malloc_trim is not None:
        _malloc_trim(0)
