"""Shared fixtures. Keep this file small and additive: append fixtures, never change one.

- ``repo_root``: the project root.
- ``shared_traces_dir``: the real traces, read in place (``<repo>/../shared/traces``).
- ``tiny_run``: one real, completed, instrumented run of the trainer CLI (healthy scenario,
  a few steps, CPU), made once per session; its folder path (treat it as read-only).
- ``two_rank_runs``: a healthy and a straggler run, 2 ranks under torchrun (gloo, CPU), six
  steps, made once per session for the distributed, rank-view and browser tests (read-only).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# The xdist workers and the real runs they start share two cores. OpenMP's default of
# spinning while a thread waits for work made two torch processes at once each 18x slower
# than one alone (a loop of 256x256 matmuls: 8.8 s each, against 1.1 s when the waiting
# threads sleep and 0.5 s alone). Set before torch is imported; the runs inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Small enough for a few seconds on a shared 2-core CPU, big enough to cross the profiler's
# active window (wait 1 + warmup 1 + active 3 = 5 fine-tuning steps) and one checkpoint.
TINY_RUN_ARGS = (
    "--scenario",
    "healthy",
    "--device",
    "cpu",
    "--steps",
    "8",
    "--set",
    "data.rows=400",
    "--set",
    "train.pretrain_steps=2",
    "--set",
    "train.checkpoint_every=4",
    "--set",
    "train.batch_size=16",
)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_traces_dir(repo_root: Path) -> Path:
    return repo_root.parent / "shared" / "traces"


def run_trainer_cli(
    args: list[str] | tuple[str, ...], timeout_s: float = 180.0, *, measured: bool = False
):
    """``python -m trainer ...`` from the repo root; the CompletedProcess (text).
    ``measured``: at a raised priority (tests.run_timing.raise_priority; its ranks inherit
    it), for a run whose findings rest on time shares between its ranks or steps."""
    from tests.run_timing import raise_priority

    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        preexec_fn=raise_priority if measured else None,
    )


def start_trainer_cli(args: list[str] | tuple[str, ...]) -> subprocess.Popen[str]:
    """``python -m trainer ...`` started in the background from the repo root (text pipes)."""
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs_dir = tmp_path_factory.mktemp("tiny_runs")
    result = run_trainer_cli(["run", *TINY_RUN_ARGS, "--runs-dir", str(runs_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(result.stdout.strip().splitlines()[-1])


# A distributed run small enough for 2 cores (add --nproc-per-node 2 and --steps): no
# pre-training, no DataLoader workers, one checkpoint every 2 steps
TINY_DIST_ARGS = (
    "--device",
    "cpu",
    "--set",
    "data.rows=240",
    "--set",
    "train.pretrain_steps=0",
    "--set",
    "train.batch_size=8",
    "--set",
    "train.checkpoint_every=2",
    "--set",
    "data.num_workers=0",
)


# Rank 1's extra data loading a batch in the session's straggler run: twice the scenario's
# 300 ms. Two ranks sharing two cores with a loaded suite make rank 1's own compute longer
# too (three straggler runs at once beside a busy loop: up to 58 ms a step), and at 300 ms
# that left data wait 83 % of the lateness, near the 80 % a cause needs (CI once fell under
# it); at 600 ms the same load left it 93 % or more.
STRAGGLER_DELAY_MS = 600.0


@dataclass(frozen=True)
class TwoRankRuns:
    runs_dir: Path
    healthy: Path
    straggler: Path


def make_run(
    runs_dir: Path,
    scenario: str,
    run_id: str,
    nproc: int = 2,
    *,
    measured: bool = False,
    settings: tuple[str, ...] = (),
) -> Path:
    """One completed tiny run of ``scenario`` with ``nproc`` processes (1: no torchrun);
    ``settings``: more ``key=value`` for ``--set``."""
    args = ["run", "--scenario", scenario, "--run-id", run_id, *TINY_DIST_ARGS, "--steps", "6"]
    for setting in settings:
        args += ["--set", setting]
    if nproc > 1:
        args += ["--nproc-per-node", str(nproc)]
    result = run_trainer_cli(
        [*args, "--runs-dir", str(runs_dir)], timeout_s=400.0, measured=measured
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> TwoRankRuns:
    runs_dir = tmp_path_factory.mktemp("two_rank_runs")
    # one after the other: four ranks at once on two cores would blur the straggler's gap;
    # raised, as the measured runs are: two suites and two busy loops beside them (load
    # 17-29) left the straggler's ranks so starved that rank-stragglers stayed silent on it
    healthy = make_run(runs_dir, "healthy", "healthy-2-ranks", measured=True)
    straggler = make_run(
        runs_dir,
        "straggler",
        "straggler-2-ranks",
        measured=True,
        settings=(f"distributed.straggler_delay_ms={STRAGGLER_DELAY_MS}",),
    )
    return TwoRankRuns(runs_dir, healthy, straggler)


# One tiny real run per trainer scenario (the reports build for each; other suites may read
# them too). Scenario presets are kept: no batch-size override, so small-batch stays small.
SCENARIO_RUN_ARGS = (
    "--device",
    "cpu",
    "--steps",
    "6",
    "--set",
    "data.rows=240",
    "--set",
    "train.pretrain_steps=0",
    "--set",
    "train.checkpoint_every=1000",
    "--set",
    "runtime.threads=1",
)
SCENARIO_NAMES = (
    "healthy",
    "slow-loader",
    "no-pin-memory",
    "unstable",
    "leak",
    "small-batch",
    "fp32",
    "per-sample-lookups",
    "unpruned-vocab",
)


@pytest.fixture(scope="session")
def scenario_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """scenario name -> a completed run folder, all started at once (one thread each)."""
    runs_dir = tmp_path_factory.mktemp("scenario_runs")
    logs = runs_dir / "_logs"
    logs.mkdir()
    procs = {}
    for name in SCENARIO_NAMES:
        # Output to files, not pipes: a full pipe would stall a run while another is awaited.
        with (logs / f"{name}.out").open("w") as out, (logs / f"{name}.err").open("w") as err:
            procs[name] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trainer",
                    "run",
                    "--scenario",
                    name,
                    *SCENARIO_RUN_ARGS,
                    "--runs-dir",
                    str(runs_dir),
                ],
                cwd=REPO_ROOT,
                stdout=out,
                stderr=err,
            )
    runs: dict[str, Path] = {}
    for name, proc in procs.items():
        returncode = proc.wait(timeout=600)
        stderr = (logs / f"{name}.err").read_text()
        assert returncode == 0, f"{name}: {stderr[-3000:]}"
        runs[name] = Path((logs / f"{name}.out").read_text().strip().splitlines()[-1])
    return runs


@pytest.fixture
def no_cuda_for_children(monkeypatch):
    """Child processes (the trainer, the launcher's CUDA probe) see no CUDA device, on a GPU
    host too, so the tests of what happens without one run everywhere instead of being
    skipped where a GPU is. The probe's answer is cached per process: asked afresh here and
    forgotten afterwards, so that no other test inherits the pretended 0."""
    from trainer import launch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    launch._cuda_devices.cache_clear()
    yield
    launch._cuda_devices.cache_clear()


# Fixtures that start Chromium or a live streamlit server (tests/app/conftest.py and the
# modules' own): a test that uses one must carry the browser marker, or `-m "not browser"`
# would still start a browser.
BROWSER_FIXTURES = frozenset(
    {"browser", "app_server", "runs_server", "rank_server", "hostile_server"}
)


# scripts/test.sh runs the suite on three pytest-xdist workers, a test file at a time on one
# of them, so that a module's shared run is made once. The files that share an expensive
# session run are scheduled as one unit, so that run is made once too. (xdist's own
# xdist_group marks cannot do it under pytest 9.2: xdist writes the group into a private
# node-id attribute that pytest renamed, and the marks are silently ignored.)
SHARED_RUN_FILES = {
    "tests/trainer/test_scenarios.py": "scenario_runs",
    "tests/diagnostics/report/test_scenario_runs.py": "scenario_runs",
    "tests/trainer/test_distributed.py": "two_rank_runs",
    "tests/app/test_rank_view.py": "two_rank_runs",
    "tests/app/test_upload_set.py": "two_rank_runs",
    "tests/app/test_e2e_ranks.py": "two_rank_runs",
}


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndSharedRuns(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_RUN_FILES.get(path, path)

    return FilesAndSharedRuns(config, log)


def pytest_collection_modifyitems(config, items):
    strays = sorted(
        {
            f"{item.nodeid.split('::')[0]} uses {name}"
            for item in items
            for name in set(SHARED_RUN_FILES.values()) & set(getattr(item, "fixturenames", ()))
            if SHARED_RUN_FILES.get(item.nodeid.split("::")[0]) != name
        }
    )
    if strays:
        raise pytest.UsageError(f"add to SHARED_RUN_FILES in tests/conftest.py: {strays}")
    unmarked = [
        item.nodeid
        for item in items
        if BROWSER_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("browser") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            f"uses a browser or live-server fixture without @pytest.mark.browser: {unmarked}"
        )


@pytest.fixture(autouse=True)
def main_module_put_back():
    """Streamlit's AppTest puts its temporary script in sys.modules["__main__"] and never
    puts the real one back. A process started with spawn afterwards in the same xdist
    worker (the rank pool, a DataLoader with spawn workers) re-ran that script and died
    (NameError: __args): a test's outcome depended on which files ran before it."""
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main


@pytest.fixture
def one_thread():
    """torch's intra-op threads set to one for the test, restored after: a trainer built in
    the test process then computes as the tests' runs do (runtime.threads=1), without
    fighting the other test workers for the two cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
