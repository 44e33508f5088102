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
"""

from __future__ import annotations

import os
import signal
import threading

WRAPPER_PID_ENV = "PIPELINE_DOCTOR_WRAPPER_PID"
CHECK_EVERY_S = 1.0
# the script's process, then torchrun's agent between it and the wrapper
_ANCESTORS_CHECKED = 2


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


class WrapperWatch:
    """Polls for the wrapper among this process's ancestors; SIGTERM to itself when it is
    not. Inert when this process was not started by the wrapper (no environment variable)
    or on a system without /proc."""

    def __init__(self, environ: dict[str, str] | None = None):
        text = (os.environ if environ is None else environ).get(WRAPPER_PID_ENV, "")
        self.wrapper_pid = int(text) if text.isdigit() else None
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
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def stop(self) -> None:
        self._stopped.set()


def orphan_outcome(wrapper_pid: int | None, status: str, reason: str | None, step: int) -> str:
    """The run's failure reason when its wrapper died under it."""
    ended = "was stopped" if status == "cancelled" else f"ended {status}"
    detail = f" ({reason})" if reason and status != "cancelled" else ""
    return (
        f"the pipeline-doctor wrapper (pid {wrapper_pid}) died (killed?): the script "
        f"{ended} after step {step}{detail}"
    )
