"""Benchmark: Pipeline Doctor's full trace analysis against its peers, on the real traces.

For each trace in ../shared/traces, each tool runs in a fresh process (start to result)
and is timed on the wall clock; its peak RSS is its own VmHWM (run_measured says why not
wait4's). Side by side:

* ours          ``python -m diagnostics analyze TRACE`` (load, facts, rules, JSON printed),
                with diagnostics/ compiled to bytecode first, as installed (compile_package)
* json.load     a bare stdlib ``json.load`` of the same (gzip) file: the floor any Python
                tool that parses the file whole has to pay
* HTA 0.5.0     ``TraceAnalysis`` load + temporal, idle-time and kernel breakdowns, from a
                separate venv (bench/.venv-peers, created on first use; skipped with a note
                when it cannot be installed)
* tb-profiler   torch-tb-profiler's ``RunProfileData.parse`` (the main venv)

Then the scale run: synthetic traces of about 0.5 and 1 GB, made by repeating the large
trace's steps with shifted timestamps and ids (written to a temporary folder, deleted
after), analysed in one pass; time and peak RSS per size show how the cost grows.

    .venv/bin/python bench/bench_analyzer.py            # everything (several minutes)
    .venv/bin/python bench/bench_analyzer.py --quick    # the 54 MB trace: ours/json.load

``--quick`` is the check a change to diagnostics/ runs before it merges: the large trace
only, ours against a bare ``json.load``, best of 3 each, no peers and no scale run (well
under a minute); compare its ratio with the same command on the base commit.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
LARGE = "hta_v100_rank1_of_2_large.json.gz"
PEERS_VENV = REPO / "bench" / ".venv-peers"
# the pin, shared with scripts/setup.sh peers
HTA_REQUIREMENTS = REPO / "bench" / "requirements-hta.txt"

JSON_LOAD = r"""
import gzip, json, sys
path = sys.argv[1]
with open(path, "rb") as probe:
    packed = probe.read(2) == b"\x1f\x8b"
with (gzip.open(path, "rb") if packed else open(path, "rb")) as handle:
    doc = json.load(handle)
print(len(doc["traceEvents"] if isinstance(doc, dict) else doc))
"""

HTA = r"""
import logging, os, sys, tempfile
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
path = os.path.abspath(sys.argv[1])
folder = tempfile.mkdtemp()
os.symlink(path, os.path.join(folder, os.path.basename(path)))
analysis = TraceAnalysis(trace_dir=folder)
analysis.get_temporal_breakdown(visualize=False)
# idle time is per rank and defaults to rank 0: ask for the ranks the folder holds
analysis.get_idle_time_breakdown(ranks=sorted(analysis.t.traces), visualize=False)
analysis.get_gpu_kernel_breakdown(visualize=False)
print("ok")
"""

TB_PROFILER = r"""
import logging, sys, tempfile
logging.disable(logging.WARNING)
from torch_tb_profiler.profiler.data import RunProfileData
RunProfileData.parse("worker0", "span", sys.argv[1], tempfile.mkdtemp())
print("ok")
"""


@dataclass(frozen=True)
class Measured:
    seconds: float | None  # best wall time over the repeats; None when it failed
    rss_mb: float | None  # peak RSS of that run, MiB
    stdout: str = ""
    error: str | None = None
    # user + system CPU of that run, s: on a busy shared machine wall time tracks it
    cpu_s: float | None = None


def _high_water_mb(pid: int) -> float | None:
    """The process's own peak RSS so far (VmHWM of its address space, made at exec)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        pass
    return None


def run_measured(argv: list[str], repeat: int, timeout_s: float = 900.0) -> Measured:
    """Best-of-``repeat`` wall time of a fresh process, and its peak RSS.

    The peak is the child's own VmHWM, read as it runs: wait4's ru_maxrss starts a forked
    child at its parent's RSS (Linux keeps the pre-exec high-water mark), so this process
    holding a big trace floored every child's figure (a 1 GB parent: a bare ``python -c
    pass`` child read 967 MB). ru_maxrss only for a child too short-lived to read."""
    best: Measured | None = None
    for _ in range(repeat):
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=REPO)
            deadline = start + timeout_s
            high_water: float | None = None
            while True:
                seen = _high_water_mb(proc.pid)
                if seen is not None:
                    high_water = max(high_water or 0.0, seen)
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() > deadline:
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.002)
            seconds = time.perf_counter() - start
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode(errors="replace")
            stderr = err.read().decode(errors="replace")
        if proc.returncode != 0:
            last = (stderr.strip().splitlines() or ["failed"])[-1][:160]
            return Measured(None, None, stdout, f"exit {proc.returncode}: {last}")
        cpu_s = usage.ru_utime + usage.ru_stime
        peak_mb = high_water if high_water is not None else usage.ru_maxrss / 1024.0
        measured = Measured(seconds, peak_mb, stdout, cpu_s=cpu_s)
        if best is None or measured.seconds < best.seconds:
            best = measured
    assert best is not None
    return best


