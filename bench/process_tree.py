"""One fresh process measured as a whole: wall time, the CPU and peak RSS of its process tree,
its stdout, and a stop past a time or memory cap. Shared by the trace benchmarks."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def _own_high_water(pid: int) -> int:
    with (
        contextlib.suppress(OSError, ValueError),
        open(f"/proc/{pid}/status", encoding="ascii") as handle,
    ):
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _tree_rss(root: psutil.Process) -> int:
    total = 0
    with contextlib.suppress(psutil.Error):
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
    return total


def measure(argv: list[str], timeout_s: float, max_rss_bytes: int | None = None) -> dict:
    """Wall time, CPU and peak RSS of one fresh process and its children, with its stdout;
    stopped past ``timeout_s`` or (when given) ``max_rss_bytes``.

    Peak RSS: the process's own VmHWM, read every 10 ms, and the sum over it and its children
    (workers, helpers) sampled every 100 ms. CPU: the tree's user + system time (children
    reap their workers)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(os.devnull, "rb") as stdin:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    root = psutil.Process(proc.pid)
    peak, stopped, polls = 0, None, 0

    chunks: dict[str, bytes] = {}

    def drain(name: str, stream) -> None:  # noqa: ANN001 - a pipe
        chunks[name] = stream.read()

    readers = [
        threading.Thread(target=drain, args=(name, stream), daemon=True)
        for name, stream in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for reader in readers:
        reader.start()
    while proc.poll() is None:
        peak = max(peak, _own_high_water(proc.pid))
        if polls % 10 == 0:  # the tree's sum every 100 ms: a walk of /proc
            peak = max(peak, _tree_rss(root))
        polls += 1
        if max_rss_bytes is not None and peak > max_rss_bytes:
            stopped = f"stopped at {peak / 2**30:.1f} GiB (over the memory cap)"
        elif time.perf_counter() - start > timeout_s:
            stopped = f"stopped after {timeout_s:g} s (over the time limit)"
        if stopped:
            with contextlib.suppress(psutil.Error):
                for child in root.children(recursive=True):
                    child.kill()
            proc.kill()
            break
        time.sleep(0.01)
    proc.wait()
    seconds = time.perf_counter() - start
    for reader in readers:
        reader.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    err = chunks.get("err", b"").decode(errors="replace").strip()
    error = stopped or (
        None if proc.returncode == 0 else f"exit {proc.returncode}: {err.splitlines()[-1:]}"
    )
    return {
        "seconds": None if error else seconds,
        "cpu_s": None if error else cpu_s,
        "rss_mb": peak / 2**20 if peak else None,
        "error": error,
        "stdout": chunks.get("out", b"").decode(errors="replace"),
    }
