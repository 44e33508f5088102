"""Benchmark: a 100 MB CUDA memory snapshot read and analysed, against plain
``pickle.load`` and PyTorch's own ``torch.cuda._memory_viz`` stats, on the same file in
the same run.

The snapshot is generated here (a real one needs a CUDA device): ``--segments`` 20 MiB
segments of live and free blocks, and steps of allocations and frees with Python stacks
of 14 frames drawn from a pool of distinct stacks, in the schema torch/cuda/memory.py
documents (new generation: time_us, allocator_settings), pickled at protocol 4, grown
until the file reaches ``--mb``. Each contender runs in its own child process (so its
peak RSS is its own), after its imports, best of ``--repeat``:

- ``pickle.load``: the file unpickled, nothing else (no safety: it would run a GLOBAL);
- ``_memory_viz``: pickle.load, then ``segsum`` (what ``python -m torch.cuda._memory_viz
  stats`` prints) and ``trace`` (its ``trace`` command), the two text summaries it has;
- ours: ``read_snapshot`` (restricted unpickler, typed frames) + ``analyse_snapshot``
  (replay, peak, sites, categories, fragmentation, segment map).

    .venv/bin/python bench/bench_snapshot.py [--mb 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20

FILES = [f"/job/model/layer{i}.py" for i in range(40)]
TORCH = "/usr/lib/python3/site-packages/torch"


def _stacks(n: int) -> list[list[dict]]:
    stacks = []
    for i in range(n):
        frames = [
            {"filename": f"{TORCH}/nn/functional.py", "line": 2100 + i % 7, "name": "linear"},
            {"filename": FILES[i % len(FILES)], "line": 10 + i, "name": "forward"},
        ]
        for depth in range(12):
            frames.append(
                {
                    "filename": f"{TORCH}/nn/modules/module.py",
                    "line": 1700 + depth,
                    "name": "_call_impl" if depth % 2 else "_wrapped_call_impl",
                }
            )
        stacks.append(frames)
    return stacks


def generate(path: Path, target_mb: float, segments: int) -> dict[str, int]:
    """Writes the snapshot, sized from a pilot's bytes per entry; returns its counts."""
    pilot = _build(segments, 3000)
    per_entry = (
        len(pickle.dumps(pilot, protocol=4))
        - len(pickle.dumps({**pilot, "device_traces": [[]]}, protocol=4))
    ) / 3000
    fixed = len(pickle.dumps({**pilot, "device_traces": [[]]}, protocol=4))
    wanted = max(3, int((target_mb * MIB - fixed) / per_entry))
    snapshot = _build(segments, wanted)
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    return {"segments": segments, "entries": len(snapshot["device_traces"][0])}


def _build(segments: int, wanted: int) -> dict:
    pool = _stacks(500)
    segs, base = [], 0x7F0000000000
    for s in range(segments):
        blocks, offset = [], 0
        for b in range(10):
            size = 2 * MIB
            state = "active_allocated" if b % 3 else "inactive"
            block = {"address": base + offset, "size": size, "state": state}
            block["requested_size"] = size - 512 if state != "inactive" else 0
            block["frames"] = [dict(f) for f in pool[(s * 10 + b) % len(pool)]]
            blocks.append(block)
            offset += size
        live = sum(b["size"] for b in blocks if b["state"] != "inactive")
        segs.append(
            {
                "device": 0,
                "address": base,
                "total_size": offset,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "allocated_size": live,
                "active_size": live,
                "requested_size": live,
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
        base += offset + 2 * MIB
    # allocations in the free blocks (every third block), each freed again: the dump state
    # stays the segments', so the replay is consistent
    free_addrs = [b["address"] for seg in segs for b in seg["blocks"] if b["state"] == "inactive"]
    entries, t, i = [], 1_700_000_000_000_000, 0
    while len(entries) < wanted:
        addr = free_addrs[i % len(free_addrs)]
        frames = [dict(f) for f in pool[i % len(pool)]]
        for action in ("alloc", "free_requested", "free_completed"):
            entries.append(
                {
                    "action": action,
                    "addr": addr,
                    "size": 2 * MIB,
                    "stream": 0,
                    "time_us": t,
                    "frames": frames if action == "alloc" else [],
                    "compile_context": "",
                    "user_metadata": "",
                }
            )
            t += 3
        i += 1
    snapshot = {
        "segments": segs,
        "device_traces": [entries],
        "allocator_settings": {"expandable_segments": False, "PYTORCH_CUDA_ALLOC_CONF": ""},
        "external_annotations": [],
    }
    return snapshot


CHILD = r"""
import json, pickle, resource, sys, time
which, path, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, sys.argv[4])
if which == "memory_viz":
    from torch.cuda import _memory_viz
elif which == "ours":
    from diagnostics.snapshot.analysis import analyse_snapshot
    from diagnostics.snapshot.reader import read_snapshot
best = float("inf")
out = {}
for _ in range(repeat):
    start = time.perf_counter()
    if which == "pickle":
        with open(path, "rb") as f:
            data = pickle.load(f)
    elif which == "memory_viz":
        with open(path, "rb") as f:
            data = pickle.load(f)
        stats = _memory_viz.segsum(data)
        text = _memory_viz.trace(data)
        out["total_reserved"] = [l for l in stats.splitlines() if l.startswith("total_reserved")][0]
    else:
        facts = analyse_snapshot(read_snapshot(path, max_bytes=2**34))
        out["peak_allocated_bytes"] = facts.peak.allocated_bytes
        out["reserved_bytes"] = facts.dump.reserved_bytes
    best = min(best, time.perf_counter() - start)
    data = facts = None
out["seconds"] = best
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def run(which: str, path: Path, repeat: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, which, str(path), str(repeat), str(REPO)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--segments", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "snapshot.pickle"
        counts = generate(path, args.mb, args.segments)
        size_mb = path.stat().st_size / MIB
        print(
            f"snapshot: {size_mb:,.1f} MiB, {counts['segments']:,} segments, "
            f"{counts['entries']:,} trace entries (protocol 4)"
        )
        results = {
            which: run(which, path, args.repeat) for which in ("pickle", "memory_viz", "ours")
        }
    base = results["pickle"].get("seconds")
    print()
    print(f"| contender | s (best of {args.repeat}) | ÷ pickle.load | peak RSS MB |")
    print("|---|---|---|---|")
    labels = {
        "pickle": "plain `pickle.load` (runs any GLOBAL)",
        "memory_viz": "`pickle.load` + `_memory_viz.segsum` + `_memory_viz.trace`",
        "ours": "ours: `read_snapshot` + `analyse_snapshot`",
    }
    for which, label in labels.items():
        got = results[which]
        if "error" in got:
            print(f"| {label} | failed: {got['error']} | | |")
            continue
        ratio = f"{got['seconds'] / base:.2f}×" if base else "—"
        print(f"| {label} | {got['seconds']:.2f} | {ratio} | {got['peak_rss_mb']:,.0f} |")
    ours, viz = results["ours"], results["memory_viz"]
    if "seconds" in ours and "seconds" in viz:
        print(f"\nours ÷ _memory_viz: {ours['seconds'] / viz['seconds']:.2f}×")
    print(
        f"ours: peak allocated {ours.get('peak_allocated_bytes')}, reserved {ours.get('reserved_bytes')}"
    )
    print(f"_memory_viz: {viz.get('total_reserved')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