def _best(best: Measured | None, run: Measured) -> Measured:
    """The faster of two runs; a failed run wins (the first failure is kept and reported)."""
    if best is None:
        return run
    if best.seconds is None:
        return best
    if run.seconds is None:
        return run
    return run if run.seconds < best.seconds else best


def compile_package() -> None:
    """Compiles diagnostics/ to bytecode first, so that ours is timed as it runs once
    installed: pip, the image (Dockerfile) and any first run write the .pyc files, but
    this machine sets PYTHONDONTWRITEBYTECODE, which made every timed run compile ~110
    modules from source (0.13 s of imports)."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", str(REPO / "diagnostics")],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def ensure_peers_venv() -> Path | None:
    """bench/.venv-peers with HTA 0.5.0 (outside git; bench/requirements-hta.txt); None with a
    note when it fails."""
    python = PEERS_VENV / "bin" / "python"
    probe = [str(python), "-c", "import hta.trace_analysis"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"setting up {PEERS_VENV.relative_to(REPO)} from {HTA_REQUIREMENTS.name} ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-r", str(HTA_REQUIREMENTS)],
            check=True,
            timeout=1200,
        )
        subprocess.run(probe, check=True, capture_output=True)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"note: HTA skipped: could not install {HTA_REQUIREMENTS.name} ({exc})")
        return None
    return python


def fmt(value: float | None, digits: int = 2) -> str:
    return "failed" if value is None else f"{value:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def json_mb(path: Path) -> float:
    with path.open("rb") as handle:
        packed = handle.read(2) == b"\x1f\x8b"
    if not packed:
        return path.stat().st_size / 2**20
    size = 0
    with gzip.open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            size += len(block)
    return size / 2**20


def bench_traces(
    traces: list[Path], repeat: int, hta_python: Path | None, tb: bool = True
) -> list[dict]:
    ours_cmd = [sys.executable, "-m", "diagnostics", "analyze"]
    rows = []
    for path in traces:
        print(f"  {path.name} ...", flush=True)
        # Alternating runs, so a burst of load on a shared machine hits both sides alike.
        baseline = ours = None
        for _ in range(repeat):
            base_run = run_measured([sys.executable, "-c", JSON_LOAD, str(path)], 1)
            ours_run = run_measured([*ours_cmd, str(path)], 1)
            baseline = _best(baseline, base_run)
            ours = _best(ours, ours_run)
        assert baseline is not None and ours is not None
        tb = (
            run_measured([sys.executable, "-c", TB_PROFILER, str(path)], repeat)
            if tb
            else Measured(None, None, error="skipped (--no-tb)")
        )
        hta = (
            run_measured([str(hta_python), "-c", HTA, str(path)], repeat)
            if hta_python is not None
            else Measured(None, None, error="not installed")
        )
        rows.append(
            {
                "trace": path.name,
                "events": int(baseline.stdout.strip() or 0),
                "json_mb": json_mb(path),
                "ours": ours,
                "json_load": baseline,
                "hta": hta,
                "tb": tb,
            }
        )
    return rows


def print_trace_table(rows: list[dict]) -> None:
    print()
    print(
        "| trace | events | JSON MB | ours s | ours MB | json.load s | json.load MB "
        "| ours/json.load time | ours/json.load RSS | ours/json.load CPU | HTA 0.5.0 s | HTA MB | HTA/ours time "
        "| tb-profiler s | tb-profiler MB | tb/ours time |"
    )
    print("|---" * 16 + "|")
    for r in rows:
        ours, base, hta, tb = r["ours"], r["json_load"], r["hta"], r["tb"]
        print(
            f"| {r['trace']} | {r['events']:,} | {r['json_mb']:.0f} "
            f"| {fmt(ours.seconds)} | {fmt(ours.rss_mb, 0)} "
            f"| {fmt(base.seconds)} | {fmt(base.rss_mb, 0)} "
            f"| {ratio(ours.seconds, base.seconds)} | {ratio(ours.rss_mb, base.rss_mb)} "
            f"| {ratio(ours.cpu_s, base.cpu_s)} "
            f"| {fmt(hta.seconds)} | {fmt(hta.rss_mb, 0)} | {ratio(hta.seconds, ours.seconds)} "
            f"| {fmt(tb.seconds)} | {fmt(tb.rss_mb, 0)} | {ratio(tb.seconds, ours.seconds)} |"
        )
    failures = [
        f"{r['trace']}: {name} {m.error}"
        for r in rows
        for name, m in (("ours", r["ours"]), ("HTA", r["hta"]), ("tb-profiler", r["tb"]))
        if m.error
    ]
    for failure in failures:
        print(f"note: {failure}")


# -- the scale run ---------------------------------------------------------------------

_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def write_synthetic(source: Path, out: BinaryIO, target_bytes: int) -> tuple[int, int]:
    """Repeats the source trace's events, each copy shifted past the previous one in time
    and in its ids (correlation, External id, flow id, step numbers), until the JSON holds
    about ``target_bytes``, to ``out`` (a binary file: plain or gzip). Written copy by copy:
    the big file is never in memory.
    Returns (bytes written, events written)."""
    with gzip.open(source, "rb") as handle:
        doc = json.load(handle)
    events = doc.pop("traceEvents")
    times = [e["ts"] for e in events if isinstance(e.get("ts"), int | float)]
    period = max(times) - min(times) + 1000.0  # µs: each copy starts after the last ends
    ids = [
        v
        for e in events
        for v in (e.get("id"), (e.get("args") or {}).get("correlation"))
        if isinstance(v, int)
    ]
    id_stride = max(ids) + 1
    steps = [int(m.group(1)) for e in events if (m := _STEP.match(str(e.get("name", ""))))]
    step_stride = max(steps) - min(steps) + 1 if steps else 0
    # Copies past the first leave out Kineto's own rows (metadata, label pids): one set.
    repeated = [e for e in events if e.get("ph") != "M" and isinstance(e.get("pid"), int)]
    encoder = msgspec.json.Encoder()
    written = count = 0
    head = encoder.encode(doc)[:-1] + b', "traceEvents": ['
    out.write(head)
    written += len(head)
    copy = 0
    while written < target_bytes:
        batch = events if copy == 0 else repeated
        shifted = []
        for event in batch:
            event = dict(event)
            if isinstance(event.get("ts"), int | float):
                event["ts"] = event["ts"] + copy * period
            if isinstance(event.get("id"), int):
                event["id"] += copy * id_stride
            args = event.get("args")
            if isinstance(args, dict) and copy:
                args = dict(args)
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int):
                        args[key] += copy * id_stride
                event["args"] = args
            match = _STEP.match(str(event.get("name", "")))
            if match and copy:
                event["name"] = f"ProfilerStep#{int(match.group(1)) + copy * step_stride}"
            shifted.append(event)
        body = encoder.encode(shifted)[1:-1]
        if copy:
            out.write(b",")
            written += 1
        out.write(body)
        written += len(body)
        count += len(shifted)
        copy += 1
    out.write(b"]}")
    written += 2
    return written, count


def bench_scale(sizes_mb: list[int], folder: Path) -> list[dict]:
    rows = []
    for size_mb in sizes_mb:
        path = folder / f"synthetic_{size_mb}mb.json"
        print(f"  writing {path.name} ...", flush=True)
        with path.open("wb") as out:
            written, count = write_synthetic(TRACES / LARGE, out, size_mb * 2**20)
        print(f"  analysing {path.name} ({written / 2**20:.0f} MB, {count:,} events) ...")
        measured = run_measured(
            [sys.executable, "-m", "diagnostics", "analyze", str(path), "--format", "text"],
            repeat=1,
            timeout_s=1800,
        )
        path.unlink()
        rows.append({"mb": written / 2**20, "events": count, "ours": measured})
    return rows


def print_scale_table(rows: list[dict]) -> None:
    print()
    print(
        "| synthetic JSON MB | events | ours s | ours peak RSS MB | µs per event | RSS MB per JSON MB |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        m = r["ours"]
        per_event = None if m.seconds is None else m.seconds / r["events"] * 1e6
        per_mb = None if m.rss_mb is None else m.rss_mb / r["mb"]
        print(
            f"| {r['mb']:.0f} | {r['events']:,} | {fmt(m.seconds)} | {fmt(m.rss_mb, 0)} "
            f"| {fmt(per_event, 2)} | {fmt(per_mb, 2)} |"
        )
        if m.error:
            print(f"note: {r['mb']:.0f} MB: {m.error}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the large trace only, ours against json.load, best of 3: no peers, no scale run",
    )
    parser.add_argument("--repeat", type=int, default=None, help="runs per tool (best wall)")
    parser.add_argument("--no-hta", action="store_true", help="skip HTA (no venv set up)")
    parser.add_argument("--no-scale", action="store_true", help="skip the synthetic scale run")
    parser.add_argument("--no-tb", action="store_true", help="skip torch-tb-profiler (slow)")
    parser.add_argument("--only", help="only traces whose name contains this")
    parser.add_argument(
        "--scale-mb", type=int, nargs="+", help="synthetic sizes, MB (default 512 1024)"
    )
    args = parser.parse_args(argv)
    repeat = args.repeat or 3
    traces = sorted(TRACES.glob("*.json.gz"))
    if args.only or args.quick:
        only = args.only or LARGE
        traces = [t for t in traces if only in t.name]
    if args.quick:
        args.no_hta = args.no_tb = args.no_scale = True
    if not traces:
        print(f"error: no traces in {TRACES}", file=sys.stderr)
        return 2
    hta_python = None if args.no_hta else ensure_peers_venv()
    compile_package()
    print(f"machine: {os.cpu_count()} CPUs; best wall of {repeat} run(s) per tool")
    print_trace_table(bench_traces(traces, repeat, hta_python, tb=not args.no_tb))
    if not args.no_scale:
        sizes = args.scale_mb or [512, 1024]
        with tempfile.TemporaryDirectory(prefix="pd-bench-") as folder:
            print_scale_table(bench_scale(sizes, Path(folder)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
