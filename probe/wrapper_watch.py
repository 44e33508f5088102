"""A script process that outlives its wrapper stops, and says why.

``pipeline-doctor profile`` supervises the script's process: it forwards signals, writes
the heartbeat and, at the end, the run's status. Killed itself (SIGKILL, the OOM killer, a
closed terminal's process group gone wrong), it can do none of that, and the script trained
on unwatched: a process holding a GPU that no run folder said was running (measured before
this module: the script still training 5 s after its wrapper's SIGKILL, the run "running"
at step 0). So the script's process watches its wrapper: once a second it checks that the
wrapper (``PIPELINE_DOCTOR_WRAPPER_PID``, set by the launcher) is still among its
ancestors -- its parent, or under torchrun its parent's parent. Parent ids change the
moment a process dies, before anyone reaps it, so an unreaped wrapper still counts as gone.
When it is gone the watch sends this process SIGTERM, which unwinds the script as a cancel
does and keeps every record; the end is then the run's, written by rank 0
(:func:`orphan_outcome`), since no wrapper is left to write it.

A script that prints learns first: its next line meets the dead wrapper's pipe
(BrokenPipeError) and the script ends at once. A dying process closes its files before its
children are handed on, so for a moment the wrapper's id is still this process's parent
(measured: in 1 of 100 SIGKILLs, for 0.6 ms; a CI run's script ended in that moment, wrote no
end, and its run read "dead"). A pipe to the wrapper with no reader left is that moment:
:meth:`WrapperWatch.wrapper_gone` then waits for the handing on.

Until that end is written, rank 0 also keeps the run's heartbeat (:class:`OrphanHeartbeat`):
the wrapper's stopped with it, and a script that unwinds slowly (a checkpoint saved on the
way out, a profiler trace exported on a loaded host) would otherwise read "dead" on the
Runs page 15 s on while it is still writing its records (measured: a CI run on a loaded
host read "dead" before the script's end came). The keeping is bounded: a script that
catches the stop and trains on still reads dead once ``ORPHAN_HEARTBEAT_S`` has passed.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from diagnostics.runs import HEARTBEAT_INTERVAL_S, RunFolderError, RunWriter

WRAPPER_PID_ENV = "PIPELINE_DOCTOR_WRAPPER_PID"
CHECK_EVERY_S = 1.0
# the script's process, then torchrun's agent between it and the wrapper
_ANCESTORS_CHECKED = 2
# how long rank 0 keeps an orphaned run's heartbeat while its script unwinds: the wrapper
# itself gives a stopping script 20 s (probe.cli.STOP_GRACE_S); a loaded host, three times
ORPHAN_HEARTBEAT_S = 60.0
# how long the script's end waits, its pipe to the wrapper broken, for the wrapper's id to
# leave its ancestors: the moment measured is under a millisecond, a loaded host's longer
PIPE_SETTLE_S = 5.0
_STANDARD_STREAMS = (1, 2)


def _parent_of(pid: int) -> int | None:
    """The parent id from /proc (the 4th field of stat, after the parenthesised name,
    which may itself hold spaces and parentheses); None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _pipe_without_reader(fd: int) -> bool:
    """Whether ``fd`` is a pipe whose reading end every process has closed (poll's POLLERR
    on a pipe's writing end)."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


class WrapperWatch:
    """Polls for the wrapper among this process's ancestors; SIGTERM to itself when it is
    not. Inert when this process was not started by the wrapper (no environment variable)
    or on a system without /proc."""

    def __init__(
        self,
        environ: dict[str, str] | None = None,
        on_gone: Callable[[], None] | None = None,
    ):
        text = (os.environ if environ is None else environ).get(WRAPPER_PID_ENV, "")
        self.wrapper_pid = int(text) if text.isdigit() else None
        self.on_gone = on_gone
        self.gone = False
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def wrapper_alive(self) -> bool:
        if self.wrapper_pid is None:
            return True
        pid = os.getppid()
        for _ in range(_ANCESTORS_CHECKED):
            if pid == self.wrapper_pid:
                return True
            parent = _parent_of(pid)
            if parent is None:
                return False
            pid = parent
        return pid == self.wrapper_pid

    def wrapper_gone(self, settle_s: float = PIPE_SETTLE_S) -> bool:
        """At the script's end: whether the wrapper has gone. Where it still looks alive
        but nothing reads this process's stdout or stderr any more, it is dying (the wrapper
        reads both to their end): the answer waits up to ``settle_s`` for it to leave this
        process's ancestors, and says no where it stays (it will write the end itself)."""
        if self.wrapper_pid is None:
            return False
        if self.gone or not self.wrapper_alive():
            return True
        if not any(_pipe_without_reader(fd) for fd in _STANDARD_STREAMS):
            return False
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            time.sleep(0.01)
            if not self.wrapper_alive():
                return True
        return False

    def start(self) -> None:
        if self.wrapper_pid is None or not os.path.isdir("/proc/self"):
            return
        if not self.wrapper_alive():  # gone before the script even started
            self.gone = True
            return
        self._thread = threading.Thread(target=self._run, name="wrapper-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(CHECK_EVERY_S):
            if not self.wrapper_alive():
                self.gone = True
                if self.on_gone is not None:
                    with contextlib.suppress(Exception):  # the stop matters more
                        self.on_gone()
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def stop(self) -> None:
        self._stopped.set()


class OrphanHeartbeat:
    """Rank 0's hold on an orphaned run's status.json: reopened (still running, at the
    script's last step), its heartbeat refreshed as the wrapper's was, until :meth:`end`
    writes the run's end through the same writer or ``bound_s`` passes. Thread-safe: the
    watch's thread starts it, the main thread ends it."""

    def __init__(
        self,
        run_dir: Path,
        step: Callable[[], int],
        interval_s: float = HEARTBEAT_INTERVAL_S / 2,
        bound_s: float = ORPHAN_HEARTBEAT_S,
    ):
        self.run_dir, self._step = run_dir, step
        self.interval_s, self.bound_s = interval_s, bound_s
        self._lock = threading.Lock()
        self._writer: RunWriter | None = None
        self._ended = threading.Event()

    def start(self) -> None:
        with self._lock:
            if self._writer is not None or self._ended.is_set():
                return
            try:
                self._writer = RunWriter.reopen(self.run_dir)
            except (RunFolderError, OSError):  # the script's own end comes first
                return
            self._beat()
        threading.Thread(target=self._run, name="orphan-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        assert self._writer is not None
        self._writer.set_step(self._step())
        with contextlib.suppress(OSError):  # a full disk: the end is what must be written
            self._writer.heartbeat()

    def _run(self) -> None:
        stop_at = time.monotonic() + self.bound_s
        while not self._ended.wait(self.interval_s) and time.monotonic() < stop_at:
            with self._lock:
                if not self._ended.is_set():
                    self._beat()

    def end(self, status: str, reason: str | None, step: int) -> None:
        """The run's end, as the wrapper writes it (status.json, the parquet copies)."""
        with self._lock:
            self._ended.set()
            writer = self._writer or RunWriter.reopen(self.run_dir)
            writer.set_step(step)
            writer.finalise(status, reason)  # type: ignore[arg-type]


def orphan_outcome(wrapper_pid: int | None, status: str, reason: str | None, step: int) -> str:
    """The run's failure reason when its wrapper died under it."""
    ended = "was stopped" if status == "cancelled" else f"ended {status}"
    detail = f" ({reason})" if reason and status != "cancelled" else ""
    return (
        f"the pipeline-doctor wrapper (pid {wrapper_pid}) died (killed?): the script "
        f"{ended} after step {step}{detail}"
    )
