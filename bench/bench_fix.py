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
    .venv/bin/python bench/bench_fix.py --script run_clm --steps 30 --rounds 3

``--script`` does the same for a user's own script under ``pipeline-doctor profile``,
re-run with the finding's patch as ``--override``, the script unedited:

- ``slow_loader`` (the default): tests/scripts/slow_loader.py, 8 samples a batch, each
  sleeping 5 ms in ``__getitem__``, a 3072-wide MLP, ``num_workers=0``; the speed-up that
  tests/probe/test_rerun_with_fix.py proves the mechanism of.
- ``run_clm``: transformers' public run_clm.py, unmodified (tests/scripts/third_party), with
  the HF Trainer's default ``dataloader_num_workers=0``: 2,048 rows of 16-token blocks a
  batch read from Arrow and collated on the training thread, a 1-layer 32-wide GPT-2 made
  from a config; tests/probe/test_hf_trainer_rerun.py proves the mechanism.
"""

from __future__ import annotations

import argparse
import functools
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
SLOW_LOADER = REPO_ROOT / "tests" / "scripts" / "slow_loader.py"
RUN_CLM = REPO_ROOT / "tests" / "scripts" / "third_party" / "run_clm" / "run_clm.py"
SCRIPTS = ("slow_loader", "run_clm")


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


def script_command(name: str, steps: int, folder: Path) -> tuple[list[str], dict[str, str]]:
    """The script's path and arguments, and what its environment needs, made in ``folder``."""
    if name == "slow_loader":
        args = ["--steps", str(steps), "--batch-size", "8", "--sleep-ms", "5", "--hidden", "3072"]
        return [str(SLOW_LOADER), *args], {}
    from tests.probe.hf_fixtures import offline_env, write_run_clm_proof

    return [str(RUN_CLM), *write_run_clm_proof(folder, steps)], offline_env(folder)


def run_script(
    name: str, runs_dir: Path, steps: int, threads: str, extra: list[str]
) -> AnalysisResult:
    """The script under ``python -m probe profile`` (no trace), ``extra`` its overrides."""
    import os

    command, script_env = script_command(name, steps, runs_dir)
    env = {**os.environ, **script_env}
    if threads != "auto":
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    args = [
        sys.executable, "-m", "probe", "profile", "--runs-dir", str(runs_dir), "--no-trace",
        *extra, *command,
    ]  # fmt: skip
    done = subprocess.run(args, cwd=runs_dir, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"error: profiled script failed: {done.stderr.strip().splitlines()[-1:]}")
    return analyze(done.stdout.strip().splitlines()[-1])


def step_stats(result: AnalysisResult) -> dict[str, float]:
    steps = result.run.steps.slice(1)  # the first step forks the workers
    times = sorted(steps["step_time_ms"].to_list())
    # a step whose batch the loader did not hand over (an HF Trainer's last) has no wait
    timed = steps.drop_nulls("data_wait_ms")
    waits, waited_steps = timed["data_wait_ms"].to_list(), timed["step_time_ms"].to_list()
    return {
        "median_ms": statistics.median(times),
        "p95_ms": times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))],
        "wait_share_pct": 100.0 * sum(waits) / sum(waited_steps),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", default="1", help="torch threads for both runs, or auto")
    parser.add_argument(
        "--script",
        nargs="?",
        const="slow_loader",
        choices=SCRIPTS,
        help="a user's script under pipeline-doctor profile (default slow_loader)",
    )
    args = parser.parse_args(argv)
    if args.script:
        start, flag = functools.partial(run_script, args.script), "--override"
        subject = f"{args.script}.py (pipeline-doctor profile)"
    else:
        start, flag, subject = run, "--set", SCENARIO

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
