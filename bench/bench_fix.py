"""Benchmark: fix and verify, slow-loader against slow-loader with its own finding's patch.

1. Runs the ``slow-loader`` scenario with the reference trainer and analyses the run folder.
2. Takes the ``too-few-workers`` finding's ``fix.config_patch`` (the worker count the rule
   derives from the measured load time, compute time and cores) and re-runs the same
   scenario with it as ``--set`` overrides.
3. Alternates unfixed and fixed runs for ``--rounds`` rounds (so both see the same drift in
   the machine's load) and prints a table of median and p95 step time, data-wait share and
   findings, and the ratio of median step times.

Both runs use one torch thread by default (``--threads 1``): the comparison is about the
loader, and on a shared 2-core machine a second intra-op thread makes compute time swing
far more than the loader does (``--threads auto`` keeps the trainer's own choice).

    .venv/bin/python bench/bench_fix.py                  # 40 steps, 1 round (~1-2 min)
    .venv/bin/python bench/bench_fix.py --steps 60 --rounds 3
    .venv/bin/python bench/bench_fix.py --script --rounds 3   # a user's script instead

``--script`` does the same for a user's own script under ``pipeline-doctor profile``
(tests/scripts/slow_loader.py: 8 samples a batch, each sleeping 5 ms in ``__getitem__``, a
3072-wide MLP, ``num_workers=0``), re-run with the finding's patch as ``--override``: the
speed-up that tests/probe/test_rerun_with_fix.py proves the mechanism of.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from diagnostics.analyze import analyze  # noqa: E402
from diagnostics.result import AnalysisResult  # noqa: E402

RULE = "too-few-workers"
SCENARIO = "slow-loader"
SCRIPT = REPO_ROOT / "tests" / "scripts" / "slow_loader.py"
SCRIPT_ARGS = ["--batch-size", "8", "--sleep-ms", "5", "--hidden", "3072"]


def patch_args(patch: dict[str, Any], flag: str = "--set") -> list[str]:
    """The patch as the trainer's ``--set`` or the wrapper's ``--override`` arguments."""
    args: list[str] = []
    for key, value in patch.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        args += [flag, f"{key}={text}"]
    return args


def run(runs_dir: Path, steps: int, threads: str, extra: list[str]) -> AnalysisResult:
    args = [
        sys.executable, "-m", "trainer", "run", "--scenario", SCENARIO, "--device", "cpu",
        "--steps", str(steps), "--runs-dir", str(runs_dir),
        "--set", "train.pretrain_steps=0", "--set", "train.checkpoint_every=100000",
        "--set", "profiler.enabled=false",
    ]  # fmt: skip
    if threads != "auto":
        args += ["--set", f"runtime.threads={threads}"]
    done = subprocess.run(args + extra, cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: trainer run failed: {done.stderr.strip().splitlines()[-1:]}")
    return analyze(done.stdout.strip().splitlines()[-1])


def run_script(runs_dir: Path, steps: int, threads: str, extra: list[str]) -> AnalysisResult:
    """slow_loader.py under ``python -m probe profile`` (no trace), ``extra`` its overrides."""
    import os

    env = dict(os.environ)
    if threads != "auto":
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    args = [
        sys.executable, "-m", "probe", "profile", "--runs-dir", str(runs_dir), "--no-trace",
        *extra, str(SCRIPT), "--steps", str(steps), *SCRIPT_ARGS,
    ]  # fmt: skip
    done = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"error: profiled script failed: {done.stderr.strip().splitlines()[-1:]}")
    return analyze(done.stdout.strip().splitlines()[-1])


def step_stats(result: AnalysisResult) -> dict[str, float]:
    steps = result.run.steps.slice(1)  # the first step forks the workers
    times = sorted(steps["step_time_ms"].to_list())
    waits = steps["data_wait_ms"].to_list()
    return {
        "median_ms": statistics.median(times),
        "p95_ms": times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))],
        "wait_share_pct": 100.0 * sum(waits) / sum(times),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", default="1", help="torch threads for both runs, or auto")
    parser.add_argument(
        "--script", action="store_true", help="a user's script under pipeline-doctor profile"
    )
    args = parser.parse_args(argv)
    start, flag = (run_script, "--override") if args.script else (run, "--set")
    subject = f"{SCRIPT.name} (pipeline-doctor profile)" if args.script else SCENARIO

    with tempfile.TemporaryDirectory(prefix="bench_fix_") as tmp:
        runs_dir = Path(tmp)
        first = start(runs_dir, args.steps, args.threads, [])
        finding = next((f for f in first.findings if f.rule == RULE), None)
        if finding is None or not finding.fix.config_patch:
            print(f"{RULE} did not fire on {subject}: nothing to fix", file=sys.stderr)
            return 1
        patch = finding.fix.config_patch
        unfixed, fixed = [first], []
        for round_no in range(args.rounds):
            if round_no:
                unfixed.append(start(runs_dir, args.steps, args.threads, []))
            fixed.append(start(runs_dir, args.steps, args.threads, patch_args(patch, flag)))

    def summary(results: list[AnalysisResult]) -> dict[str, Any]:
        stats = [step_stats(r) for r in results]
        return {
            "median_ms": statistics.median(s["median_ms"] for s in stats),
            "p95_ms": statistics.median(s["p95_ms"] for s in stats),
            "wait_share_pct": statistics.median(s["wait_share_pct"] for s in stats),
            "fired": RULE in {f.rule for r in results for f in r.findings},
        }

    a, b = summary(unfixed), summary(fixed)
    ratio = a["median_ms"] / b["median_ms"]
    print(f"fix and verify: {subject}, {args.steps} steps x {args.rounds} round(s), "
          f"torch threads {args.threads}")  # fmt: skip
    print(f"patch from the {RULE} finding: {patch} "
          f"(estimated saving {finding.estimated_saving_pct}%)")  # fmt: skip
    print()
    print("| run | median step (ms) | p95 step (ms) | data wait (% of step) | too-few-workers |")
    print("|---|---:|---:|---:|---|")
    for name, s in ((subject, a), (f"{subject} + patch", b)):
        print(
            f"| {name} | {s['median_ms']:.1f} | {s['p95_ms']:.1f} | {s['wait_share_pct']:.1f} "
            f"| {'fires' if s['fired'] else 'gone'} |"
        )
    print()
    print(f"median step time ratio (unfixed / fixed): {ratio:.2f}x")
    measured_saving = 100.0 * (1 - 1 / ratio)
    print(f"measured saving {measured_saving:.1f}% vs estimated {finding.estimated_saving_pct}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
