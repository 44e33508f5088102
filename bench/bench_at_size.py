"""Benchmark: traces at the size users have, every tool side by side in one run, with the floor.

Inputs (written once into bench/out/, gitignored, and reused):

* the real trace ``hta_v100_rank1_of_2_large`` (51 MiB of JSON, 216k events, gzip);
* synthetic gzip traces of about 256 MB, 1 GB and 2 GB of JSON, made from that trace's steps
  with shifted timestamps and ids (bench_analyzer.write_synthetic);
* rank sets of 8, 32 and 64 files made from one real NCCL trace (bench_ranks.make_rank_set).

Tools, each in a fresh process, one after the other, on the same input:

* ours           ``python -m diagnostics analyze INPUT`` with default settings (diagnostics/
                 compiled to bytecode first, as installed)
* json.load      a bare stdlib gzip + ``json.load`` of each file: what any Python tool that
                 parses the file whole pays
* HTA 0.5.0      ``TraceAnalysis`` load, then temporal, idle-time and kernel breakdowns (a rank
                 set: the communication/computation overlap), in bench/.venv-peers
* traceinsight   the same calls in traceinsight 0.6.1, HTA's successor, with its fastest
                 parser (ijson_batch_and_compress on yajl2_c: 3.4 s against 3.5, 4.3 and 4.4 s
                 for its json, ijson_batched and ijson parsers on that real trace), in
                 bench/.venv-traceinsight
* tb-profiler    torch-tb-profiler's ``RunProfileData.parse`` (single files only)

Each is timed on the wall clock; its peak memory is the peak RSS of its whole process tree
(the process's own VmHWM, read every 10 ms, and the sum over it and its children sampled
every 100 ms), its CPU the tree's user + system time. A run past ``--max-rss-gb`` or ``--timeout-s`` is stopped and
reported as such. Columns: wall s, CPU s, peak RSS MB, JSON MB/s, µs per event, and the wall
and RSS ratios against ours and against json.load.

The floor, measured on the same machine in the same run, in a fresh process each, timing the
operation alone (no interpreter start): the gzip inflate of the input with ISA-L (the
inflater ours uses) and with stdlib zlib, and msgspec's decode of the bare fields every
analysis needs (ph, name, cat, ts, dur, pid, tid; args skipped) from JSON already in memory,
on one core.

    scripts/setup.sh peers                                      # the peers' venvs, once
    .venv/bin/python bench/bench_at_size.py                     # everything (about 45 minutes)
    .venv/bin/python bench/bench_at_size.py --sizes 256 --ranks 8 --tools ours json.load

Each row is appended to bench/out/at-size.jsonl as it completes, so a long run that is
stopped keeps what it measured; ``--table`` prints the table of the rows there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bench_analyzer import (  # noqa: E402
    HTA,
    JSON_LOAD,
    LARGE,
    TB_PROFILER,
    TRACES,
    compile_package,
    write_synthetic,
)
from bench_ranks import HTA as HTA_RANKS  # noqa: E402
from bench_ranks import make_rank_set  # noqa: E402
from process_tree import measure  # noqa: E402

OUT = REPO / "bench" / "out"
RESULTS = OUT / "at-size.jsonl"
VENVS = {
    "HTA 0.5.0": REPO / "bench" / ".venv-peers",
    "traceinsight 0.6.1": REPO / "bench" / ".venv-traceinsight",
}
TOOLS = ("json.load", "ours", "HTA 0.5.0", "traceinsight 0.6.1", "tb-profiler")
# traceinsight's parser is chosen before TraceAnalysis reads anything
FASTEST_PARSER = """
from hta.common.trace_parser import set_default_trace_parsing_backend
from hta.configs.parser_config import ParserBackend
set_default_trace_parsing_backend(ParserBackend.IJSON_BATCH_AND_COMPRESS)
"""
JSON_LOAD_EACH = r"""
import gzip, json, sys
from pathlib import Path
count = 0
for path in sorted(Path(sys.argv[1]).glob("*.json*")):
    with open(path, "rb") as probe:
        packed = probe.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rb") if packed else open(path, "rb")) as handle:
        doc = json.load(handle)
    count += len(doc["traceEvents"] if isinstance(doc, dict) else doc)
    del doc
print(count)
"""
# The floor. Each prints the seconds of the operation alone.
INFLATE = r"""
import sys, time
from isal import isal_zlib
import zlib
module = isal_zlib if sys.argv[2] == "isal" else zlib
start = time.perf_counter()
inflater = module.decompressobj(16 + module.MAX_WBITS)
size = 0
with open(sys.argv[1], "rb") as handle:
    while block := handle.read(1 << 20):
        size += len(inflater.decompress(block))
size += len(inflater.flush())
print(time.perf_counter() - start, size)
"""
BARE_DECODE = r"""
import gzip, sys, time
from pathlib import Path
import msgspec

