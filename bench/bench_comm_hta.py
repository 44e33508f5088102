"""Communication/computation overlap: our figures and HTA 0.5.0's, side by side, on the two
shared NCCL traces (and on the same traces with NCCL 2.19's ``ncclDevKernel_*`` names).

Columns:

* ours, steps     ``summary.comm_overlap_pct``: over the profiled steps' span (every step)
* ours, trace     the same sweep over the whole trace
* ours, HTA window  only GPU work launched before the last ProfilerStep starts, as HTA's
                  ``Trace`` keeps by default (``include_last_profiler_step=False``)
* HTA             ``TraceAnalysis.get_comm_comp_overlap`` (bench/.venv-peers)
* HTA, new names  HTA on the trace with its NCCL kernels renamed ``ncclDevKernel_*``

    .venv/bin/python bench/bench_comm_hta.py
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from diagnostics.facts.comms import comm_facts, gpu_comm_split, overlap_of  # noqa: E402
from diagnostics.facts.linking import build_index  # noqa: E402
from diagnostics.facts.steps import find_steps  # noqa: E402
from diagnostics.trace.loader import load  # noqa: E402

TRACES = REPO.parent / "shared" / "traces"
NAMES = ("hta_a100_rank3_of_8.json.gz", "hta_a100_rank0_of_16.json.gz")
OUT = REPO / "bench" / "out"

HTA = r"""
import json, logging, os, sys, tempfile
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
folder = tempfile.mkdtemp()
os.symlink(os.path.abspath(sys.argv[1]), os.path.join(folder, os.path.basename(sys.argv[1])))
frame = TraceAnalysis(trace_dir=folder).get_comm_comp_overlap(visualize=False)
print(json.dumps(float(frame["comp_comm_overlap_pctg"].iloc[0])))
"""

# ncclKernel_<Coll>_<Algo>_<Proto>_<Op>_<type>(...) -> NCCL 2.19's ncclDevKernel_<Coll>_<Op>_<type>_<Algo>_<Proto>
RENAME = (
    r"^ncclKernel_(\w+?)_(RING|TREE)_(LL|LL128|SIMPLE)_(\w+?)_(\w+)\(.*$",
    r"ncclDevKernel_\1_\4_\5_\2_\3(ncclDevComm*, unsigned long, ncclWork*)",
)


def hta_overlap(python: Path | None, path: Path) -> float | None:
    if python is None:
        return None
    done = subprocess.run([str(python), "-c", HTA, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"note: HTA failed on {path.name}: {done.stderr.strip()[-200:]}")
        return None
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def renamed_copy(path: Path) -> Path:
    import re

    with gzip.open(path, "rt") as handle:
        doc = json.load(handle)
    pattern = re.compile(RENAME[0])
    for event in doc["traceEvents"]:
        name = event.get("name")
        if isinstance(name, str) and name.startswith("ncclKernel_"):
            event["name"] = pattern.sub(RENAME[1], name)
    OUT.mkdir(parents=True, exist_ok=True)
    target = OUT / path.name.replace(".json.gz", ".ncclDevKernel.json.gz")
    with gzip.open(target, "wt", compresslevel=1) as out:
        json.dump(doc, out)
    return target


def ours(path: Path) -> dict[str, float | None]:
    events = load(path).traces[0].events
    index = build_index(events)
    steps = find_steps(events, index)
    facts = comm_facts(events, index, steps)
    assert facts is not None
    last_step_start = float(steps.frame["host_start_us"].max())
    window = index.gpu.filter(pl.col("rt_start_us") < last_step_start)
    segments = overlap_of(*gpu_comm_split(window))

    def length(states: list[int]) -> float:
        picked = segments.filter(pl.col("state").is_in(states))
        return float(picked.select((pl.col("end_us") - pl.col("start_us")).sum()).item())

    return {
        "steps": facts.overlap_pct,
        "trace": facts.trace_overlap_pct,
        "hta_window": length([3]) / length([1, 3]) * 100.0,
        "collective_ms": facts.collective_us / 1000.0,
        "exposed_pct": facts.exposed_pct,
        "kernels": facts.collectives_count,
        "window_kernels": gpu_comm_split(window)[0].height,
    }


def main() -> None:
    from bench_analyzer import ensure_peers_venv

    python = ensure_peers_venv()
    print(
        "| trace | NCCL kernels (HTA window) | ours, steps % | ours, trace % "
        "| ours, HTA window % | HTA 0.5.0 % | HTA, ncclDevKernel_ names % "
        "| exposed, % of step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in NAMES:
        path = TRACES / name
        mine = ours(path)
        theirs = hta_overlap(python, path)
        with tempfile.TemporaryDirectory():
            renamed = renamed_copy(path)
            theirs_new = hta_overlap(python, renamed)
            os.unlink(renamed)

        def pct(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.2f}"

        print(
            f"| {name} | {mine['kernels']} ({mine['window_kernels']}) | {pct(mine['steps'])} "
            f"| {pct(mine['trace'])} | {pct(mine['hta_window'])} | {pct(theirs)} "
            f"| {pct(theirs_new)} | {pct(mine['exposed_pct'])} |"
        )


if __name__ == "__main__":
    main()
