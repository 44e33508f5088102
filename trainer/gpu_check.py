"""The GPU check: every scenario at both sizes, each against the finding it must show.

``python -m trainer.gpu_check`` (what ``scripts/gpu_check.sh`` runs) trains every scenario
at the cpu and the gpu size preset, analyses each run, compares its findings with
``EXPECTED``, re-runs each fired finding's ``config_patch`` (the finding must go; the fp32
re-run must be faster), runs the ``gpu`` pytest marker and ``bench/bench_overhead.py`` at
both sizes, measures what recording memory snapshots costs (on CUDA,
``bench/bench_snapshot_recording.py``: history off / python / all stacks), and writes one Markdown summary whose path it prints last. Exit code 0 when
every required check passed, 1 otherwise, 2 for bad arguments.

It needs no torch itself (the trainer runs in child processes, the analysis is
``diagnostics``), so its logic is tested on CPU with a tiny size; ``--device cpu`` runs the
same checks there, where the GPU-only expectations become "not required" with the reason.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZES = ("cpu", "gpu")
HIGH = {"high", "medium"}

# scenario -> the rule it exists to show (None: healthy, which must show no medium/high)
EXPECTED: dict[str, str | None] = {
    "healthy": None,
    "slow-loader": "too-few-workers",
    "no-pin-memory": "missing-pin-memory",
    "unstable": "unstable-gradients",
    "leak": "memory-leak",
    "small-batch": "batch-too-small",
    "fp32": "tensor-cores-unused",
    "per-sample-lookups": "per-sample-lookups",
    "unpruned-vocab": "unused-embedding-rows",
}

# (device, size, scenario) -> why its expectation cannot be required there (reported only)
NOT_REQUIRED: dict[tuple[str, str, str], str] = {
    ("cuda", "cpu", "healthy"): "the cpu size keeps a data-centre GPU ~3 % busy "
    "(h200-default/gpu-healthy): starvation findings are true there",
    ("cuda", "cpu", "no-pin-memory"): "batches of a few KB at the cpu size: pinning cannot "
    "matter (h200-default/gpu-no-pin-memory)",
    ("cuda", "cpu", "fp32"): "GEMMs of 32 tokens x 192: too small for Tensor Cores to matter",
    ("cpu", "cpu", "no-pin-memory"): "no host-to-device copy on CPU",
    ("cpu", "gpu", "no-pin-memory"): "no host-to-device copy on CPU",
    ("cpu", "cpu", "fp32"): "no Tensor Cores on a CPU",
    ("cpu", "gpu", "fp32"): "no Tensor Cores on a CPU",
}


@dataclass(frozen=True)
class Expectation:
    scenario: str
    rule: str | None
    required: bool
    why: str = ""

    def describe(self) -> str:
        return f"shows {self.rule}" if self.rule else "no medium or high finding"


def expectation(scenario: str, device: str, size: str) -> Expectation:
    reason = NOT_REQUIRED.get((device, size, scenario))
    return Expectation(scenario, EXPECTED[scenario], reason is None, reason or "")


def meets(expected: Expectation, findings: Sequence[tuple[str, str]]) -> bool:
    """``findings``: (rule, severity) pairs of one run."""
    if expected.rule is None:
        return not any(severity in HIGH for _, severity in findings)
    return expected.rule in {rule for rule, _ in findings}


@dataclass(frozen=True)
class RunResult:
    scenario: str
    size: str
    run_dir: str
    status: str
    findings: tuple[tuple[str, str], ...]
    patches: dict[str, dict[str, Any] | None]
    p50_ms: float | None
    gpu_util_pct: float | None
    error: str = ""


@dataclass(frozen=True)
class Check:
    what: str
    ok: bool | None  # None: reported, not required
    detail: str = ""


@dataclass
class Summary:
    device: str
    sizes: tuple[str, ...]
    runs: list[tuple[RunResult, Expectation]] = field(default_factory=list)
    fixes: list[tuple[RunResult, RunResult, str, Check]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    overhead: dict[str, str] = field(default_factory=dict)
    snapshot_cost: list[str] = field(default_factory=list)  # the bench's table lines
    started: float = field(default_factory=time.monotonic)

    @property
    def passed(self) -> bool:
        return all(check.ok is not False for check in self.checks)


# --- running ----------------------------------------------------------------------------


def train(
    scenario: str,
    size: str,
    args: argparse.Namespace,
    *,
    patch: dict[str, Any] | None = None,
    parent: str | None = None,
) -> tuple[Path | None, str]:
    """One trainer run; (run folder or None, error text)."""
    command = [sys.executable, "-m", "trainer", "run", "--scenario", scenario]
    command += ["--device", args.device, "--steps", str(args.steps)]
    command += ["--runs-dir", str(args.runs_dir), "--set", f"model.size={size}"]
    for item in args.set:
        command += ["--set", item]
    if patch:
        command += ["--patch-json", json.dumps(patch)]
    if parent:
        command += ["--parent-run-id", parent]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        return None, (result.stderr.strip().splitlines() or ["no output"])[-1]
    return Path(lines[-1]), ""


def analyse(scenario: str, size: str, run_dir: Path | None, error: str) -> RunResult:
    if run_dir is None:
        return RunResult(scenario, size, "", "failed", (), {}, None, None, error)
    from diagnostics.analyze import analyze
    from diagnostics.runs import RunFolder

    status = RunFolder(run_dir).status().status
    result = analyze(run_dir)
    findings = tuple((f.rule, str(f.severity)) for f in result.findings)
    patches = {f.rule: f.fix.config_patch for f in result.findings}
    step = result.summary.get("step_time_ms") or {}
    return RunResult(
        scenario,
        size,
        str(run_dir),
        status,
        findings,
        patches,
        step.get("p50"),
        result.summary.get("gpu_utilization_pct"),
    )


def check_run(run: RunResult, expected: Expectation) -> Check:
    what = f"{run.scenario} @ {run.size}: {expected.describe()}"
    if run.status != "completed":
        return Check(what, False, f"run {run.status}: {run.error}")
    ok = meets(expected, run.findings)
    if not expected.required:
        return Check(what, None, f"{'holds' if ok else 'does not hold'}; {expected.why}")
    return Check(what, ok, "" if ok else f"found {_findings_text(run.findings)}")


def check_fix(before: RunResult, after: RunResult, rule: str) -> Check:
    what = f"{before.scenario} @ {before.size}: {rule} gone after its patch"
    if after.status != "completed":
        return Check(what, False, f"re-run {after.status}: {after.error}")
    gone = rule not in {r for r, _ in after.findings}
    detail = "" if gone else f"still fires: {_findings_text(after.findings)}"
    ok = gone
    if before.scenario == "fp32":  # the patch turns AMP on: the point is the speed
        faster = (
            before.p50_ms is not None and after.p50_ms is not None and after.p50_ms < before.p50_ms
        )
        ok = ok and faster
        detail += f" p50 {_ms(before.p50_ms)} -> {_ms(after.p50_ms)}" + (
            "" if faster else " NOT faster"
        )
    return Check(what, ok, detail.strip())


def run_scenarios(summary: Summary, args: argparse.Namespace) -> None:
    for size in summary.sizes:
        for scenario in args.scenarios:
            run_dir, error = train(scenario, size, args)
            run = analyse(scenario, size, run_dir, error)
            expected = expectation(scenario, summary.device, size)
            summary.runs.append((run, expected))
            summary.checks.append(check_run(run, expected))
            print(
                f"[{_elapsed(summary)}] {summary.checks[-1].what}: {_verdict(summary.checks[-1])}"
            )
            rule = expected.rule
            if (
                size in args.fix_sizes
                and rule is not None
                and expected.required
                and run.patches.get(rule)
            ):
                patch = run.patches[rule]
                assert patch is not None
                fixed_dir, error = train(
                    scenario, size, args, patch=patch, parent=Path(run.run_dir).name
                )
                fixed = analyse(scenario, size, fixed_dir, error)
                check = check_fix(run, fixed, rule)
                summary.fixes.append((run, fixed, json.dumps(patch), check))
                summary.checks.append(check)
                print(f"[{_elapsed(summary)}] {check.what}: {_verdict(check)}")


GPU_TEST_FILES = (
    "tests/trainer/test_gpu.py",
    # memory snapshots recorded by the trainer and the wrapper (healthy, leak, forced OOM)
    "tests/trainer/test_gpu_memory_snapshots.py",
    "tests/diagnostics/snapshot/test_gpu_snapshots.py",
)


def run_gpu_tests(summary: Summary) -> None:
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    result = subprocess.run([*command, *GPU_TEST_FILES], cwd=ROOT, capture_output=True, text=True)
    tail = (result.stdout.strip().splitlines() or ["no output"])[-1]
    summary.checks.append(Check("pytest -m gpu", result.returncode == 0, tail))
    print(f"[{_elapsed(summary)}] pytest -m gpu: {tail}")


# the bench's "| median | on | off | on/off | ..." row: the step-time ratio is column 4
OVERHEAD_LINE = re.compile(r"^\| median \| [0-9.]+ \| [0-9.]+ \| ([0-9.]+) \|", re.MULTILINE)


def run_overhead(summary: Summary, args: argparse.Namespace) -> None:
    for size in summary.sizes:
        command = [sys.executable, "bench/bench_overhead.py", "--device", args.device]
        command += ["--repeats", str(args.bench_repeats), "--steps", str(args.bench_steps)]
        command += ["--set", f"model.size={size}"]
        command += [a for item in args.user_set for a in ("--set", item)]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        match = OVERHEAD_LINE.search(result.stdout)
        if result.returncode != 0 or match is None:
            error = (result.stderr.strip().splitlines() or ["no output"])[-1]
            summary.checks.append(Check(f"overhead @ {size}", False, error))
            continue
        ratio = float(match.group(1))
        summary.overhead[size] = f"{ratio:.3f}"
        summary.checks.append(
            Check(
                f"overhead @ {size}: steady step on/off within 3 %", ratio <= 1.03, f"{ratio:.3f}"
            )
        )
        print(f"[{_elapsed(summary)}] overhead @ {size}: {ratio:.3f}")


def run_snapshot_cost(summary: Summary, args: argparse.Namespace) -> None:
    """Allocator history off / python / all stacks at the gpu size: reported, not required
    (nothing to compare it with yet)."""
    command = [sys.executable, "bench/bench_snapshot_recording.py", "--set", "model.size=gpu"]
    command += [a for item in args.user_set for a in ("--set", item)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    rows = [line for line in result.stdout.splitlines() if line.startswith("|")]
    if result.returncode != 0 or not rows:
        error = (result.stderr.strip().splitlines() or ["no output"])[-1]
        summary.checks.append(Check("memory snapshot recording cost", False, error))
        return
    summary.snapshot_cost = rows
    summary.checks.append(Check("memory snapshot recording cost", None, "measured"))
    print(f"[{_elapsed(summary)}] memory snapshot recording cost:", *rows, sep="\n")


# --- the summary --------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _findings_text(findings: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{rule}:{severity}" for rule, severity in findings) or "none"


def _verdict(check: Check) -> str:
    word = {True: "PASS", False: "FAIL", None: "reported"}[check.ok]
    return f"{word}{' (' + check.detail + ')' if check.detail else ''}"


def _elapsed(summary: Summary) -> str:
    return f"{time.monotonic() - summary.started:5.0f} s"


def render(summary: Summary) -> str:
    """The one Markdown summary: findings per scenario, p50 step, GPU util, overhead."""
    failed = [c for c in summary.checks if c.ok is False]
    lines = [
        f"# GPU check: {'PASS' if summary.passed else 'FAIL'} ({summary.device})",
        "",
        f"{len(summary.checks)} checks, {len(failed)} failed, "
        f"{sum(c.ok is None for c in summary.checks)} reported only; "
        f"{time.monotonic() - summary.started:.0f} s.",
        "",
        "## Findings per scenario",
        "",
        "| scenario | size | must | findings | p50 step (ms) | GPU util (%) | verdict |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for run, expected in summary.runs:
        check = check_run(run, expected)
        lines.append(
            f"| {run.scenario} | {run.size} | {expected.describe()} | "
            f"{_findings_text(run.findings)} | {_ms(run.p50_ms)} | {_pct(run.gpu_util_pct)} | "
            f"{_verdict(check)} |"
        )
    if summary.fixes:
        lines += [
            "",
            "## Fix and verify",
            "",
            "| scenario | size | patch | p50 before (ms) | p50 after (ms) | findings after | verdict |",
            "|---|---|---|---:|---:|---|---|",
        ]
        for before, after, patch, check in summary.fixes:
            lines.append(
                f"| {before.scenario} | {before.size} | `{patch}` | {_ms(before.p50_ms)} | "
                f"{_ms(after.p50_ms)} | {_findings_text(after.findings)} | {_verdict(check)} |"
            )
    if summary.overhead:
        lines += ["", "## Instrument overhead (bench/bench_overhead.py)", ""]
        lines += ["| size | steady step on ÷ off (median of interleaved pairs) |", "|---|---:|"]
        lines += [f"| {size} | {ratio} |" for size, ratio in summary.overhead.items()]
    if summary.snapshot_cost:
        lines += ["", "## Memory snapshot recording (bench/bench_snapshot_recording.py)", ""]
        lines += summary.snapshot_cost
    others = [c for c in summary.checks if not c.what.startswith(tuple(EXPECTED))]
    if others:
        lines += ["", "## Other checks", ""]
        lines += [f"- {c.what}: {_verdict(c)}" for c in others]
    return "\n".join(lines) + "\n"


# --- the command ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.gpu_check", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument(
        "--runs-dir", type=Path, default=None, help="default: a new temporary folder"
    )
    parser.add_argument("--summary", type=Path, default=None, help="default: RUNS_DIR/gpu-check.md")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=SIZES)
    parser.add_argument("--scenarios", nargs="+", default=list(EXPECTED), choices=list(EXPECTED))
    parser.add_argument("--fix-sizes", nargs="*", default=["gpu"], choices=SIZES)
    parser.add_argument("--steps", type=int, default=24, help="fine-tuning steps per run")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra trainer settings for every run (e.g. a tiny size for tests)",
    )
    parser.add_argument("--no-tests", action="store_true", help="skip pytest -m gpu")
    parser.add_argument("--no-bench", action="store_true", help="skip bench_overhead")
    parser.add_argument("--bench-repeats", type=int, default=2)
    parser.add_argument("--bench-steps", type=int, default=30)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.runs_dir is None:
        args.runs_dir = Path(tempfile.mkdtemp(prefix="pipeline-doctor-gpu-"))
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    # every run keeps the profiler window and a final checkpoint, nothing more (the bench
    # chooses its own steps: only the user's settings go to it)
    args.user_set = list(args.set)
    args.set = ["train.pretrain_steps=2", "train.checkpoint_every=1000", *args.set]
    summary = Summary(args.device, tuple(args.sizes))
    print(f"GPU check on {args.device}: runs in {args.runs_dir}", flush=True)
    run_scenarios(summary, args)
    if not args.no_tests:
        run_gpu_tests(summary)
    if not args.no_bench:
        run_overhead(summary, args)
        if args.device == "cuda":
            run_snapshot_cost(summary, args)
    path = args.summary or args.runs_dir / "gpu-check.md"
    path.write_text(render(summary), encoding="utf-8")
    print(f"{'PASS' if summary.passed else 'FAIL'}: summary in")
    print(path)
    return 0 if summary.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
