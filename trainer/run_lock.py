"""One writer per run folder: an ``O_EXCL`` lock file holding the writer's pid and host.

``run`` takes the lock right after creating the folder, ``resume`` before it touches the
status, and both release it when the trainer exits. A lock left by a process that died
(SIGKILL, OOM) is recovered the way a stale ``status.json`` is read: on this host the
process table settles it at once; on another host the run's heartbeat does (a "running"
status that stopped beating, or a final one, means the writer is gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

from diagnostics.runs import LOCK_FILE, RunFolder, RunFolderError

# a lock file created but not yet written (its writer died between the two) is stale
# once it is this old; writing ~60 bytes takes microseconds
EMPTY_LOCK_STALE_AFTER_S = 10.0


class RunLocked(Exception):
    """Another live process writes this run folder (one line: who)."""


def holder_alive(pid: int | None, host: str | None) -> bool:
    """Whether a process recorded as (pid, host) may still exist.

    On this host the process table says (a zombie counts as gone); on another host it
    cannot be checked here, so it is presumed alive and the caller trusts the heartbeat.
    """
    import psutil

    if pid is None or host != socket.gethostname():
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _read_holder(path: Path) -> dict[str, object] | None:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return raw if isinstance(raw, dict) else None


def _is_stale(run_dir: Path, lock: Path, holder: dict[str, object] | None) -> bool:
    if holder is None:
        try:
            return time.time() - lock.stat().st_mtime > EMPTY_LOCK_STALE_AFTER_S
        except FileNotFoundError:
            return True
    pid, host = holder.get("pid"), holder.get("host")
    pid = pid if isinstance(pid, int) else None
    host = host if isinstance(host, str) else None
    if host == socket.gethostname():
        return not holder_alive(pid, host)
    try:
        status = RunFolder(run_dir).status()
    except RunFolderError:
        return False  # nothing to tell by: keep refusing rather than risk two writers
    return status.status == "dead" or status.is_final


class RunLock:
    """Held while a trainer writes ``run_dir``; :meth:`release` (or exit) frees it."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """The lock, or RunLocked naming the live holder. Recovers a stale lock once."""
        path = run_dir / LOCK_FILE
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _read_holder(path)
                if not _is_stale(run_dir, path, holder):
                    who = (
                        f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "a writer"
                    )
                    raise RunLocked(f"{run_dir} is locked by a running trainer ({who})") from None
                _remove_if_unchanged(path, holder)
                continue
            try:
                payload = {"pid": os.getpid(), "host": socket.gethostname(), "at": time.time()}
                os.write(fd, json.dumps(payload).encode())
            except OSError:
                os.close(fd)
                path.unlink(missing_ok=True)
                raise
            os.close(fd)
            return cls(path)
        raise RunLocked(
            f"{run_dir} is locked: another process took it while a stale lock was cleared"
        )

    def release(self) -> None:
        holder = _read_holder(self.path)
        if holder is not None and holder.get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)


def _remove_if_unchanged(path: Path, holder: dict[str, object] | None) -> None:
    """Removes a stale lock, unless another recoverer already replaced it with its own.

    The lock is first renamed to a name only this process uses, so two processes clearing
    the same stale lock cannot delete each other's fresh one: the loser renames the fresh
    lock, sees a holder other than the stale one, and puts it back with a link (which
    fails rather than overwrite a third lock).
    """
    aside = path.with_name(f".{path.name}.{os.getpid()}.stale")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if _read_holder(aside) != holder:
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
    aside.unlink(missing_ok=True)
