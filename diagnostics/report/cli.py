"""``python -m diagnostics report PATH --format html|md|json -o FILE [--fail-on SEVERITY]``.

Exit status: 0 written and nothing at or above ``--fail-on``; 1 written and a finding at or
above ``--fail-on`` exists, or ``--baseline`` given and PATH a significant regression against
it (diagnostics.gate, docs/GATE.md); 2 unusable input or options (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from diagnostics.cli_limits import (
    LimitOptionError,
    OneLineParser,
    UsageError,
    add_isolation_options,
    add_limit_options,
    analyse,
    isolation_from,
    limits_from,
    resource_error,
)
from diagnostics.errors import InputError
from diagnostics.report.formats import FORMAT_NAMES, render_report
from diagnostics.report.pricing import GPU_PRICES, Pricing
from diagnostics.severity import SEVERITY_ORDER
from diagnostics.text_output import (
    STDOUT,
    OutputRefused,
    check_output_path,
    print_stderr,
    write_error_line,
    write_output,
)

SEVERITIES = tuple(SEVERITY_ORDER)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m diagnostics report",
        description="Write a report (HTML, Markdown or JSON) for a trace, a folder of rank "
        "traces or a run folder; --compare adds a second one as 'after'.",
    )
    parser.add_argument(
        "path", help="trace file (.json/.json.gz), folder of rank traces, or run folder"
    )
    parser.add_argument("--format", choices=FORMAT_NAMES, default="html")
    parser.add_argument(
        "-o",
        "--output",
        help="where to write, as Unix tools do: a file (replaced whole), a link's target, "
        "a device or pipe; - or none: standard output (an HTML report is not printed to a "
        "terminal)",
    )
    parser.add_argument(
        "--fail-on",
        choices=SEVERITIES,
        help="exit 1 when a finding at or above this severity exists",
    )
    parser.add_argument(
        "--compare", metavar="PATH_B", help="compare PATH (before) with PATH_B (after)"
    )
    parser.add_argument(
        "--baseline",
        metavar="BASELINE",
        help="also gate PATH against BASELINE (run, trace or saved baseline; docs/GATE.md): "
        "exit 1 on a significant regression beyond 5 %%",
    )
    parser.add_argument(
        "--gpu",
        metavar="NAME",
        help="price entry for the cost section (default: guessed from the environment); one of: "
        + ", ".join(p.name for p in GPU_PRICES),
    )
    parser.add_argument("--price", type=float, metavar="USD", help="your price per GPU-hour")
    parser.add_argument(
        "--spot", action="store_true", help="use the spot/preemptible default price"
    )
    parser.add_argument(
        "--gpus", type=int, help="GPUs the job uses (default: its world size, else 1)"
    )
    add_limit_options(parser)
    add_isolation_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["report"]:  # called with the subcommand still in front
        args_list = args_list[1:]
    try:
        args = _parser().parse_args(args_list)
        pricing = Pricing(
            gpu=args.gpu,
            tier="spot" if args.spot else "on_demand",
            usd_per_gpu_hour=args.price,
            gpus=args.gpus,
        )
        limits = limits_from(args)
        child = isolation_from(args)
        if args.output not in (None, STDOUT):
            check_output_path(args.output)  # refused before the analysis, not after it
        elif args.output is None and args.format == "html" and sys.stdout.isatty():
            # megabytes of HTML scrolling past are of no use to anyone
            raise UsageError(
                "an HTML report is a page for a browser, not text for a terminal: give "
                "-o report.html (or -o - to print it anyway, --format md to read it here)"
            )
    except (UsageError, LimitOptionError, ValueError) as exc:  # OutputRefused is a ValueError
        print_stderr(f"error: {exc}")
        return 2

    # Imported here so `--help` and option errors stay fast.
    from diagnostics.compare import compare
    from diagnostics.report.model import build_comparison_report, build_report

    try:
        from diagnostics.snapshot.reader import is_snapshot_file

        if args.compare and is_snapshot_file(args.path) and is_snapshot_file(args.compare):
            # two memory snapshots: one analysis of the pair (growth by site, leak suspects)
            result = analyse(args.path, limits, child, compare=args.compare)
            args.compare = None
        else:
            result = analyse(args.path, limits, child)
        if args.compare:
            report = build_comparison_report(
                compare(result, analyse(args.compare, limits, child)), pricing=pricing
            )
        else:
            report = build_report(result, pricing=pricing)
        content = render_report(report, args.format)
        gated = None
        if args.baseline:
            from diagnostics.gate.cli import load_side
            from diagnostics.gate.model import gate
            from diagnostics.gate.sides import side_from_result

            gated = gate(
                load_side(args.baseline, limits, child), side_from_result(result, args.path)
            )
    except InputError as exc:
        print_stderr(f"error: {exc}")
        return 2
    except (MemoryError, RecursionError) as exc:
        print_stderr(resource_error(args.path, exc))
        return 2
    except Exception as exc:  # a bug must still reach the user as one line, not a traceback
        # exit 2, not 1: here 1 is the --fail-on gate, which a CI job reads as findings
        print_stderr(
            f"error: {args.path}: could not build the report ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())})"
        )
        return 2

    if args.output not in (None, STDOUT):
        try:
            write_output(args.output, content)
        except OutputRefused as exc:
            print_stderr(f"error: {exc}")
            return 2
        except OSError as exc:
            print_stderr(write_error_line(args.output, exc))
            return 2
    else:
        sys.stdout.write(content)

    counts = {s: sum(1 for f in report.findings if f.severity == s) for s in SEVERITIES}
    where = "standard output" if args.output in (None, STDOUT) else args.output
    print_stderr(
        f"report ({args.format}) written to {where}: {len(report.findings)} finding(s) "
        f"({counts['high']} high, {counts['medium']} medium, {counts['low']} low)"
    )
    if gated is not None:
        from diagnostics.gate.markdown import headline

        print_stderr(headline(gated))
    if args.fail_on and report.findings_at_or_above(args.fail_on):
        worst = report.findings_at_or_above(args.fail_on)[0]
        print_stderr(
            f"failing: {len(report.findings_at_or_above(args.fail_on))} finding(s) at or above "
            f"{args.fail_on}, first: [{worst.severity}] {worst.rule}"
        )
        return 1
    return 1 if gated is not None and gated.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
