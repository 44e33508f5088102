"""What ``pipeline-doctor profile`` costs a script, next to TraceML 0.5.0 on the same script.

Three figures, each from paired, interleaved runs of bench/overhead_workload.py (plain
``python``, under ``python -m probe profile`` with its defaults -- sampler at 10 Hz and the
torch.profiler window on steps 3-5 -- and under ``traceml run``), so load from other work
on the machine hits every column alike; each figure is the median over repeats:

- **per step**: a tiny CPU step (Linear(8, 1), batch 4), the median step time over
  ``--tiny-steps`` steps minus the plain run's -- what the hooks add to each step;
- **fixed per launch**: the wall time of a whole 20-step tiny run minus the plain run's --
  start-up, the run folder, the end (parquet copies, TraceML's aggregator);
- **on a realistic step**: an MLP step of ~50 ms on one thread, median step time over the
  plain run's.

Targets (issue 17): at most 50 us per step, at most 1 s fixed, within 1 % on a 50 ms step.
TraceML runs from its own venv (bench/.venv-traceml: ``python3 -m venv``, ``pip install
torch==2.13.0``, then ``pip install traceml-ai==0.5.0``); without it the column is skipped.

    .venv/bin/python bench/bench_profile_overhead.py [--repeats 5] [--tiny-steps 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "bench" / "overhead_workload.py"
TRACEML = ROOT / "bench" / ".venv-traceml" / "bin" / "traceml"
TARGETS = {"per_step_us": 50.0, "fixed_s": 1.0, "realistic_ratio": 1.01}


def _command(tool: str, kind: str, steps: int, runs_dir: Path) -> list[str]:
    work = [str(WORKLOAD), kind, str(steps)]
    if tool == "plain":
        return [sys.executable, *work]
    if tool == "probe":
        return [sys.executable, "-m", "probe", "profile", "--runs-dir", str(runs_dir), *work]
    return [str(TRACEML), "run", "--mode", "summary", work[0], "--args", *work[1:]]


def _run(tool: str, kind: str, steps: int, runs_dir: Path) -> tuple[dict[str, float], float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if tool == "traceml":
        env["BENCH_TRACEML"] = "1"
    began = time.perf_counter()
    done = subprocess.run(
        _command(tool, kind, steps, runs_dir),
        env=env,
        cwd=runs_dir,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.perf_counter() - began
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{tool} {kind} failed ({done.returncode}): {done.stderr[-800:]}")
    return json.loads(lines[-1].removeprefix("BENCH ")), wall


def measure(repeats: int, tiny_steps: int, realistic_steps: int) -> dict[str, dict[str, list]]:
    tools = ["plain", "probe"] + (["traceml"] if TRACEML.exists() else [])
    if "traceml" not in tools:
        print(f"TraceML column skipped: {TRACEML} is absent (see this file's docstring)")
    figures: dict[str, dict[str, list]] = {
        t: {"tiny_ms": [], "tiny_cpu_ms": [], "launch_s": [], "real_ms": [], "real_cpu_ms": []}
        for t in tools
    }
    with tempfile.TemporaryDirectory() as scratch:
        runs_dir = Path(scratch)
        for repeat in range(repeats):
            order = tools[repeat % len(tools) :] + tools[: repeat % len(tools)]
            for tool in order:  # rotated each repeat: no tool always runs first
                tiny, _ = _run(tool, "tiny", tiny_steps, runs_dir)
                _, launch = _run(tool, "tiny", 20, runs_dir)
                real, _ = _run(tool, "realistic", realistic_steps, runs_dir)
                figures[tool]["tiny_ms"].append(tiny["median_ms"])
                figures[tool]["launch_s"].append(launch)
                figures[tool]["real_ms"].append(real["median_ms"])
                figures[tool]["tiny_cpu_ms"].append(tiny["cpu_median_ms"])
                figures[tool]["real_cpu_ms"].append(real["cpu_median_ms"])
            print(f"repeat {repeat + 1}/{repeats} done", flush=True)
    return figures


def summarise(figures: dict[str, dict[str, list]]) -> dict[str, dict[str, float]]:
    """Per tool: each figure paired with the plain run of the same repeat, then the median."""
    plain = figures["plain"]
    out: dict[str, dict[str, float]] = {
        "plain": {
            "tiny_step_us": statistics.median(plain["tiny_ms"]) * 1e3,
            "launch_s": statistics.median(plain["launch_s"]),
            "real_step_ms": statistics.median(plain["real_ms"]),
        }
    }
    for tool, values in figures.items():
        if tool == "plain":
            continue
        pairs = range(len(plain["tiny_ms"]))
        out[tool] = {
            "per_step_us": statistics.median(
                (values["tiny_ms"][i] - plain["tiny_ms"][i]) * 1e3 for i in pairs
            ),
            "fixed_s": statistics.median(
                values["launch_s"][i] - plain["launch_s"][i] for i in pairs
            ),
            "realistic_ratio": statistics.median(
                values["real_ms"][i] / plain["real_ms"][i] for i in pairs
            ),
            "per_step_cpu_us": statistics.median(
                (values["tiny_cpu_ms"][i] - plain["tiny_cpu_ms"][i]) * 1e3 for i in pairs
            ),
            "realistic_cpu_ratio": statistics.median(
                values["real_cpu_ms"][i] / plain["real_cpu_ms"][i] for i in pairs
            ),
        }
    return out


def table(summary: dict[str, dict[str, float]], repeats: int) -> str:
    plain = summary["plain"]
    rows = [
        f"plain python: tiny step {plain['tiny_step_us']:.0f} us, 20-step launch "
        f"{plain['launch_s']:.2f} s, realistic step {plain['real_step_ms']:.1f} ms "
        f"(medians of {repeats} repeats)",
        "",
        "| | per step added (tiny CPU step) | same, thread CPU time | fixed per launch | "
        "realistic step, ratio | same, thread CPU time |",
        "|---|---|---|---|---|---|",
        f"| target | <= {TARGETS['per_step_us']:.0f} us | | <= {TARGETS['fixed_s']:.0f} s | "
        f"<= {TARGETS['realistic_ratio']:.2f} | |",
    ]
    names = {"probe": "pipeline-doctor profile", "traceml": "TraceML 0.5.0 (traceml run)"}
    for tool, name in names.items():
        if tool in summary:
            s = summary[tool]
            rows.append(
                f"| {name} | {s['per_step_us']:+.0f} us | {s['per_step_cpu_us']:+.0f} us | "
                f"{s['fixed_s']:+.2f} s | {s['realistic_ratio']:.3f} | "
                f"{s['realistic_cpu_ratio']:.3f} |"
            )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny-steps", type=int, default=2000)
    parser.add_argument("--realistic-steps", type=int, default=40)
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    figures = measure(args.repeats, args.tiny_steps, args.realistic_steps)
    summary = summarise(figures)
    if args.json:
        args.json.write_text(json.dumps({"raw": figures, "summary": summary}, indent=2))
    print(table(summary, args.repeats))


if __name__ == "__main__":
    main()
