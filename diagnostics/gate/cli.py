"""``pipeline-doctor gate BASELINE CANDIDATE`` (also ``python -m diagnostics gate``).

BASELINE and CANDIDATE are run folders, traces, folders of rank traces, or baselines stored
by ``--save-baseline``. Prints the Markdown summary (or ``--format json``) and writes
``--markdown PATH`` / ``--json PATH``. ``--save-baseline PATH`` stores the candidate's
measures (with one path given, that path's) as a baseline for a later gate.

Exit status: 0 no significant regression beyond ``--max-regression``; 1 one (a CI gate);
2 unusable input or options, one line on stderr naming the file.
"""

from __future__ import annotations

import argparse
import json
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
from diagnostics.text_output import (
    STDOUT,
    OutputRefused,
    check_output_path,
    emit_or_exit_code,
    print_stderr,
)


def _percent(text: str) -> float:
    """'5', '5%' or '5 %' -> 0.05."""
    try:
        value = float(text.strip().rstrip("%").strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage") from None
    if not 0 < value < 1000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage above 0")
    return value / 100.0


def _alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not between 0 and 1")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="pipeline-doctor gate",
        description="Compare a candidate with a baseline (run folders, traces or a stored "
        "baseline): step time and throughput with a Mann-Whitney U test and a bootstrap "
        "interval, peak memory, MFU, findings. Exit 1 on a significant regression.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="BASELINE CANDIDATE")
    parser.add_argument(
        "--max-regression",
        type=_percent,
        default=0.05,
        metavar="PCT",
        help="tolerance in %% (default 5): smaller or non-significant changes pass",
    )
    parser.add_argument(
        "--alpha",
        type=_alpha,
        default=0.002,
        help="significance level (default 0.002, asv's): docs/GATE.md says why",
    )
    parser.add_argument("--format", choices=("md", "json"), default="md", help="stdout format")
    parser.add_argument("--markdown", metavar="FILE", help="also write the Markdown summary")
    parser.add_argument("--json", metavar="FILE", help="also write the JSON summary")
    parser.add_argument(
        "--save-baseline",
        metavar="FILE",
        help="store the candidate (or the one PATH given) as a baseline JSON",
    )
    add_limit_options(parser)
    add_isolation_options(parser)
    return parser


def _outputs(args: argparse.Namespace) -> list[str]:
    return [p for p in (args.markdown, args.json, args.save_baseline) if p not in (None, STDOUT)]


def load_side(path: str, limits: dict[str, int], child):  # -> GateSide
    """A gate side from a stored baseline or an analysis of the path."""
    from diagnostics.gate.sides import is_baseline_file, load_baseline, side_from_result

    if is_baseline_file(path):
        return load_baseline(path)
    return side_from_result(analyse(path, limits, child), path)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["gate"]:
        args_list = args_list[1:]
    try:
        args = _parser().parse_args(args_list)
        if len(args.paths) > 2 or (len(args.paths) == 1 and not args.save_baseline):
            raise UsageError("give BASELINE CANDIDATE, or one PATH with --save-baseline FILE")
        limits = limits_from(args)
        child = isolation_from(args)
        for output in _outputs(args):
            check_output_path(output)  # refused before the analyses, not after them
    except (UsageError, LimitOptionError, OutputRefused) as exc:
        print_stderr(f"error: {exc}")
        return 2

    from diagnostics.gate.markdown import headline, render_markdown
    from diagnostics.gate.model import gate

    try:
        sides = [load_side(path, limits, child) for path in args.paths]
        result = None
        if len(sides) == 2:
            result = gate(sides[0], sides[1], max_regression=args.max_regression, alpha=args.alpha)
        texts = {}
        if args.save_baseline:
            texts[args.save_baseline] = json.dumps(sides[-1].to_baseline(), indent=2) + "\n"
        if result is not None:
            markdown = render_markdown(result)
            doc = json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"
            if args.markdown:
                texts[args.markdown] = markdown
            if args.json:
                texts[args.json] = doc
    except InputError as exc:
        print_stderr(f"error: {exc}")
        return 2
    except (MemoryError, RecursionError) as exc:
        print_stderr(resource_error(args.paths[0], exc))
        return 2
    except Exception as exc:  # a bug: still one line; 2, since 1 is the gate's verdict
        print_stderr(
            f"error: {' '.join(args.paths)}: could not run the gate ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())})"
        )
        return 2

    for path, text in texts.items():
        if code := emit_or_exit_code(text, path):
            return code
    if result is None:
        print_stderr(f"baseline written to {args.save_baseline}")
        return 0
    if STDOUT not in (args.markdown, args.json):
        sys.stdout.write(markdown if args.format == "md" else doc)
    print_stderr(headline(result))
    return 1 if result.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
