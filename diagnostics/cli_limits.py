"""The CLI options that bound an analysis, shared by ``analyze``, ``report`` and ``gate``,
and their argument parser, whose errors are one line (``UsageError``), not usage + message.

``--max-decompressed-mb`` and ``--max-events`` default to the environment
(PIPELINE_DOCTOR_MAX_DECOMPRESSED_MB / PIPELINE_DOCTOR_MAX_EVENTS, as the app reads
them), else to limits sized to this machine's memory (Limits.for_command_line: the
user's own file on the user's own machine, where the app keeps its fixed budget). ``--max-memory-mb`` and
``--timeout-s`` (or an address-space limit the command already runs under) move the
analysis into the app's bounded child (diagnostics.isolated). Imports nothing heavy, so
usage errors stay instant.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diagnostics.isolated import ChildLimits
    from diagnostics.result import AnalysisResult


class UsageError(Exception):
    """A command line argparse refused: its message, for one line on stderr and exit 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


class LimitOptionError(Exception):
    """A limit option (or its environment variable) outside its bounds
    (diagnostics.limit_values)."""


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """--max-decompressed-mb and --max-events; defaults from the environment, else sized to
    this machine's memory."""
    from diagnostics.limit_values import MAX_DECOMPRESSED_MB, MAX_EVENTS, flag_type
    from diagnostics.trace.budget import ENV_MAX_DECOMPRESSED_MB, ENV_MAX_EVENTS, Limits

    try:
        defaults = Limits.for_command_line()
    except ValueError as exc:
        raise LimitOptionError(str(exc)) from None
    parser.add_argument(
        "--max-decompressed-mb",
        type=flag_type(MAX_DECOMPRESSED_MB),
        default=defaults.max_decompressed_bytes / 2**20,
        help="refuse an input whose JSON (all files together) is larger than this, MiB "
        f"(default %(default).0f, or ${ENV_MAX_DECOMPRESSED_MB})",
    )
    parser.add_argument(
        "--max-events",
        type=flag_type(MAX_EVENTS),
        default=defaults.max_events,
        help="refuse an input with more events than this, all files together "
        f"(default %(default)d, or ${ENV_MAX_EVENTS})",
    )


def limits_from(args: argparse.Namespace) -> dict[str, int]:
    """The analyze() keyword arguments for the parsed limit options (each already within
    its bounds: the flags' argparse types and Limits.from_env refuse anything else)."""
    return {
        "max_decompressed_bytes": max(1, int(args.max_decompressed_mb * 2**20)),
        "max_events": int(args.max_events),
    }


def resource_error(path: str, exc: BaseException) -> str:
    """One line for a MemoryError or RecursionError, naming the limit that was hit."""
    if isinstance(exc, RecursionError):
        return (
            f"error: {path}: nested too deeply to analyse (Python's recursion limit, "
            f"{sys.getrecursionlimit()})"
        )
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    limit = (
        f"the process's address-space limit, {soft / 2**30:.1f} GiB"
        if soft != resource.RLIM_INFINITY
        else "the machine's memory"
    )
    return (
        f"error: {path}: not enough memory to analyse it ({limit}); "
        "lower --max-events or analyse fewer files at once"
    )


def add_isolation_options(parser: argparse.ArgumentParser) -> None:
    """--max-memory-mb and --timeout-s: analyse in a child process bounded as the app's."""
    from diagnostics.limit_values import ANALYSIS_MEMORY_MB, ANALYSIS_TIMEOUT_S, flag_type

    parser.add_argument(
        "--max-memory-mb",
        type=flag_type(ANALYSIS_MEMORY_MB),
        help="analyse in a child process with this address-space limit, MiB (as the app does "
        "for uploads); a failed allocation is then one line, exit 2. Under an address-space "
        "limit already (ulimit -v, prlimit --as) the child always runs, with that limit",
    )
    parser.add_argument(
        "--timeout-s",
        type=flag_type(ANALYSIS_TIMEOUT_S),
        help="analyse in a child process stopped after this many seconds (exit 2); default "
        "in a child: $PIPELINE_DOCTOR_ANALYSIS_TIMEOUT_S, else 300",
    )


def isolation_from(args: argparse.Namespace) -> ChildLimits | None:
    """The ChildLimits for the parsed options, or None to analyse in this process.

    A child runs when a flag asks for one, and whenever this process already runs under an
    address-space limit: there polars would abort the whole process (SIGABRT, no message) on
    a failed allocation, where the child's abort is one line naming the limit. The child
    gets that same limit (RLIMIT_AS counts per process, and a child may not raise it).
    """
    from diagnostics.process_limits import address_space_limit

    inherited = address_space_limit()
    if args.max_memory_mb is None and args.timeout_s is None and inherited is None:
        return None
    from diagnostics.isolated import ChildLimits

    try:
        defaults = ChildLimits.from_env()
    except ValueError as exc:
        raise LimitOptionError(str(exc)) from None
    if args.max_memory_mb:
        memory = int(args.max_memory_mb * 2**20)
    else:
        memory = inherited if inherited is not None else defaults.memory_bytes
    # diagnostics.isolated caps the child at a limit this process runs under, and then
    # names that limit in the error line instead of the flag
    return ChildLimits(
        memory_bytes=memory,
        timeout_s=args.timeout_s or defaults.timeout_s,
        raise_memory="raise --max-memory-mb, or lower --max-events",
    )


def analyse(
    path: str,
    limits: dict[str, int],
    child: ChildLimits | None,
    thresholds: str | None = None,
    compare: str | None = None,
) -> AnalysisResult:
    """``diagnostics.analyze.analyze`` in this process (``child`` None) or in the bounded
    child. In the child's case this process never imports the analyser's frames before the
    result is in, so it stays small whatever the input. ``compare``: a second memory
    snapshot (``path`` the first), analysed as a pair (growth by site). A long analysis's
    progress goes to stderr (diagnostics.progress.StderrProgress)."""
    if compare is not None:
        from diagnostics.errors import InputError
        from diagnostics.snapshot.reader import is_snapshot_file

        for given in (path, compare):
            if not is_snapshot_file(given):
                raise InputError(
                    given,
                    "analyze --compare takes two CUDA memory snapshots (.pickle, .pickle.gz); "
                    "for traces and runs use report --compare",
                )
    from diagnostics.progress import StderrProgress

    progress = StderrProgress()  # a many-rank folder takes a while: say how far it has got
    try:
        if child is None:
            from diagnostics.analyze import analyze, analyze_snapshots

            if compare is not None:
                return analyze_snapshots(
                    [path, compare],
                    max_bytes=limits["max_decompressed_bytes"],
                    thresholds=thresholds,
                )
            return analyze(path, **limits, thresholds=thresholds, progress=progress)
        from diagnostics.isolated import analyze_isolated
        from diagnostics.trace.budget import Limits

        return analyze_isolated(
            path,
            limits=Limits(**limits),
            child=child,
            thresholds=thresholds,
            compare=compare,
            progress=progress,
        )
    finally:
        progress.close()
