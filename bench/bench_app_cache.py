"""Benchmark: how fast the app's Run detail page opens a run with a 54 MB trace.

Builds a run folder in a temporary directory from a short real trainer run whose trace is
replaced by the largest shared trace (hta_v100_rank1_of_2_large.json.gz, 54 MB of JSON),
then runs the Run detail page in Streamlit's AppTest: the first run analyses the folder
(the cache is cold), the next runs hit ``st.cache_data`` (keyed on path + mtime). A touch
of the trace file (new mtime) must make the page analyse again. Target: a cached open
under 2 s.

    .venv/bin/python bench/bench_app_cache.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LARGE_TRACE = REPO.parent / "shared" / "traces" / "hta_v100_rank1_of_2_large.json.gz"
TARGET_S = 2.0


def make_run(root: Path) -> Path:
    runs = root / "runs"
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--scenario", "healthy", "--steps", "4",
         "--runs-dir", str(runs), "--device", "cpu", "--run-id", "big-trace-run",
         "--set", "train.pretrain_steps=0", "--set", "data.rows=256",
         "--set", "model.hidden_size=64", "--set", "model.intermediate_size=128",
         "--set", "model.layers=1"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"trainer failed: {done.stderr[-500:]}")
    run = runs / "big-trace-run"
    for old in (run / "trace").iterdir():
        old.unlink()
    shutil.copy(LARGE_TRACE, run / "trace" / "worker0.large.pt.trace.json.gz")
    return run


def page_seconds(at) -> float:
    start = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - start
    if at.exception:
        raise SystemExit(f"page failed: {at.exception[0].value}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from streamlit.testing.v1 import AppTest

    with tempfile.TemporaryDirectory(prefix="bench-app-") as tmp:
        run = make_run(Path(tmp))
        os.environ["PIPELINE_DOCTOR_RUNS_DIR"] = str(run.parent)
        at = AppTest.from_file(str(REPO / "app.py"), default_timeout=600)
        at.query_params["run"] = run.name
        at.switch_page("pages/3_Run_detail.py")
        cold = page_seconds(at)
        warm = [page_seconds(at) for _ in range(args.repeats)]
        os.utime(run / "trace" / "worker0.large.pt.trace.json.gz")  # new mtime: re-analyse
        touched = page_seconds(at)

    median_warm = statistics.median(warm)
    size_mib = LARGE_TRACE.stat().st_size / 2**20
    print(f"Run detail page, run with a 54 MB trace ({size_mib:.1f} MiB as .json.gz)")
    print("| open | seconds | vs cold |")
    print("|---|---|---|")
    print(f"| first (cold cache: analyse) | {cold:.2f} | 1.00× |")
    print(f"| cached (median of {len(warm)}) | {median_warm:.2f} | {median_warm / cold:.2f}× |")
    print(f"| after the trace changed | {touched:.2f} | {touched / cold:.2f}× |")
    verdict = "meets" if median_warm < TARGET_S else "MISSES"
    print(f"\ncached open {median_warm:.2f} s {verdict} the {TARGET_S:.0f} s target")
    return 0 if median_warm < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
