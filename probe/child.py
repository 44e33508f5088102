"""One process of a profiled script: ``python -m probe.child RUN_DIR`` (made by probe.cli).

The run folder exists already (the launcher made it, with the script and its arguments in
``run.json``). This process installs the instruments, then runs the script as ``python
train.py ARGS`` would, through ``runpy.run_path(..., run_name="__main__")`` with
``sys.argv`` set to the script and its arguments and the script's folder first on
``sys.path``. Its end becomes ``status.rank<k>.json``, which the launcher turns into the
run's status:

- ran to the end, ``sys.exit(0)`` or the ``--steps`` limit: completed, exit 0;
- ``sys.exit(n)``: failed with "exit code n", exit n (a message: failed with it, exit 1);
- an exception: failed with the exception's last line, exit 1 (the traceback on stderr);
- SIGTERM or SIGINT: cancelled, exit 128 + the signal number.
"""

from __future__ import annotations

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
from probe.profiler import ProfilerWindow
from probe.session import Session, StepLimitReached


class Cancelled(BaseException):
    """SIGTERM, raised in the main thread so the script unwinds and the records stay."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_cancelled(signum: int, frame: Any) -> None:
    raise Cancelled(signum)


def _exception_line(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return " ".join(lines[-1].split()) if lines else type(exc).__name__


def _print_script_traceback(exc: BaseException) -> None:
    """The traceback as ``python train.py`` prints it: from the script's first frame, the
    wrapper's own (this module, runpy) left out."""
    tb = exc.__traceback__
    own = (__file__, "<frozen runpy>", runpy.__file__)
    while tb is not None and tb.tb_frame.f_code.co_filename in own:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__)


def _exit_outcome(exc: SystemExit) -> tuple[str, str | None, int]:
    code = exc.code
    if code is None or code == 0:
        return "completed", None, 0
    if isinstance(code, int):
        return "failed", f"exit code {code}", code
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


def run(run_dir: Path) -> int:
    manifest = RunFolder(run_dir).manifest()
    config = manifest.config
    script = Path(config["script"]).resolve()
    rank = int(os.environ.get("RANK", "0"))
    window = ProfilerWindow(**config.get("profiler", {}))
    session = Session(
        run_dir,
        rank=rank,
        max_steps=config.get("steps"),
        window=window,
        sample_hz=float(config.get("sample_hz", 10.0)),
    )
    if rank == 0:
        environment = {**manifest.environment, **_environment(rank)}
        session.update_manifest(environment=environment)
    hooks = Hooks(session, dict(config.get("dataloader") or {}), script.parent)
    sessions.activate(session)
    signal.signal(signal.SIGTERM, _raise_cancelled)
    status, reason, code = "completed", None, 0
    sys.argv = [str(script), *config.get("args", [])]
    sys.path[0] = str(script.parent)
    session.start()
    hooks.install()
    try:
        runpy.run_path(str(script), run_name="__main__")
    except StepLimitReached as stop:
        session.note(f"stopped after step {stop.args[0]}: the --steps limit")
    except SystemExit as exc:
        status, reason, code = _exit_outcome(exc)
    except Cancelled as exc:
        status, reason, code = "cancelled", f"{exc.args[0]} received", 128 + exc.signum
    except KeyboardInterrupt:
        status, reason, code = "cancelled", "interrupted (SIGINT)", 128 + signal.SIGINT
    except BaseException as exc:
        _print_script_traceback(exc)
        status, reason, code = "failed", _exception_line(exc), 1
    finally:
        # the records are being flushed: a second signal (Ctrl-C reaches the whole process
        # group, the wrapper forwards it too) must not cut that short; the wrapper kills
        # this process if it hangs
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        hooks.uninstall()
        session.close()
        sessions.activate(None)
    if session.steps_done == 0 and status == "completed":
        session.note(
            "the script ended without a step: no optimizer step, DataLoader batch or "
            "probe.step() was seen, so there are no step records"
        )
    _summarise(session, hooks)
    session.records.write_status(status, reason, session.steps_done, exit_code=code)
    sys.stdout.flush()
    sys.stderr.flush()
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
