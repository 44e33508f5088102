"""What ``pipeline-doctor profile`` costs a script, next to TraceML 0.5.0 on the same script.

Three figures, each from paired, interleaved runs of bench/overhead_workload.py (plain
``python``, under ``python -m probe profile`` with its defaults -- sampler at 10 Hz and the
torch.profiler window on steps 3-5 -- and under ``traceml run``), so load from other work
on the machine hits every column alike; each figure is the median over repeats:

- **per step**: a tiny CPU step (Linear(8, 1), batch 4), the median step time over
  ``--tiny-steps`` steps minus the plain run's -- what the hooks add to each step;
- **fixed per launch**: the wall time of a whole 20-step tiny run minus the plain run's --
  start-up, the run folder, the end (parquet copies, TraceML's aggregator);
- **on a realistic step**: an MLP step of ~20-50 ms on one thread, median step time over
  the plain run's.

Each repeat also runs the plain script a second time (``plain again``): its figures against
the first plain run are this host's noise floor, measured in the same rotation. On the
realistic step that floor is wide -- one process's matmuls run several per cent faster or
slower than the next one's, whatever wraps them -- so the table gives each ratio's
interquartile range beside it, and a ratio inside the control's range is not an overhead.
A fourth figure is free of that process-to-process spread: the hooks alone, installed and
removed between interleaved 10-step blocks of the realistic step in one process
(``--hook-rounds``), the median hooked step over the median bare one.

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
sys.path.insert(0, str(ROOT))

from bench import overhead_workload  # noqa: E402

WORKLOAD = ROOT / "bench" / "overhead_workload.py"
TRACEML = ROOT / "bench" / ".venv-traceml" / "bin" / "traceml"
TARGETS = {"per_step_us": 50.0, "fixed_s": 1.0, "realistic_ratio": 1.01}


def _command(tool: str, kind: str, steps: int, runs_dir: Path) -> list[str]:
    work = [str(WORKLOAD), kind, str(steps)]
    if tool in ("plain", "plain_again"):
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
    tools = ["plain", "plain_again", "probe"] + (["traceml"] if TRACEML.exists() else [])
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


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    low, middle, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, middle, high


def summarise(figures: dict[str, dict[str, list]]) -> dict[str, dict[str, float]]:
    """Per tool: each figure paired with the plain run of the same repeat, then the median
    and the interquartile range of those pairs."""
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
        paired = {
            "per_step_us": [(values["tiny_ms"][i] - plain["tiny_ms"][i]) * 1e3 for i in pairs],
            "fixed_s": [values["launch_s"][i] - plain["launch_s"][i] for i in pairs],
            "realistic_ratio": [values["real_ms"][i] / plain["real_ms"][i] for i in pairs],
            "per_step_cpu_us": [
                (values["tiny_cpu_ms"][i] - plain["tiny_cpu_ms"][i]) * 1e3 for i in pairs
            ],
            "realistic_cpu_ratio": [
                values["real_cpu_ms"][i] / plain["real_cpu_ms"][i] for i in pairs
            ],
        }
        out[tool] = {}
        for name, series in paired.items():
            low, middle, high = _quartiles(series)
            out[tool] |= {name: middle, f"{name}_q1": low, f"{name}_q3": high}
    return out


def hooks_in_process(rounds: int) -> dict[str, float]:
    """The realistic step with the probe's hooks installed against the same step bare, in
    one process: ``rounds`` pairs of 10-step blocks, in alternating order."""
    import torch

    from diagnostics.runs import RunWriter
    from probe.hooks import Hooks
    from probe.profiler import ProfilerWindow
    from probe.session import Session

    torch.set_num_threads(1)
    model, x, y = overhead_workload.build("realistic")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def block() -> list[float]:
        times = []
        for _ in range(10):
            began = time.perf_counter()
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            times.append(time.perf_counter() - began)
        return times

    with tempfile.TemporaryDirectory() as scratch:
        writer = RunWriter.create(Path(scratch), {"scenario": None}, {}, run_id="hooks")
        session = Session(writer.path, window=ProfilerWindow(enabled=False), sample_hz=0)
        hooks = Hooks(session, {}, None)
        session.start()
        block()  # warm-up
        bare: list[float] = []
        hooked: list[float] = []
        for index in range(rounds):
            for with_hooks in (True, False) if index % 2 else (False, True):
                if with_hooks:
                    hooks.install()
                    hooked += block()
                    hooks.uninstall()
                else:
                    bare += block()
        session.close()
    return {
        "bare_ms": statistics.median(bare) * 1e3,
        "hooked_ms": statistics.median(hooked) * 1e3,
        "ratio": statistics.median(hooked) / statistics.median(bare),
    }


def table(summary: dict[str, dict[str, float]], repeats: int, hooks: dict | None) -> str:
    plain = summary["plain"]

    def spread(s: dict[str, float], name: str, form: str) -> str:
        return f"{s[name]:{form}} ({s[name + '_q1']:{form}} to {s[name + '_q3']:{form}})"

    rows = [
        f"plain python: tiny step {plain['tiny_step_us']:.0f} us, 20-step launch "
        f"{plain['launch_s']:.2f} s, realistic step {plain['real_step_ms']:.1f} ms "
        f"(medians of {repeats} repeats; in brackets the interquartile range of the pairs)",
        "",
        "| | per step added (tiny CPU step) | same, thread CPU time | fixed per launch | "
        "realistic step, ratio | same, thread CPU time |",
        "|---|---|---|---|---|---|",
        f"| target | <= {TARGETS['per_step_us']:.0f} us | | <= {TARGETS['fixed_s']:.0f} s | "
        f"<= {TARGETS['realistic_ratio']:.2f} | |",
    ]
    names = {
        "probe": "pipeline-doctor profile",
        "traceml": "TraceML 0.5.0 (traceml run)",
        "plain_again": "plain again (the noise floor)",
    }
    for tool, name in names.items():
        if tool in summary:
            s = summary[tool]
            rows.append(
                f"| {name} | {spread(s, 'per_step_us', '+.0f')} us | "
                f"{spread(s, 'per_step_cpu_us', '+.0f')} us | {spread(s, 'fixed_s', '+.2f')} s | "
                f"{spread(s, 'realistic_ratio', '.3f')} | "
                f"{spread(s, 'realistic_cpu_ratio', '.3f')} |"
            )
    if hooks is not None:
        rows += [
            "",
            f"the hooks alone on the realistic step, in one process: {hooks['hooked_ms']:.2f} ms "
            f"hooked against {hooks['bare_ms']:.2f} ms bare, ratio {hooks['ratio']:.3f}",
        ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny-steps", type=int, default=2000)
    parser.add_argument("--realistic-steps", type=int, default=40)
    parser.add_argument(
        "--hook-rounds", type=int, default=30, help="in-process block pairs (0: skip)"
    )
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    figures = measure(args.repeats, args.tiny_steps, args.realistic_steps)
    summary = summarise(figures)
    hooks = hooks_in_process(args.hook_rounds) if args.hook_rounds > 0 else None
    if args.json:
        args.json.write_text(
            json.dumps({"raw": figures, "summary": summary, "hooks": hooks}, indent=2)
        )
    print(table(summary, args.repeats, hooks))


if __name__ == "__main__":
    main()
