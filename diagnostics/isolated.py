"""Analysis of untrusted uploads in a child process with a memory limit and a timeout.

A small upload can inflate to gigabytes of valid events. Inside the Streamlit server an
allocation failure would end the server for every user: polars (Rust) aborts the whole
process with SIGABRT when an allocation fails, and a stall holds a server thread forever.
So each upload is analysed by ``python -m diagnostics.isolated REQUEST``, a child that
first sets its own address-space limit (``RLIMIT_AS``) and is killed at the time limit.
Whatever ends the child (a refusal, a MemoryError, an abort, a kill, the timeout), the
parent raises one :class:`~diagnostics.errors.InputError` line naming the limit, and
carries on.

For an upload (:func:`analyze_upload_isolated`) the child also identifies each file and
builds its drill-down, writing each event table to the upload's step folder, so the server
never loads a trace. The child hands its AnalysisResult (or UploadSet) back as a pickle in a private temporary folder: the
child is our own code, the data it read is already reduced to the result, and the result's
size is bounded by the input budgets (diagnostics.trace.budget).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from diagnostics.errors import InputError
from diagnostics.trace.budget import Limits, human_bytes

if TYPE_CHECKING:
    from diagnostics.result import AnalysisResult
    from diagnostics.upload_analysis import Mode, UploadSet

# Address space, not resident memory: polars' thread pool reserves ~1 GB of address space
# it never touches (216k events: 1.4 GB VmPeak for 238 MB RSS). 8 GiB holds the largest
# input the default event budget lets through (~2.5 GB resident) with room to spare.
DEFAULT_ANALYSIS_MEMORY_BYTES = 8 * 1024**3
# The largest real trace here (216k events) takes ~4 s; the event budget's worst case
# about a minute on one core. Five minutes is a stall, not work.
DEFAULT_ANALYSIS_TIMEOUT_S = 300.0
ENV_ANALYSIS_MEMORY_MB = "PIPELINE_DOCTOR_ANALYSIS_MEMORY_MB"
ENV_ANALYSIS_TIMEOUT_S = "PIPELINE_DOCTOR_ANALYSIS_TIMEOUT_S"
# Exit codes of the child besides 0 (result written) and signals.
_EXIT_INPUT, _EXIT_MEMORY, _EXIT_RECURSION, _EXIT_BUG = 2, 3, 4, 1
_STDERR_TAIL_BYTES = 2000
# What a child that ran out of address space may say on its way out.
_MEMORY_MARKERS = (
    "memory allocation",
    "<jemalloc>",
    "Cannot allocate memory",
    "MemoryError",
    "out of memory",
)


class AnalysisStopped(InputError):
    """The child analysing an input hit a resource limit, crashed or ran out of time."""


@dataclass(frozen=True)
class ChildLimits:
    """What one isolated analysis may use beyond the input budgets."""

    memory_bytes: int = DEFAULT_ANALYSIS_MEMORY_BYTES
    timeout_s: float = DEFAULT_ANALYSIS_TIMEOUT_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ChildLimits:
        environ = os.environ if environ is None else environ
        values = {}
        for name, default in (
            (ENV_ANALYSIS_MEMORY_MB, DEFAULT_ANALYSIS_MEMORY_BYTES / 2**20),
            (ENV_ANALYSIS_TIMEOUT_S, DEFAULT_ANALYSIS_TIMEOUT_S),
        ):
            raw = environ.get(name, "").strip()
            try:
                value = float(raw) if raw else default
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number") from None
            if not value > 0:
                raise ValueError(f"{name}={raw!r} must be positive")
            values[name] = value
        return cls(
            memory_bytes=int(values[ENV_ANALYSIS_MEMORY_MB] * 2**20),
            timeout_s=values[ENV_ANALYSIS_TIMEOUT_S],
        )


def _memory_message(memory_bytes: int) -> str:
    return (
        f"the analysis needed more than {human_bytes(memory_bytes)} of memory, the limit "
        f"(raise {ENV_ANALYSIS_MEMORY_MB}, or upload fewer or smaller traces); "
        "it was stopped and nothing else was affected"
    )


def _read_tail(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - _STDERR_TAIL_BYTES))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _read_error(path: Path) -> dict[str, str]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def analyze_files_isolated(
    paths: Sequence[str | os.PathLike[str]],
    *,
    display_names: Sequence[str] | None = None,
    limits: Limits | None = None,
    child: ChildLimits | None = None,
) -> AnalysisResult:
    """``diagnostics.analyze.analyze_files`` in a child process with bounded memory and time.

    ``limits`` and ``child`` default to the environment (PIPELINE_DOCTOR_MAX_DECOMPRESSED_MB,
    PIPELINE_DOCTOR_MAX_EVENTS, PIPELINE_DOCTOR_ANALYSIS_MEMORY_MB,
    PIPELINE_DOCTOR_ANALYSIS_TIMEOUT_S). Raises InputError (bad input, over a budget) or
    AnalysisStopped (memory, time, crash): one line either way.
    """
    names = [str(n) for n in (display_names or [str(p) for p in paths])]
    source = names[0] if len(names) == 1 else ", ".join(names)
    request = {
        "paths": [str(Path(p).resolve()) for p in paths],
        "display_names": names,
    }
    return _isolated(request, source, limits, child)


def analyze_upload_isolated(
    paths: Sequence[str | os.PathLike[str]],
    *,
    display_names: Sequence[str],
    mode: Mode | None,
    store: str | os.PathLike[str],
    limits: Limits | None = None,
    child: ChildLimits | None = None,
) -> UploadSet:
    """``diagnostics.upload_analysis.analyse_upload_files`` in the bounded child: every
    trace of an upload is loaded there, never in the server, which gets back the identities,
    the analysis and drill-down tables whose event tables are in ``store``. Errors as for
    :func:`analyze_files_isolated`."""
    names = [str(n) for n in display_names]
    request = {
        "paths": [str(Path(p).resolve()) for p in paths],
        "display_names": names,
        "upload": {"mode": mode, "store": str(Path(store).resolve())},
    }
    source = names[0] if len(names) == 1 else ", ".join(names)
    return cast("UploadSet", _isolated(request, source, limits, child))


def analyze_isolated(
    path: str | os.PathLike[str],
    *,
    limits: Limits | None = None,
    child: ChildLimits | None = None,
    thresholds: str | None = None,
) -> AnalysisResult:
    """``diagnostics.analyze.analyze`` (a file, a folder of ranks, a run folder) in a child
    process with bounded memory and time; errors as for :func:`analyze_files_isolated`."""
    # as given: the child starts in this process's folder, so messages name the same path
    request = {"path": str(path), "thresholds": str(thresholds) if thresholds else None}
    return _isolated(request, str(path), limits, child)


def _isolated(
    request: dict[str, object],
    source: str,
    limits: Limits | None,
    child: ChildLimits | None,
) -> AnalysisResult:
    try:
        limits = limits or Limits.from_env()
        child = child or ChildLimits.from_env()
    except ValueError as exc:
        raise InputError("server configuration", str(exc)) from None
    work = Path(tempfile.mkdtemp(prefix="pipeline-doctor-analysis-"))
    try:
        request = {
            **request,
            "max_decompressed_bytes": limits.max_decompressed_bytes,
            "max_events": limits.max_events,
            "memory_bytes": child.memory_bytes,
            "result": str(work / "result.pickle"),
            "error": str(work / "error.json"),
        }
        (work / "request.json").write_text(json.dumps(request), encoding="utf-8")
        code = _run_child(work, child.timeout_s)
        if code == 0:
            with (work / "result.pickle").open("rb") as handle:
                return pickle.load(handle)  # written by our own child, never by a user
        raise _stopped(code, work, source, child)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _stopped(code: int | None, work: Path, source: str, child: ChildLimits) -> Exception:
    """The one-line error for a child that did not write a result."""
    if code is None:
        return AnalysisStopped(
            source,
            f"the analysis took longer than {child.timeout_s:g} s, the time limit "
            f"(raise {ENV_ANALYSIS_TIMEOUT_S}); it was stopped and nothing else was affected",
        )
    error = _read_error(work / "error.json")
    stderr = _read_tail(work / "stderr.txt")
    if code == _EXIT_INPUT and error.get("thresholds"):
        from diagnostics.thresholds import ThresholdsError

        return ThresholdsError(error["thresholds"])
    if code == _EXIT_INPUT and error.get("message"):
        return InputError(error.get("source", source), error.get("problem", error["message"]))
    # Rust's allocation failure aborts (SIGABRT) after "memory allocation of N bytes
    # failed"; the kernel's OOM killer sends SIGKILL; polars' allocator may instead fail to
    # map a thread's stack ("<jemalloc>: background thread creation failed (11)")
    said = f"{stderr} {error.get('message', '')}"
    if code in (_EXIT_MEMORY, -signal.SIGABRT, -signal.SIGKILL) or any(
        marker in said for marker in _MEMORY_MARKERS
    ):
        return AnalysisStopped(source, _memory_message(child.memory_bytes))
    if code == _EXIT_RECURSION:
        return AnalysisStopped(
            source, f"nested too deeply to analyse (the recursion limit, {error.get('limit')})"
        )
    if code < 0:
        return AnalysisStopped(
            source, f"the analysis crashed ({signal.Signals(-code).name}) and was stopped"
        )
    detail = error.get("message") or (stderr.strip().splitlines() or ["no message"])[-1]
    return AnalysisStopped(source, f"internal error in the analysis: {detail}")


def _run_child(work: Path, timeout_s: float) -> int | None:
    """Runs the child on work/request.json; its exit code, or None after the timeout."""
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    with (work / "stderr.txt").open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "diagnostics.isolated", str(work / "request.json")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            cwd=os.getcwd(),
            start_new_session=True,  # its own group: a kill reaches polars' threads too
        )
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return None


# -- the child ---------------------------------------------------------------------------


def _write_error(path: str, doc: dict[str, object]) -> None:
    with contextlib.suppress(OSError):  # the exit code still says what happened
        Path(path).write_text(json.dumps(doc), encoding="utf-8")


def child_main(request_path: str) -> int:
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    import resource

    memory = int(request["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    error_path = request["error"]
    try:
        from diagnostics.analyze import analyze, analyze_files
        from diagnostics.thresholds import ThresholdsError

        budgets = {
            "max_decompressed_bytes": int(request["max_decompressed_bytes"]),
            "max_events": int(request["max_events"]),
        }
        if "upload" in request:
            from diagnostics.upload_analysis import analyse_upload_files

            result = analyse_upload_files(
                request["paths"],
                display_names=request["display_names"],
                mode=request["upload"]["mode"],
                store=request["upload"]["store"],
                limits=Limits(**budgets),
            )
        elif "paths" in request:
            result = analyze_files(
                request["paths"], display_names=request["display_names"], **budgets
            )
        else:
            result = analyze(request["path"], thresholds=request.get("thresholds"), **budgets)
        out = Path(request["result"])
        tmp = out.with_suffix(".tmp")
        with tmp.open("wb") as handle:
            pickle.dump(result, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, out)
        return 0
    except InputError as exc:
        _write_error(
            error_path, {"message": str(exc), "source": exc.source, "problem": exc.problem}
        )
        return _EXIT_INPUT
    except ThresholdsError as exc:
        _write_error(error_path, {"thresholds": str(exc)})
        return _EXIT_INPUT
    except MemoryError:
        return _EXIT_MEMORY
    except RecursionError:
        _write_error(error_path, {"limit": sys.getrecursionlimit()})
        return _EXIT_RECURSION
    except Exception as exc:  # a bug: one line back to the parent
        _write_error(error_path, {"message": f"{type(exc).__name__}: {' '.join(str(exc).split())}"})
        return _EXIT_BUG


if __name__ == "__main__":
    os._exit(child_main(sys.argv[1]))  # skips polars' teardown; the result is on disk
