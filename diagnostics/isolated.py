"""Analysis of untrusted uploads in a child process with a memory limit and a timeout.

A small upload can inflate to gigabytes of valid events. Inside the Streamlit server an
allocation failure would end the server for every user: polars (Rust) aborts the whole
process with SIGABRT when an allocation fails, and a stall holds a server thread forever.
So each upload is analysed by ``python -m diagnostics.isolated REQUEST``, a child that
first sets its own address-space limit (``RLIMIT_AS``) and is killed at the time limit.
Whatever ends the child (a refusal, a MemoryError, an abort, a kill, the timeout), the
parent raises one :class:`~diagnostics.errors.InputError` line naming the limit, and
carries on. The child dies with its parent (no orphan analysis after a killed server), its
stderr is read through a bounded buffer, and at most ``PIPELINE_DOCTOR_MAX_ANALYSES``
children run at once per process (N uploads at once would otherwise use N memory limits).

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
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from diagnostics.errors import AnalysisBug, InputError
from diagnostics.limit_values import (
    ANALYSIS_MEMORY_MB,
    ANALYSIS_TIMEOUT_S,
    MAX_ANALYSES,
    MIB,
    limit_from_env,
)
from diagnostics.process_limits import KeptOutput, address_space_limit, die_with_parent_preexec
from diagnostics.progress import ProgressCallback, ProgressFile, read_progress
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
ENV_ANALYSIS_MEMORY_MB = ANALYSIS_MEMORY_MB.env
ENV_ANALYSIS_TIMEOUT_S = ANALYSIS_TIMEOUT_S.env
# Each child may use the whole memory limit: two at once keep a server's worst case at
# twice the limit, whatever the number of users uploading.
DEFAULT_MAX_ANALYSES = 2
ENV_MAX_ANALYSES = MAX_ANALYSES.env
# How long an analysis waits for a running one to end before it is told the server is busy:
# the small uploads most users make analyse in a few seconds.
DEFAULT_BUSY_WAIT_S = 10.0
# jemalloc (polars' allocator) otherwise starts a background purging thread; under an
# address-space limit creating it fails, and polars' jemalloc then looped on
# "<jemalloc>: background thread creation failed (11)" instead of aborting (3 of 8 runs of
# the 216k-event trace at 600 MiB with one polars thread stalled to the time limit,
# writing 350-500 MB of it to stderr in 40 s; 0 of 16 with this, each a clean abort in
# 1-2.5 s). Appended last, so it wins over a user's _RJEM_MALLOC_CONF (polars adds its own
# options in front).
_CHILD_JEMALLOC_CONF = "background_thread:false"
# What is kept of the child's stderr (its first and last bytes): enough for the marker of
# an allocation failure or the last line of a crash, never the whole of a looping writer.
_STDERR_KEEP_BYTES = 16 * 1024
# What Python's buffers say when written or read once closed
_CLOSED_BUFFER = "I/O operation on closed file."
# How often the parent reads the child's progress file while it waits
PROGRESS_POLL_S = 0.25
# Exit codes of the child besides 0 (result written) and signals.
_EXIT_INPUT, _EXIT_MEMORY, _EXIT_RECURSION, _EXIT_BUG = 2, 3, 4, 1
# What a child that ran out of address space may say on its way out (compared in lower
# case: strerror's "Cannot allocate memory" and glibc's own "cannot allocate memory for
# thread-local data: ABORT", a new thread's TLS that could not be mapped, seen once in a
# CI run of the 600 MiB test)
_MEMORY_MARKERS = (
    "memory allocation",
    "<jemalloc>",
    "cannot allocate memory",
    "memoryerror",
    "out of memory",
    # a Rust thread whose stack cannot be mapped: EAGAIN, as a PanicException (1 of 8 runs
    # of `report` on the 216k-event trace at 600 MiB)
    "os { code: 11,",
    "failed to spawn thread",
    # and a Python thread's: "RuntimeError: can't start new thread" (pthread_create's
    # EAGAIN; `report` on the 216k-event trace at 600 MiB, once under a loaded test run)
    "can't start new thread",
)


class AnalysisStopped(InputError):
    """The child analysing an input hit a resource limit, crashed or ran out of time."""


@dataclass(frozen=True)
class ChildLimits:
    """What one isolated analysis may use beyond the input budgets.

    ``max_analyses`` bounds the children this process runs at once (the app's users share
    it); a further one waits up to ``busy_wait_s``, then is refused as busy. ``raise_memory``
    says how to raise the memory limit in its error line (the app's variable, a CLI flag, the
    shell's ``ulimit -v``).
    """

    memory_bytes: int = DEFAULT_ANALYSIS_MEMORY_BYTES
    timeout_s: float = DEFAULT_ANALYSIS_TIMEOUT_S
    max_analyses: int = DEFAULT_MAX_ANALYSES
    busy_wait_s: float = DEFAULT_BUSY_WAIT_S
    raise_memory: str = field(
        default=f"raise {ENV_ANALYSIS_MEMORY_MB}, or upload fewer or smaller traces", compare=False
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ChildLimits:
        memory_mib = limit_from_env(
            ANALYSIS_MEMORY_MB, DEFAULT_ANALYSIS_MEMORY_BYTES / MIB, environ
        )
        return cls(
            memory_bytes=int(memory_mib * MIB),
            timeout_s=limit_from_env(ANALYSIS_TIMEOUT_S, DEFAULT_ANALYSIS_TIMEOUT_S, environ),
            max_analyses=int(limit_from_env(MAX_ANALYSES, DEFAULT_MAX_ANALYSES, environ)),
        )


def _memory_message(child: ChildLimits) -> str:
    return (
        f"the analysis needed more than {human_bytes(child.memory_bytes)} of memory, the limit "
        f"({child.raise_memory}); it was stopped and nothing else was affected"
    )


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
    progress: ProgressCallback | None = None,
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
    return _isolated(request, source, limits, child, progress)


def analyze_upload_isolated(
    paths: Sequence[str | os.PathLike[str]],
    *,
    display_names: Sequence[str],
    mode: Mode | None,
    store: str | os.PathLike[str],
    limits: Limits | None = None,
    child: ChildLimits | None = None,
    progress: ProgressCallback | None = None,
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
    return cast("UploadSet", _isolated(request, source, limits, child, progress))


def analyze_isolated(
    path: str | os.PathLike[str],
    *,
    limits: Limits | None = None,
    child: ChildLimits | None = None,
    thresholds: str | None = None,
    compare: str | os.PathLike[str] | None = None,
    progress: ProgressCallback | None = None,
) -> AnalysisResult:
    """``diagnostics.analyze.analyze`` (a file, a folder of ranks, a run folder) in a child
    process with bounded memory and time; errors as for :func:`analyze_files_isolated`.
    ``compare``: a second memory snapshot, ``path`` being the first (analyze_snapshots)."""
    # as given: the child starts in this process's folder, so messages name the same path
    request = {"path": str(path), "thresholds": str(thresholds) if thresholds else None}
    if compare is not None:
        request["compare"] = str(compare)
    return _isolated(request, str(path), limits, child, progress)


class _Slots:
    """The analyses this process runs at once (one child each), shared by all its threads."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.running = 0

    @contextlib.contextmanager
    def hold(self, source: str, child: ChildLimits) -> Iterator[None]:
        with self._changed:
            if not self._changed.wait_for(
                lambda: self.running < child.max_analyses, timeout=child.busy_wait_s
            ):
                raise AnalysisStopped(
                    source,
                    f"busy: {self.running} analyses are running; try again in a moment "
                    f"(at most {child.max_analyses} at once, {ENV_MAX_ANALYSES})",
                )
            self.running += 1
        try:
            yield
        finally:
            with self._changed:
                self.running -= 1
                self._changed.notify()


_slots = _Slots()


def _isolated(
    request: dict[str, object],
    source: str,
    limits: Limits | None,
    child: ChildLimits | None,
    progress: ProgressCallback | None = None,
) -> AnalysisResult:
    """Runs the child on ``request``; ``progress`` hears what the child reports, read from
    its progress file while this process waits."""
    try:
        limits = limits or Limits.from_env()
        child = child or ChildLimits.from_env()
    except ValueError as exc:
        raise InputError("server configuration", str(exc)) from None
    inherited = address_space_limit()
    if inherited is not None and inherited <= child.memory_bytes:
        # the child inherits this process's limit and may not raise it
        child = replace(
            child,
            memory_bytes=inherited,
            raise_memory="the address-space limit this command runs under: raise ulimit -v "
            "or prlimit --as",
        )
    with _slots.hold(source, child):
        work = Path(tempfile.mkdtemp(prefix="pipeline-doctor-analysis-"))
        try:
            request = {
                **request,
                "max_decompressed_bytes": limits.max_decompressed_bytes,
                "max_events": limits.max_events,
                "memory_bytes": child.memory_bytes,
                "result": str(work / "result.pickle"),
                "error": str(work / "error.json"),
                "progress": str(work / "progress.json") if progress is not None else None,
            }
            (work / "request.json").write_text(json.dumps(request), encoding="utf-8")
            code, stderr = _run_child(work, child.timeout_s, progress)
            if code == 0:
                with (work / "result.pickle").open("rb") as handle:
                    return pickle.load(handle)  # written by our own child, never by a user
            raise _stopped(code, work, source, child, stderr)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _stopped(
    code: int | None, work: Path, source: str, child: ChildLimits, stderr: str
) -> Exception:
    """The one-line error for a child that did not write a result."""
    error = _read_error(work / "error.json")
    # Rust's allocation failure aborts (SIGABRT) after "memory allocation of N bytes
    # failed"; the kernel's OOM killer sends SIGKILL; polars' allocator may instead fail to
    # map a thread's stack ("<jemalloc>: background thread creation failed (11)") and then
    # stall, so a timeout that says so is the memory limit too
    said = f"{stderr} {error.get('message', '')}".lower()
    out_of_memory = any(marker in said for marker in _MEMORY_MARKERS)
    if code is None:
        if out_of_memory:
            return AnalysisStopped(source, _memory_message(child))
        return AnalysisStopped(
            source,
            f"the analysis took longer than {child.timeout_s:g} s, the time limit "
            f"(raise {ENV_ANALYSIS_TIMEOUT_S}); it was stopped and nothing else was affected",
        )
    if code == _EXIT_INPUT and error.get("thresholds"):
        from diagnostics.thresholds import ThresholdsError

        return ThresholdsError(error["thresholds"])
    if code == _EXIT_INPUT and error.get("message"):
        return InputError(error.get("source", source), error.get("problem", error["message"]))
    if code in (_EXIT_MEMORY, -signal.SIGABRT, -signal.SIGKILL) or out_of_memory:
        return AnalysisStopped(source, _memory_message(child))
    if code == _EXIT_RECURSION:
        return AnalysisStopped(
            source, f"nested too deeply to analyse (the recursion limit, {error.get('limit')})"
        )
    if code < 0:
        return AnalysisStopped(
            source, f"the analysis crashed ({signal.Signals(-code).name}) and was stopped"
        )
    detail = error.get("message") or (stderr.strip().splitlines() or ["no message"])[-1]
    if code == _EXIT_BUG:
        return AnalysisBug(source, f"internal error in the analysis: {detail}")
    return AnalysisStopped(source, f"internal error in the analysis: {detail}")


def _child_env() -> dict[str, str]:
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env["_RJEM_MALLOC_CONF"] = ",".join(
        filter(None, [env.get("_RJEM_MALLOC_CONF"), _CHILD_JEMALLOC_CONF])
    )
    return env


def _run_child(
    work: Path, timeout_s: float, progress: ProgressCallback | None = None
) -> tuple[int | None, str]:
    """Runs the child on work/request.json: (its exit code, or None after the timeout; what
    it wrote to stderr, bounded). While it runs, what it reports in work/progress.json goes
    to ``progress``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "diagnostics.isolated", str(work / "request.json")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_child_env(),
        cwd=os.getcwd(),
        start_new_session=True,  # its own group: a kill reaches its pool workers too
        preexec_fn=die_with_parent_preexec(),  # no orphan when this process is killed
    )
    assert process.stderr is not None
    stderr = KeptOutput(process.stderr, _STDERR_KEEP_BYTES)
    code: int | None = None
    try:
        code = _wait(process, timeout_s, work / "progress.json", progress)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if code is None:  # the time limit, or this thread interrupted (Ctrl-C)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = stderr.text()
    process.stderr.close()
    return code, text


def _wait(
    process: subprocess.Popen[bytes],
    timeout_s: float,
    progress_file: Path,
    progress: ProgressCallback | None,
) -> int:
    """The child's exit code; raises TimeoutExpired after ``timeout_s``. With ``progress``,
    the child's progress file is read every PROGRESS_POLL_S and each change passed on."""
    if progress is None:
        return process.wait(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    seen = None
    while True:
        left = deadline - time.monotonic()
        try:
            code = process.wait(timeout=max(0.0, min(PROGRESS_POLL_S, left)))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
            code = None
        reported = read_progress(progress_file)
        if reported is not None and reported != seen:
            seen = reported
            progress(reported)
        if code is not None:
            return code


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
        one_file = request.get("paths") or [request.get("path")]
        if len(one_file) == 1 and one_file[0] and not request.get("compare"):
            from diagnostics.trace.decode_helper import start_spare

            # a large trace's decode helper starts now: its imports overlap this child's
            start_spare(one_file[0])
        from diagnostics.startup import import_analyser

        import_analyser()
        from diagnostics.analyze import analyze, analyze_files
        from diagnostics.thresholds import ThresholdsError

        budgets = {
            "max_decompressed_bytes": int(request["max_decompressed_bytes"]),
            "max_events": int(request["max_events"]),
        }
        progress = ProgressFile(request["progress"]) if request.get("progress") else None
        if "upload" in request:
            from diagnostics.upload_analysis import analyse_upload_files

            result = analyse_upload_files(
                request["paths"],
                display_names=request["display_names"],
                mode=request["upload"]["mode"],
                store=request["upload"]["store"],
                limits=Limits(**budgets),
                progress=progress,
            )
        elif "paths" in request:
            result = analyze_files(
                request["paths"],
                display_names=request["display_names"],
                progress=progress,
                **budgets,
            )
        elif request.get("compare"):
            from diagnostics.analyze import analyze_snapshots

            result = analyze_snapshots(
                [request["path"], request["compare"]],
                max_bytes=budgets["max_decompressed_bytes"],
                thresholds=request.get("thresholds"),
            )
        else:
            result = analyze(
                request["path"], thresholds=request.get("thresholds"), progress=progress, **budgets
            )
        _write_result(result, Path(request["result"]))
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


def _write_result(result: object, out: Path) -> None:
    """Pickles ``result`` to ``out``; raises MemoryError where the memory limit stopped it.

    polars pickles a frame by serializing it into a buffer of its own; when a write to that
    buffer fails for want of memory, polars raises an OSError with no errno, or, its buffer
    closed by then, "ValueError: I/O operation on closed file", the MemoryError lost (the
    216k-event trace at 650 MiB with one polars thread: 6 of 30 runs, each read as an
    "internal error in the analysis"). The file's own failures (a full disk) carry an errno.
    """
    tmp = out.with_suffix(".tmp")
    with tmp.open("wb") as handle:
        try:
            pickle.dump(result, handle, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError as exc:
            if exc.errno is not None:
                raise
            raise MemoryError from exc
        except ValueError as exc:
            if handle.closed or str(exc) != _CLOSED_BUFFER:
                raise
            raise MemoryError from exc
    os.replace(tmp, out)


if __name__ == "__main__":
    os._exit(child_main(sys.argv[1]))  # skips polars' teardown; the result is on disk
