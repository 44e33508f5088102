"""CLI: ``python -m diagnostics analyze|report|gate|rules ...``.

analyze PATH [--format json|text] [-o FILE] [--max-decompressed-mb N] [--max-events N]
        [--max-memory-mb N] [--timeout-s S] [--thresholds FILE]
    exit 0 with the result; 2 with one line on stderr for bad input, usage or a resource
    limit; 1 with one line for an internal error (a bug: never a traceback either way).
    --max-memory-mb / --timeout-s, or an address-space limit the command already runs
    under, analyse in the bounded child of diagnostics.isolated.
report ...  -> diagnostics.report.cli.main ; rules ... -> diagnostics.rules.docs.main
gate ...  -> diagnostics.gate.cli.main (docs/GATE.md)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from diagnostics.cli_limits import LimitOptionError as _LimitOptionError
from diagnostics.cli_limits import (
    OneLineParser,
    UsageError,
    add_isolation_options,
    add_limit_options,
    analyse,
    isolation_from,
    limits_from,
    resource_error,
)
from diagnostics.printable import printable
from diagnostics.text_output import (
    STDOUT,
    OutputRefused,
    check_output_path,
    emit,
    print_stderr,
    write_error_line,
)

USAGE = (
    "usage: python -m diagnostics {analyze,report,gate,rules} ...\n"
    "  analyze PATH [--format json|text] [-o FILE]   analyse a trace, rank folder, run or\n"
    "                                               CUDA memory snapshot (--compare B)\n"
    "  report PATH --format html|md|json -o FILE    write a report\n"
    "  gate BASELINE CANDIDATE                      exit 1 on a significant regression\n"
    "  rules [--format md]                          print the rule reference\n"
)


def _analyze_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m diagnostics analyze",
        description="Analyse a trace (.json/.json.gz), a folder of per-rank traces or a run "
        "folder; print the result as JSON (schema pipeline-doctor/analysis/v1) or text.",
    )
    parser.add_argument("path", help="trace file, folder of rank traces, or run folder")
    parser.add_argument("--format", choices=("json", "text"), default="json")
    parser.add_argument(
        "-o",
        "--output",
        help="write here instead of stdout, as Unix tools do: a file (replaced whole), a link's "
        "target, a device or pipe; - for stdout",
    )
    add_limit_options(parser)
    add_isolation_options(parser)
    parser.add_argument("--thresholds", help="rule thresholds override (.toml or .json)")
    parser.add_argument(
        "--compare",
        metavar="SNAPSHOT_B",
        help="a second CUDA memory snapshot of the same job: PATH is before, SNAPSHOT_B after "
        "(growth by allocation site, leak suspects); docs/MEMORY.md",
    )
    return parser


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def _ms(value: Any) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def render_text(doc: dict[str, Any]) -> str:
    """A compact human summary of the result JSON; every line is :func:`printable`, so a
    file, GPU or version name from the input cannot split a line or drive the terminal."""
    from diagnostics.metrics import GPU_BUSY, GPU_KERNEL_UTILISATION

    source, summary, env = doc["source"], doc["summary"], doc["environment"]
    head = [f"{source['kind']} {source['path']}"]
    head += [str(v) for v in (env.get("device"), env.get("gpu_name")) if v]
    from diagnostics.report.sections import (
        gpu_identity,
        kernel_coverage_rows,
        mfu_rows,
        roofline_rows,
    )

    identity = gpu_identity(env)
    if identity:
        head.append(identity)
    if env.get("pytorch_version"):
        head.append(f"PyTorch {env['pytorch_version']}")
    if len(source.get("ranks") or ()) > 1:
        head.append(f"{len(source['ranks'])} ranks")
    lines = [" · ".join(head)]
    step_time = summary.get("step_time_ms")
    steps = f"steps: {summary.get('steps')}"
    if summary.get("step_time_source"):
        steps += f" ({summary['step_time_source']})"
    if step_time:
        steps += (
            f"   step time: mean {_ms(step_time['mean'])} · p50 {_ms(step_time['p50'])}"
            f" · p95 {_ms(step_time['p95'])}"
        )
    if summary.get("samples_per_s") is not None:
        # formatted as the cards and reports show it (report.fmt.rate)
        from diagnostics.report.fmt import rate

        steps += f"   throughput {rate(summary['samples_per_s'], 'samples/s')} (median step)"
    if summary.get("steps") is not None or step_time:  # a memory snapshot has no steps
        lines.append(steps)
    if summary.get("breakdown_pct"):
        parts = " · ".join(f"{k} {_pct(v)}" for k, v in summary["breakdown_pct"].items())
        lines.append(f"step breakdown: {parts} (mean over the profiled steps)")
    if summary.get("data_wait_pct") is not None:
        lines.append(f"data wait: {_pct(summary['data_wait_pct'])} of step time (median step)")
    kernel_util, busy = summary.get("gpu_kernel_utilization_pct"), summary.get("gpu_busy_pct")
    if kernel_util is not None or busy is not None:
        parts = []
        if kernel_util is not None:
            parts.append(f"{GPU_KERNEL_UTILISATION} {_pct(kernel_util)}")
        if busy is not None:
            busy_text = f"{GPU_BUSY} {_pct(busy)}"
            if summary.get("gpu_busy_us") is not None:
                busy_text += f" ({_ms(summary['gpu_busy_us'] / 1000.0)})"
            parts.append(busy_text)
        gpu = " · ".join(parts)
        idle = summary.get("gpu_idle_breakdown_pct")
        if idle:
            gpu += " · idle: " + " · ".join(f"{k} {_pct(v)}" for k, v in idle.items())
        lines.append(gpu)
    timeline = summary.get("gpu_timeline")
    if timeline:
        window = (
            "GPU ProfilerStep window"
            if timeline["window"] == "gpu_profiler_steps"
            else ("first to last GPU activity")
        )
        lines.append(
            f"GPU timeline ({window}, as TraceLens): total {_ms(timeline['total_us'] / 1000.0)}"
            f" · computation {_ms(timeline['computation_us'] / 1000.0)}"
            f" · exposed comm {_ms(timeline['exposed_comm_us'] / 1000.0)}"
            f" · exposed copies {_ms(timeline['exposed_memcpy_us'] / 1000.0)}"
            f" · idle {_ms(timeline['idle_us'] / 1000.0)} ({_pct(timeline['idle_pct'])})"
        )
    lines.extend(f"{label}: {value}" for label, value in mfu_rows(summary))
    if summary.get("peak_memory_bytes") is not None:
        from diagnostics.metrics import peak_memory_name
        from diagnostics.report.fmt import bytes_

        which = peak_memory_name(summary.get("peak_memory_kind"), summary.get("peak_memory_window"))
        lines.append(f"peak memory, {which}: {bytes_(summary['peak_memory_bytes'])}")
    if summary.get("memory_snapshot"):
        from diagnostics.report.memory import snapshot_text_lines

        lines.extend(snapshot_text_lines(summary["memory_snapshot"]))
    lines.extend(f"{label}: {value}" for label, value in kernel_coverage_rows(summary))
    lines.extend(f"{label}: {value}" for label, value in roofline_rows(summary))
    ranks = summary.get("ranks")
    if ranks:
        spread = ranks.get("spread")
        line = f"ranks: {ranks['count']}"
        if spread:
            line += (
                f" · step time spread {spread['spread_pct']:.1f}% (slowest rank "
                f"{spread['slowest_rank']}: {_ms(spread['slowest_ms'])})"
            )
        lines.append(line)
    from diagnostics.report.fmt import saving as fmt_saving

    findings = doc.get("findings") or []
    lines.append(f"findings: {len(findings)}" if findings else "findings: none")
    for finding in findings:
        saving = finding.get("estimated_saving_pct")
        tail = f" · expected: about {fmt_saving(saving)}" if saving and saving >= 1 else ""
        lines.append(f"  [{finding['severity']}] {finding['rule']}: {finding['title']}{tail}")
        patch = (finding.get("fix") or {}).get("config_patch")
        if patch:
            lines.append(f"      fix: {json.dumps(patch)}")
    for warning in doc.get("warnings") or []:
        lines.append(f"warning: {warning}")
    for note in doc.get("notes") or []:
        lines.append(f"note: {note}")
    return "\n".join(printable(line) for line in lines) + "\n"


def analyze_main(argv: Sequence[str]) -> int:
    try:
        args = _analyze_parser().parse_args(list(argv))
        limits = limits_from(args)
        child = isolation_from(args)
        if args.output not in (None, STDOUT):
            check_output_path(args.output)  # refused before a minute of analysis, not after
    except (UsageError, _LimitOptionError, OutputRefused) as exc:
        print_stderr(f"error: {exc}")
        return 2
    if child is None and args.compare is None:
        from diagnostics.trace.decode_helper import start_spare

        # a large trace's decode helper starts now: its imports overlap this process's
        start_spare(args.path)
        from diagnostics.startup import import_analyser

        import_analyser()
    # Imported after parsing so that usage errors stay instant.
    from diagnostics.errors import AnalysisBug, InputError
    from diagnostics.thresholds import ThresholdsError

    try:
        result = analyse(args.path, limits, child, args.thresholds, args.compare)
        doc = result.to_json()
        text = (
            json.dumps(doc, indent=2, allow_nan=False) + "\n"
            if args.format == "json"
            else render_text(doc)
        )
        emit(text, args.output)
    except AnalysisBug as exc:  # a bug met in the bounded child: exit 1, as in this process
        print_stderr(f"error: {exc}")  # "<path>: internal error in the analysis: ..."
        return 1
    except (InputError, ThresholdsError) as exc:
        print_stderr(f"error: {exc}")
        return 2
    except OSError as exc:
        print_stderr(write_error_line(args.output, exc))
        return 2
    except (MemoryError, RecursionError) as exc:
        print_stderr(resource_error(args.path, exc))
        return 2
    except Exception as exc:  # a bug: still one line, and a distinct exit code
        print_stderr(
            f"internal error: {args.path}: {type(exc).__name__}: {' '.join(str(exc).split())}"
        )
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        (sys.stdout if args else sys.stderr).write(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "analyze":
        return analyze_main(rest)
    if command == "report":
        from diagnostics.report.cli import main as report_main

        return report_main(rest)
    if command == "gate":
        from diagnostics.gate.cli import main as gate_main

        return gate_main(rest)
    if command == "rules":
        try:
            from diagnostics.rules.docs import main as rules_main
        except ImportError:
            print_stderr("error: the rule reference is not available in this build")
            return 2
        return rules_main(rest)
    print_stderr(f"error: unknown command {command!r}")
    sys.stderr.write(USAGE)
    return 2


def _exit_without_teardown(code: int) -> None:
    """Ends the process once the result is out, skipping interpreter teardown.

    Finalising polars (its modules and thread pool) alone takes ~45 ms at exit, after the
    answer is already printed; analyze holds no files, children or atexit work to lose.
    If the streams cannot be flushed, the normal exit runs and reports it as before.
    """
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        raise SystemExit(code) from None
    os._exit(code)


if __name__ == "__main__":
    _code = main()
    if sys.argv[1:2] == ["analyze"]:
        _exit_without_teardown(_code)
    raise SystemExit(_code)
