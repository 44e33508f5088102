"""One process of a profiled script: ``python -m probe.child RUN_DIR`` (made by probe.cli).

The run folder exists already (the launcher made it, with the script and its arguments in
``run.json``). This process installs the instruments, then runs the script as ``python
train.py ARGS`` would, through ``runpy.run_path(..., run_name="__main__")`` with
``sys.argv`` set to the script and its arguments and the script's folder first on
``sys.path``. Its end becomes ``status.rank<k>.json``, which the launcher turns into the
run's status:

- ran to the end, ``sys.exit(0)`` or the ``--steps`` limit: completed, exit 0;
- ``sys.exit(n)``: failed with "exit code n", exit n (a message: failed with it, exit 1);
- ``os._exit(n)`` in the script's own process: as ``sys.exit(n)``, the records written
  first (a forked copy's ``os._exit`` writes nothing);
- an exception: failed with the exception's last line, exit 1, its traceback on stderr
  from the script's first frame, or through the script's own ``sys.excepthook``;
- a ``KeyboardInterrupt`` the script raises itself (no SIGINT came): failed with a
  traceback, exit 130, as ``python train.py`` ends;
- SIGTERM or SIGINT: cancelled, exit 128 + the signal number;
- the ``--steps`` stop caught by the script (``except BaseException``) and training on:
  the next step's end ends the run there, completed, with a note;
- its wrapper gone (killed): stopped as by SIGTERM, failed with the wrapper named, and this
  process (rank 0) writes the run's end itself (probe/wrapper_watch.py).
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from diagnostics.runs import RunFolder
from probe import session as sessions
from probe.hooks import Hooks
from probe.integrations import Integrations
from probe.memory_snapshots import OutOfMemoryRecorded, SnapshotWindow
from probe.profiler import ProfilerWindow
from probe.session import Session, StepLimitReached
from probe.wrapper_watch import OrphanHeartbeat, WrapperWatch, orphan_outcome


class Cancelled(BaseException):
    """SIGTERM, raised in the main thread so the script unwinds and the records stay."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_cancelled(signum: int, frame: Any) -> None:
    raise Cancelled(signum)


class _Interrupts:
    """SIGINT as Python handles it (a KeyboardInterrupt), remembered: a KeyboardInterrupt
    with no SIGINT behind it is one the script raised itself, an error, not a cancel."""

    received = False

    @classmethod
    def handler(cls, signum: int, frame: Any) -> None:
        cls.received = True
        raise KeyboardInterrupt