class Bare(msgspec.Struct, gc=False):
    ph: str | None = None
    name: str | None = None
    cat: str | None = None
    ts: int | float | None = None
    dur: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None

class Doc(msgspec.Struct):
    traceEvents: list[Bare]

decoder = msgspec.json.Decoder(Doc)
target = Path(sys.argv[1])
files = sorted(target.glob("*.json*")) if target.is_dir() else [target]
seconds = events = 0
for path in files:
    with open(path, "rb") as probe:
        packed = probe.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rb") if packed else open(path, "rb")) as handle:
        text = handle.read()
    start = time.perf_counter()
    doc = decoder.decode(text)
    seconds += time.perf_counter() - start
    events += len(doc.traceEvents)
    del doc, text
print(seconds, events)
"""


@dataclass
class Run:
    """One tool on one input."""

    input: str
    tool: str
    json_mb: float
    events: int
    seconds: float | None  # None: failed or stopped (``error`` says which)
    cpu_s: float | None
    rss_mb: float | None
    error: str | None = None


def python_of(tool: str) -> Path | None:
    python = VENVS[tool] / "bin" / "python"
    return python if python.exists() else None


def argv_for(tool: str, target: Path) -> list[str] | None:
    """The command that runs ``tool`` on ``target`` (a file or a rank folder); None: not
    available here (its venv is missing) or not meaningful for this kind of input."""
    many = target.is_dir()
    if tool == "ours":
        result = OUT / "at-size-ours.json"  # -o: a regular file, not stdout's pipe
        return [sys.executable, "-m", "diagnostics", "analyze", str(target), "-o", str(result)]
    if tool == "json.load":
        script = JSON_LOAD_EACH if many else JSON_LOAD
        return [sys.executable, "-c", script, str(target)]
    if tool == "tb-profiler":
        return None if many else [sys.executable, "-c", TB_PROFILER, str(target)]
    python = python_of(tool)
    if python is None:
        return None
    script = HTA_RANKS if many else HTA
    if tool.startswith("traceinsight"):
        script = FASTEST_PARSER + script
    # HTA's single-file script links the file into a folder of its own
    return [str(python), "-c", script, str(target)]


def synthetic(size_mb: int) -> tuple[Path, float, int]:
    """bench/out/synthetic-<size>mb.json.gz, written once: (path, JSON MB, events)."""
    from isal import igzip

    path = OUT / f"synthetic-{size_mb}mb.json.gz"
    done = path.with_suffix(".complete")
    if path.exists() and done.exists():
        meta = json.loads(done.read_text())
        return path, meta["bytes"] / 2**20, meta["events"]
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"  writing {path.name} ...", flush=True)
    with igzip.open(path, "wb", compresslevel=1) as packed:
        written, events = write_synthetic(TRACES / LARGE, packed, size_mb * 2**20)  # type: ignore[arg-type]
    done.write_text(json.dumps({"bytes": written, "events": events}))
    return path, written / 2**20, events


def folder_json_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.glob("*.json")) / 2**20


def floor(name: str, target: Path, json_mb: float, timeout_s: float) -> list[Run]:
    """The inflate alone (ISA-L, zlib) of a gzip input, and the bare fields' decode."""
    runs = []
    commands = []
    if target.is_file() and target.name.endswith(".gz"):
        commands += [
            (f"floor: inflate, {lib}", [INFLATE, str(target), lib]) for lib in ("isal", "zlib")
        ]
    commands.append(("floor: bare-field decode, 1 core", [BARE_DECODE, str(target)]))
    for label, (script, *args) in commands:
        measured = measure([sys.executable, "-c", script, *args], timeout_s)
        out = measured.pop("stdout")
        seconds, events = None, 0
        with contextlib.suppress(ValueError, IndexError):
            seconds_text, count_text = out.split()
            seconds = float(seconds_text)
            events = int(count_text) if "decode" in label else 0
        runs.append(
            Run(
                name,
                label,
                json_mb,
                events,
                seconds,
                None,
                measured["rss_mb"],
                measured["error"],
            )
        )
    return runs


def record(run: Run) -> None:
    with RESULTS.open("a", encoding="utf-8") as out:
        out.write(json.dumps(asdict(run)) + "\n")
    shown = f"{run.seconds:.2f} s" if run.seconds is not None else run.error
    print(f"    {run.tool}: {shown}", flush=True)


