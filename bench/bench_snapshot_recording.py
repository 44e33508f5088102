"""What recording CUDA memory snapshots costs the reference trainer (issue 20).

Three runs of the same config, the same steps: allocator history off, on with
``stacks="python"``, on with ``stacks="all"`` (C++ frames too), over the window of steps
``--start`` .. ``--start + --window - 1``. History costs on the host, at every allocation
(a stack is captured), so the figure is the wall-clock interval between step records
(``wall_time``), beside the device step time (CUDA events), which a host-side cost only
moves once the GPU waits for the host. The window's first step (history starting) and the
step after the first dump are left out; the dumps themselves, which run between steps, are
timed by the recorder (its run notes: size and seconds of each file). torchtitan saw
461 s dumps with C++ stacks against 4 s with Python ones (issue 20).

    .venv/bin/python bench/bench_snapshot_recording.py [--steps 16] [--start 5] [--window 8]
        [--set model.size=gpu]

Needs CUDA (on CPU no snapshot is recorded: the runs' notes say so); exit 2 without it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnostics.runs import RunFolder  # noqa: E402
from probe.memory_snapshots import DUMP_NOTE  # noqa: E402

VARIANTS = ("off", "python", "all")


def window_costs(
    wall_times: dict[int, float], device_ms: dict[int, float], start: int, window: int
) -> dict[str, float | None]:
    """Median wall interval and device step time of the window's steady steps: every step
    of the window but its first (history starts in it) and the one after it (the first
    dump ran just before it). An interval is a step's wall_time minus the one before."""
    steps = [s for s in range(start + 2, start + window) if s in wall_times and s - 1 in wall_times]
    intervals = [(wall_times[s] - wall_times[s - 1]) * 1e3 for s in steps]
    devices = [device_ms[s] for s in steps if device_ms.get(s) is not None]
    return {
        "wall_ms": statistics.median(intervals) if intervals else None,
        "device_ms": statistics.median(devices) if devices else None,
    }


def dump_costs(notes: tuple[str, ...]) -> list[tuple[str, float, float]]:
    """(file, MiB, seconds) of each dump a run's notes name."""
    found = [DUMP_NOTE.fullmatch(note) for note in notes]
    return [(m["name"], float(m["mib"]), float(m["s"])) for m in found if m]


def run_variant(variant: str, runs_dir: Path, args: argparse.Namespace) -> RunFolder:
    command = [sys.executable, "-m", "trainer", "run", "--device", "cuda"]
    command += ["--steps", str(args.steps), "--runs-dir", str(runs_dir)]
    settings = [
        "train.pretrain_steps=2",
        "train.checkpoint_every=1000",
        "profiler.enabled=false",
        f"instruments.memory_snapshot_steps={0 if variant == 'off' else args.window}",
        f"instruments.memory_snapshot_start={args.start}",
        f"instruments.memory_snapshot_stacks={'python' if variant == 'off' else variant}",
        *args.set,
    ]
    for item in settings:
        command += ["--set", item]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{variant}: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return RunFolder(Path(lines[-1]))


def measure(run: RunFolder, args: argparse.Namespace) -> dict[str, Any]:
    steps = run.steps()
    walls = dict(zip(steps["step"].to_list(), steps["wall_time"].to_list(), strict=True))
    device = dict(zip(steps["step"].to_list(), steps["step_time_ms"].to_list(), strict=True))
    return {
        **window_costs(walls, device, args.start, args.window),
        "dumps": dump_costs(run.manifest().notes),
    }


def _fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    off = results["off"]["wall_ms"]
    lines = [
        "| history | wall ms/step (window median) | ÷ off | device ms/step | dumps (MiB, s) |",
        "|---|---:|---:|---:|---|",
    ]
    for variant, got in results.items():
        ratio = got["wall_ms"] / off if got["wall_ms"] and off else None
        dumps = ", ".join(f"{name} {mib:.1f} MiB {s:.2f} s" for name, mib, s in got["dumps"])
        lines.append(
            f"| {variant} | {_fmt(got['wall_ms'])} | {_fmt(ratio, 3)} | "
            f"{_fmt(got['device_ms'])} | {dumps or '—'} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="fine-tuning steps per run")
    parser.add_argument("--start", type=int, default=5, help="first step with history")
    parser.add_argument("--window", type=int, default=8, help="steps with history")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--runs-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            "bench_snapshot_recording: needs CUDA (no snapshot is recorded on CPU)", file=sys.stderr
        )
        return 2
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="snapshot-cost-"))
    results = {variant: measure(run_variant(variant, runs_dir, args), args) for variant in VARIANTS}
    print(f"memory snapshot recording, steps {args.start}..{args.start + args.window - 1}:")
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