def _exception_line(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return " ".join(lines[-1].split()) if lines else type(exc).__name__


def _print_script_traceback(exc: BaseException) -> None:
    """The traceback as ``python train.py`` prints it: from the script's first frame, the
    wrapper's own (this module, runpy) left out; none at all when the script never ran (a
    file Python cannot compile: only the error, as Python prints it). Through the script's
    own ``sys.excepthook`` when it set one. Nothing when stderr is gone (a killed wrapper's
    pipe): the run's end must still be written."""
    tb = exc.__traceback__
    own = (__file__, "<frozen runpy>", runpy.__file__)
    while tb is not None and tb.tb_frame.f_code.co_filename in own:
        tb = tb.tb_next
    hook = sys.excepthook
    if hook is not sys.__excepthook__:
        try:
            hook(type(exc), exc, tb)
            return
        except Exception:  # a broken hook: Python prints the error its own way then
            pass
    with contextlib.suppress(OSError, ValueError):
        if tb is None:
            traceback.print_exception(type(exc), exc, None)
        else:
            traceback.print_exception(type(exc), exc, tb)


def _exit_outcome(exc: SystemExit) -> tuple[str, str | None, int]:
    code = exc.code
    if isinstance(exc.__context__, KeyboardInterrupt):
        # the script caught Ctrl-C and exited (Lightning's Trainer does: sys.exit(1)): the
        # run was still interrupted, not failed; the script's exit code passes on
        return "cancelled", "interrupted (SIGINT)", code if isinstance(code, int) else 1
    if code is None or code == 0:
        return "completed", None, 0
    if isinstance(code, int):
        return "failed", f"exit code {code}", code
    with contextlib.suppress(OSError, ValueError):
        print(code, file=sys.stderr)  # what Python itself does with sys.exit("message")
    return "failed", " ".join(str(code).split()), 1


def _environment(rank: int) -> dict[str, Any]:
    return {
        "pytorch_version": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
        "rank": rank,
    }


_REAL_EXIT = os._exit


def _exit_forked_copy(code: int) -> None:
    """A copy of this process that the script forked has run the script to its end (a
    fork whose child returns, or calls sys.exit): it leaves as the script asked, and
    writes nothing, since the run's end is the script's own process's."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    _REAL_EXIT(code)


class _Ending:
    """The end of the script's process, however it comes: the instruments stopped, the
    notes and the summary written, then the status. From ``run`` when the script returns
    or raises, and from the script's own ``os._exit`` or an ignored ``--steps`` stop, which
    would otherwise leave no end at all."""

    def __init__(self, run_dir: Path, session: Session, hooks: Hooks, rank: int):
        self.run_dir, self.session, self.hooks, self.rank = run_dir, session, hooks, rank
        self.own_pid = os.getpid()
        self.integrations = Integrations(session.note)
        # rank 0 writes an orphaned run's end, so it keeps the run alive until then
        self.orphan_heartbeat = (
            OrphanHeartbeat(run_dir, lambda: session.steps_done) if rank == 0 else None
        )
        self.watch = WrapperWatch(on_gone=self._wrapper_gone)
        self.done = False

    def _wrapper_gone(self) -> None:
        if self.orphan_heartbeat is not None:
            self.orphan_heartbeat.start()

    def exit_now(self, code: int) -> None:
        """The script's ``os._exit(code)``: in its own process, its end is written first."""
        if os.getpid() == self.own_pid and not self.done:
            with contextlib.suppress(BaseException):
                if code == 0:
                    self.finish("completed", None, 0)
                else:
                    self.finish("failed", f"exit code {code} (os._exit)", code)
        _REAL_EXIT(code)

    def limit_ignored(self) -> None:
        """A step ended past ``--steps``: the script caught the stop and trained on."""
        self.session.note(
            f"the script caught the --steps stop (a BaseException) and trained on: the run "
            f"was ended after step {self.session.steps_done}, as the limit asks"
        )
        with contextlib.suppress(BaseException):
            self.finish("completed", None, 0)
        _REAL_EXIT(0)

    def finish(self, status: str, reason: str | None, code: int) -> int:
        if self.done:
            return code
        self.done = True
        session = self.session
        # the records are being flushed: a second signal (Ctrl-C reaches the whole process
        # group, the wrapper forwards it too) must not cut that short; the wrapper kills
        # this process if it hangs
        with contextlib.suppress(ValueError):  # not the main thread (an os._exit there)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        os._exit = _REAL_EXIT
        self.watch.stop()
        # a script that prints ends on the dead wrapper's pipe (BrokenPipeError) before the
        # watch's next look, even before the wrapper has left: asked again here, however the
        # script ended
        orphaned = self.watch.wrapper_gone()
        if orphaned:
            self._wrapper_gone()
        self.integrations.uninstall()
        self.hooks.uninstall()
        session.close()
        sessions.activate(None)
        self._notes(status)
        _summarise(session, self.hooks)
        if orphaned:
            reason = orphan_outcome(self.watch.wrapper_pid, status, reason, session.steps_done)
            status, code = "failed", code or 1
        session.records.write_status(status, reason, session.steps_done, exit_code=code)
        if orphaned and self.orphan_heartbeat is not None:
            self.orphan_heartbeat.end(status, reason, session.steps_done)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        return code

    def _notes(self, status: str) -> None:
        session = self.session
        for pid in session.forked_steppers():
            session.note(
                f"a process the script forked (pid {pid}) ran training steps: they are not "
                "recorded; the run's steps are the script's own process's"
            )
        if session.steps_done == 0 and status == "completed":
            session.note(
                "the script ended without a step: no optimizer step, backward(), DataLoader "
                "batch or probe.step() was seen on the training thread, so there are no step "
                "records"
            )
        if session.mode == "backward":
            session.note(
                "steps counted by backward(): the script built no torch.optim optimizer (it "
                "updates its weights itself), so each backward() on the training thread is "
                "one step, with its loss"
            )
        if session.steps_done == 0 and session.processes_started:
            started = sum(session.processes_started.values())
            targets = ", ".join(sorted(session.processes_started))
            session.note(
                f"the script started {started} process(es) of its own, running {targets}: "
                "the instruments watch the script's own process only, so none of their "
                "steps were seen; to profile processes that train, let torchrun start them "
                f"instead (pipeline-doctor profile --nproc-per-node {started} SCRIPT, with "
                "the script training in the process it runs in rather than starting its own)"
            )


def run(run_dir: Path) -> int:
    manifest = RunFolder(run_dir).manifest()
    config = manifest.config
    script = Path(config["script"]).resolve()
    rank = int(os.environ.get("RANK", "0"))
    window = ProfilerWindow(**config.get("profiler", {}))
    snapshot_window = SnapshotWindow(**config.get("memory_snapshots", {}))
    session = Session(
        run_dir,
        rank=rank,
        max_steps=config.get("steps"),
        window=window,
        sample_hz=float(config.get("sample_hz", 10.0)),
        snapshot_window=snapshot_window,
    )
    if rank == 0:
        environment = {**manifest.environment, **_environment(rank)}
        session.update_manifest(environment=environment)
    hooks = Hooks(session, dict(config.get("dataloader") or {}), script.parent)
    ending = _Ending(run_dir, session, hooks, rank)
    session.on_limit_ignored = ending.limit_ignored
    sessions.activate(session)
    signal.signal(signal.SIGTERM, _raise_cancelled)
    signal.signal(signal.SIGINT, _Interrupts.handler)
    status, reason, code = "completed", None, 0
    sys.argv = [str(script), *config.get("args", [])]
    sys.path[0] = str(script.parent)
    session.start()
    hooks.install()
    ending.integrations.install()  # patches a framework only as the script imports it
    ending.watch.start()
    os._exit = ending.exit_now
    try:
        if not ending.watch.gone:
            runpy.run_path(str(script), run_name="__main__")
    except StepLimitReached as stop:
        session.note(f"stopped after step {stop.args[0]}: the --steps limit")
    except SystemExit as exc:
        status, reason, code = _exit_outcome(exc)
    except Cancelled as exc:
        status, reason, code = "cancelled", f"{exc.args[0]} received", 128 + exc.signum
    except KeyboardInterrupt as exc:
        if _Interrupts.received:
            status, reason, code = "cancelled", "interrupted (SIGINT)", 128 + signal.SIGINT
        else:  # raised by the script: Python prints it and ends as by SIGINT
            _print_script_traceback(exc)
            status, reason, code = "failed", "KeyboardInterrupt", 128 + signal.SIGINT
    except torch.cuda.OutOfMemoryError as exc:
        status, reason, code = "failed", _exception_line(exc), 1
        _print_script_traceback(exc)
        # dumped here, while the failed frames still hold what filled the device
        recorded = session.snapshots.out_of_memory(session.steps_done + 1, exc)
        if isinstance(recorded, OutOfMemoryRecorded):
            reason = str(recorded)
    except BaseException as exc:
        status, reason, code = "failed", _exception_line(exc), 1
        _print_script_traceback(exc)
    finally:
        if os.getpid() != ending.own_pid:
            _exit_forked_copy(code)
        # here, not after: an error in the handling above still leaves the run's end
        if session.limit_reached and status == "completed":
            session.note(f"stopped after step {session.steps_done}: the --steps limit")
        code = ending.finish(status, reason, code)
    return code


def _summarise(session: Session, hooks: Hooks) -> None:
    """What the hooks saw, for run.json (rank 0): optimizers, AMP, loaders, step counting."""
    if session.manifest is not None:
        for record in hooks.loaders.totals(session.loader_waits):
            session.manifest.append_dataloader(record)
    session.update_manifest(
        probe={
            "steps_counted_by": session.mode,
            "steps": session.steps_done,
            "optimizers": list(session.optimizer_steps.values()),
            "dataloaders_built": hooks.loaders.count,
            # null when the script read no key-value store the probe knows (lmdb)
            "key_value_reads": session.key_values.summary(hooks.base),
            # processes the script started itself (not DataLoader workers), by function
            "processes_started": dict(session.processes_started),
        },
        amp={**session.amp, "skipped_steps": session.skipped_steps},
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(
            "usage: python -m probe.child RUN_DIR (started by pipeline-doctor profile)",
            file=sys.stderr,
        )
        return 2
    return run(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