def bench_input(
    name: str, target: Path, json_mb: float, events: int, tools: list[str], args: argparse.Namespace
) -> list[Run]:
    """Every tool on one input (best of ``--repeat`` under 100 MB, alternated), then the
    floor. Each run is recorded as it ends; json.load goes first, as it counts the events."""
    print(f"  {name} ({json_mb:.0f} MB of JSON)", flush=True)
    runs: list[Run] = []
    repeat = args.repeat if json_mb < 100 else 1
    ordered = sorted(tools, key=lambda tool: tool != "json.load")
    for _ in range(repeat):
        for tool in ordered:  # alternated, so that a burst of load hits every tool alike
            argv = argv_for(tool, target)
            if argv is None:
                continue
            measured = measure(argv, args.timeout_s, int(args.max_rss_gb * 2**30))
            out = measured.pop("stdout")
            if tool == "json.load" and measured["error"] is None:
                with contextlib.suppress(ValueError, IndexError):
                    events = int(out.strip().splitlines()[-1])
            runs.append(Run(name, tool, json_mb, events, **measured))
            record(runs[-1])
    if not args.no_floor:
        for run in floor(name, target, json_mb, args.timeout_s):
            run.events = run.events or events
            record(run)
            runs.append(run)
    return runs


def best_runs(runs: list[Run]) -> list[Run]:
    """Each tool's fastest run on each input (a failed run only where none succeeded)."""
    best: dict[tuple[str, str], Run] = {}
    for run in runs:
        kept = best.get((run.input, run.tool))
        if kept is None or (
            run.seconds is not None and (kept.seconds is None or run.seconds < kept.seconds)
        ):
            best[(run.input, run.tool)] = run
    return list(best.values())


def _cell(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else f"{a / b:.2f}×"


def print_table(runs: list[Run]) -> None:
    print()
    print(
        "| input | JSON MB | events | tool | wall s | CPU s | peak RSS MB | MB/s | µs/event "
        "| wall ÷ ours | RSS ÷ ours | wall ÷ json.load | RSS ÷ json.load |"
    )
    print("|---" * 13 + "|")
    by_input: dict[str, list[Run]] = {}
    for run in best_runs(runs):
        by_input.setdefault(run.input, []).append(run)
    for name, group in by_input.items():
        ours = next((r for r in group if r.tool == "ours"), None)
        base = next((r for r in group if r.tool == "json.load"), None)
        for r in group:
            per_s = r.json_mb / r.seconds if r.seconds else None
            per_event = r.seconds / r.events * 1e6 if r.seconds and r.events else None
            wall = _cell(r.seconds) if r.seconds is not None else (r.error or "failed")
            print(
                f"| {name} | {r.json_mb:,.0f} | {r.events:,} | {r.tool} | {wall} "
                f"| {_cell(r.cpu_s)} | {_cell(r.rss_mb, 0)} | {_cell(per_s, 0)} | {_cell(per_event)} "
                f"| {_ratio(r.seconds, ours and ours.seconds)} | {_ratio(r.rss_mb, ours and ours.rss_mb)} "
                f"| {_ratio(r.seconds, base and base.seconds)} | {_ratio(r.rss_mb, base and base.rss_mb)} |"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", type=int, nargs="*", default=[256, 1024, 2048], help="synthetic MB"
    )
    parser.add_argument("--ranks", type=int, nargs="*", default=[8, 32, 64])
    parser.add_argument("--no-large", action="store_true", help="leave out the 54 MB real trace")
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per tool under 100 MB (best wall)"
    )
    parser.add_argument("--no-floor", action="store_true")
    parser.add_argument("--timeout-s", type=float, default=1200.0)
    total_gb = psutil.virtual_memory().total / 2**30
    parser.add_argument(
        "--max-rss-gb",
        type=float,
        default=round(0.75 * total_gb, 1),
        help="stop a tool whose process tree passes this (default 3/4 of this machine's memory)",
    )
    parser.add_argument(
        "--table", action="store_true", help=f"only print the table of {RESULTS.name}'s rows"
    )
    args = parser.parse_args(argv)
    if args.table:
        rows = RESULTS.read_text(encoding="utf-8").splitlines() if RESULTS.exists() else []
        print_table([Run(**json.loads(row)) for row in rows])
        return 0
    for tool in args.tools:
        if tool in VENVS and python_of(tool) is None:
            print(
                f"note: {tool} skipped: {VENVS[tool].relative_to(REPO)} missing (scripts/setup.sh peers)"
            )
    compile_package()
    OUT.mkdir(parents=True, exist_ok=True)
    print(
        f"machine: {os.cpu_count()} CPUs, {total_gb:.0f} GiB; results appended to "
        f"{RESULTS.relative_to(REPO)}",
        flush=True,
    )
    runs: list[Run] = []
    if not args.no_large:
        from bench_analyzer import json_mb

        large = TRACES / LARGE
        runs += bench_input(large.name, large, json_mb(large), 0, args.tools, args)
    for size in args.sizes:
        path, mb, events = synthetic(size)
        runs += bench_input(path.name, path, mb, events, args.tools, args)
    for ranks in args.ranks:
        folder = make_rank_set(ranks)
        runs += bench_input(f"{ranks} ranks", folder, folder_json_mb(folder), 0, args.tools, args)
    print_table(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
