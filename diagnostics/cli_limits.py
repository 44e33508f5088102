"""The CLI options that bound an analysis, shared by ``analyze`` and ``report``.

``--max-decompressed-mb`` and ``--max-events`` default to the environment
(PIPELINE_DOCTOR_MAX_DECOMPRESSED_MB / PIPELINE_DOCTOR_MAX_EVENTS, as the app reads
them), else to the built-in limits of diagnostics.trace.budget. Imports nothing heavy, so
usage errors stay instant.
"""

from __future__ import annotations

import argparse
import sys


class LimitOptionError(Exception):
    """A limit option (or its environment variable) that is not a positive number."""


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """--max-decompressed-mb and --max-events; defaults from the environment, else built in."""
    from diagnostics.trace.budget import ENV_MAX_DECOMPRESSED_MB, ENV_MAX_EVENTS, Limits

    try:
        defaults = Limits.from_env()
    except ValueError as exc:
        raise LimitOptionError(str(exc)) from None
    parser.add_argument(
        "--max-decompressed-mb",
        type=float,
        default=defaults.max_decompressed_bytes / 2**20,
        help="refuse an input whose JSON (all files together) is larger than this, MiB "
        f"(default %(default).0f, or ${ENV_MAX_DECOMPRESSED_MB})",
    )
    parser.add_argument(
        "--max-events",
        type=int,
        default=defaults.max_events,
        help="refuse an input with more events than this, all files together "
        f"(default %(default)d, or ${ENV_MAX_EVENTS})",
    )


def limits_from(args: argparse.Namespace) -> dict[str, int]:
    """The analyze() keyword arguments for the parsed limit options."""
    if args.max_decompressed_mb <= 0:
        raise LimitOptionError("--max-decompressed-mb must be positive")
    if args.max_events <= 0:
        raise LimitOptionError("--max-events must be positive")
    return {
        "max_decompressed_bytes": int(args.max_decompressed_mb * 2**20),
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
    parser.add_argument(
        "--max-memory-mb",
        type=float,
        help="analyse in a child process with this address-space limit, MiB (as the app does "
        "for uploads); a failed allocation is then one line, exit 2",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        help="analyse in a child process stopped after this many seconds (exit 2)",
    )


def isolation_from(args: argparse.Namespace) -> object | None:
    """The ChildLimits for the parsed options, or None to analyse in this process."""
    if args.max_memory_mb is None and args.timeout_s is None:
        return None
    from diagnostics.isolated import ChildLimits

    for flag, value in (("--max-memory-mb", args.max_memory_mb), ("--timeout-s", args.timeout_s)):
        if value is not None and not value > 0:
            raise LimitOptionError(f"{flag} must be positive")
    defaults = ChildLimits()
    return ChildLimits(
        memory_bytes=int(args.max_memory_mb * 2**20)
        if args.max_memory_mb
        else defaults.memory_bytes,
        timeout_s=args.timeout_s or defaults.timeout_s,
    )
