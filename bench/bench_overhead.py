"""Instrument overhead: steady-state step time with instruments on vs off.

Runs the same config through the trainer CLI, alternating ``--instruments on`` and
``--instruments off`` (interleaved, so drift in machine load hits both alike), and compares
the median ``step_time_ms`` of the steady-state steps: after the first ``--warmup`` steps,
and outside the profiler's window (the ``profiled`` steps and the step that writes the
trace). Target: on/off within 3 %.

Step times are wall-clock, so on a machine shared with other work the per-repeat ratios
scatter; the median over interleaved repeats is the figure to quote, and the whole-run CPU
seconds (from ``getrusage`` of the finished child, workers included) are a second view
that other processes' load barely moves.

On CUDA (``--device cuda``) a step's time is device time from CUDA events, read back
without synchronising (probe/steps.py), with instruments on and off alike, so
"off" is the trainer with no profiler and no sampler, not a trainer with a different clock.
``--set model.size=cpu|gpu`` picks the size preset (the default ``auto`` follows the device).

    .venv/bin/python bench/bench_overhead.py [--repeats 3] [--steps 60] [--scenario healthy]
        [--device auto|cpu|cuda] [--set model.size=gpu]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnostics.runs import RunFolder  # noqa: E402


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(runs_dir: Path, instruments: str, args: argparse.Namespace) -> tuple[RunFolder, float]:
    """One run; with the CPU seconds it (and its DataLoader workers) consumed."""
    command = [
        sys.executable,
        "-m",
        "trainer",
        "run",
        "--scenario",
        args.scenario,
        "--steps",
        str(args.steps),
        "--device",
        args.device,
        "--runs-dir",
        str(runs_dir),
        "--instruments",
        instruments,
        "--set",
        "train.pretrain_steps=0",
        *[item for pair in args.set for item in ("--set", pair)],
    ]
    before = _children_cpu_s()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    cpu_s = _children_cpu_s() - before
    if result.returncode != 0:
        raise SystemExit(f"trainer failed ({instruments}):\n{result.stderr[-2000:]}")
    return RunFolder(result.stdout.strip().splitlines()[-1]), cpu_s


def steady_step_ms(run: RunFolder, warmup: int) -> tuple[float, int]:
    steps = run.steps()
    profiled = steps.filter(pl.col("profiled"))["step"].to_list()
    # the step after the window also pays for writing the trace file
    excluded = set(profiled) | {s + 1 for s in profiled}
    steady = steps.filter((pl.col("step") > warmup) & ~pl.col("step").is_in(sorted(excluded)))
    return float(steady["step_time_ms"].median()), steady.height


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--scenario", default="healthy")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        for repeat in range(1, args.repeats + 1):
            # alternate which goes first, so neither always runs on a warmer machine
            order = ("on", "off") if repeat % 2 else ("off", "on")
            medians, cpu = {}, {}
            for mode in order:
                run, cpu[mode] = run_once(Path(tmp), mode, args)
                medians[mode], counted = steady_step_ms(run, args.warmup)
                manifest = run.manifest()
                device = manifest.environment.get("device")
                size = manifest.environment.get("model_size", "?")
                profiler = manifest.config["profiler"]
                wait, warmup, active = profiler["wait"], profiler["warmup"], profiler["active"]
            ratio = medians["on"] / medians["off"]
            rows.append((repeat, medians["on"], medians["off"], ratio, cpu["on"], cpu["off"]))
            print(
                f"repeat {repeat}: on {medians['on']:.2f} ms, off {medians['off']:.2f} ms",
                file=sys.stderr,
            )

    clock = "CUDA events, no per-step sync" if device == "cuda" else "host clock"
    print(
        f"\nInstrument overhead: {args.scenario}, {args.steps} steps, device {device}, "
        f"model.size {size}, median step time of {counted} steady steps per run\n\n"
        f"on = profiler window (wait {wait}, warmup {warmup}, active {active}) + system "
        f"sampler + step clock; off = step clock only ({clock}). Steady steps: after "
        f"{args.warmup} warm-up steps, outside the profiler window and the step after it "
        "(which writes the trace): what the profiler leaves behind once its window closes.\n"
    )
    print(
        "| repeat | step on (ms) | step off (ms) | step on / off "
        "| run CPU on (s) | run CPU off (s) | CPU on / off |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for repeat, on, off, ratio, cpu_on, cpu_off in rows:
        print(
            f"| {repeat} | {on:.2f} | {off:.2f} | {ratio:.3f} "
            f"| {cpu_on:.1f} | {cpu_off:.1f} | {cpu_on / cpu_off:.3f} |"
        )
    on, off, ratio, cpu_on, cpu_off = (statistics.median(r[i] for r in rows) for i in range(1, 6))
    cpu_ratio = statistics.median(r[4] / r[5] for r in rows)
    print(
        f"| median | {on:.2f} | {off:.2f} | {ratio:.3f} | {cpu_on:.1f} | {cpu_off:.1f} "
        f"| {cpu_ratio:.3f} |"
    )
    # noise from other processes only ever adds time: the fastest run of each mode is the
    # least disturbed estimate of what that mode costs
    best_on, best_off = min(r[1] for r in rows), min(r[2] for r in rows)
    best_cpu_on, best_cpu_off = min(r[4] for r in rows), min(r[5] for r in rows)
    print(
        f"| best | {best_on:.2f} | {best_off:.2f} | {best_on / best_off:.3f} "
        f"| {best_cpu_on:.1f} | {best_cpu_off:.1f} | {best_cpu_on / best_cpu_off:.3f} |"
    )
    for label, value in (("median of ratios", ratio), ("best of each mode", best_on / best_off)):
        # a target on overhead: faster with instruments on is within it, not outside
        verdict = "within" if value - 1 <= 0.03 else "OUTSIDE"
        print(
            f"\nsteady-state step time overhead ({label}) {100 * (value - 1):+.1f} % "
            f"({verdict} the 3 % target)",
            end="",
        )
    print()
    print(
        f"whole-run CPU time (trainer + workers, incl. start-up and the profiled window) "
        f"{100 * (cpu_ratio - 1):+.1f} %"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
