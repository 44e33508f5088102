"""Benchmark: many-rank analysis (ours, process pool) against HTA 0.5.0 on the same sets.

Rank sets of 8, 32 and 64 files are made from one real NCCL trace
(../shared/traces/hta_a100_rank3_of_8.json.gz, 35 MB of JSON) by shifting, per rank, every
timestamp (rank r starts r x 40 µs later; the last rank a further 3 ms, a straggler) and
every id (correlation, External id, flow ids + r x 10^8), with ``distributedInfo.rank`` and
``world_size`` set. They are written as plain JSON into bench/out/ranks-N/ (gitignored) and
reused when present.

Each tool runs in a fresh process on the whole folder:

* ours   ``python -m diagnostics analyze bench/out/ranks-N`` (every rank's facts in a
         process pool sized to the cores, cross-rank collective matching, rules, JSON)
* HTA    ``TraceAnalysis(trace_dir=...)`` + ``get_comm_comp_overlap`` (bench/.venv-peers)
* upload (``--upload``) the Upload page's analysis of the same files
         (``analyse_upload_files``: each file's identity row and stored drill-down as well as
         the analysis), against ours on the folder: what the drill-downs and identities cost

Wall time and the peak RSS of the whole process tree (process_tree.measure: the process's
own high-water mark and the sum over it and its workers, sampled from /proc) are reported, with ratios: ours/HTA, and the
growth of wall time against ranks ÷ cores.

    nice -n 10 .venv/bin/python bench/bench_ranks.py --ranks 8 32        # then, late:
    nice -n 10 .venv/bin/python bench/bench_ranks.py --ranks 64 --hta-max-gb 12
    .venv/bin/python bench/bench_ranks.py --ranks 8 --no-hta --upload
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO.parent / "shared" / "traces" / "hta_a100_rank3_of_8.json.gz"
OUT = REPO / "bench" / "out"
sys.path.insert(0, str(REPO / "bench"))

from process_tree import measure  # noqa: E402

RANK_SHIFT_US = 40.0
STRAGGLER_DELAY_US = 3000.0
ID_STRIDE = 10**8

HTA = r"""
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1])
print(analysis.get_comm_comp_overlap(visualize=False).to_json(orient="records"))
"""

UPLOAD = r"""
import sys, tempfile
from pathlib import Path
from diagnostics.upload_analysis import analyse_upload_files
if __name__ == "__main__":  # the rank pool's workers are spawned: they import this module
    files = sorted(Path(sys.argv[1]).glob("*.json"))
    with tempfile.TemporaryDirectory() as store:
        upload = analyse_upload_files(
            files, display_names=[f.name for f in files], mode=None, store=store
        )
    print(upload.mode, upload.results[0].result.source["ranks"])
"""


def make_rank_set(ranks: int) -> Path:
    folder = OUT / f"ranks-{ranks}"
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(SOURCE, "rb") as handle:
        doc = msgspec.json.decode(handle.read())
    events = doc["traceEvents"]
    base_ts = [e.get("ts") for e in events]
    for rank in range(ranks):
        shift = rank * RANK_SHIFT_US + (STRAGGLER_DELAY_US if rank == ranks - 1 else 0.0)
        offset = rank * ID_STRIDE
        for event, ts in zip(events, base_ts, strict=True):
            if isinstance(ts, int | float):
                event["ts"] = ts + shift
            if event.get("ph") in ("s", "f", "t") and isinstance(event.get("id"), int):
                event["id"] = event["id"] % ID_STRIDE + offset
            args = event.get("args")
            if isinstance(args, dict):
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int) and args[key] > 0:
                        args[key] = args[key] % ID_STRIDE + offset
        doc.pop("distributedInfo", None)
        # HTA finds a file's rank with the regex '"rank":\s+(\d+)': it needs the space that
        # json.dump writes and msgspec does not (without it every file is read as rank 0)
        header = (
            f'{{"distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {ranks}}}, '
        )
        (folder / f"rank{rank}.json").write_bytes(header.encode() + msgspec.json.encode(doc)[1:])
    done.write_text("ok\n")
    return folder


def main() -> None:
    from bench_analyzer import ensure_peers_venv

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--no-hta", action="store_true")
    parser.add_argument(
        "--hta-max-gb", type=float, default=12.0, help="stop HTA past this tree RSS"
    )
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument(
        "--upload", action="store_true", help="also the Upload page's analysis of the files"
    )
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    hta_python = None if args.no_hta else ensure_peers_venv()
    rows = []
    uploads = []
    for ranks in args.ranks:
        folder = make_rank_set(ranks)
        result = OUT / f"ranks-{ranks}-result.json"
        size_mb = sum(p.stat().st_size for p in folder.glob("*.json")) / 2**20
        ours = measure(
            # a regular file beside the rank folder: -o refuses a device such as /dev/null
            [sys.executable, "-m", "diagnostics", "analyze", str(folder), "-o", str(result)],
            args.timeout_s,
        )
        hta = (
            measure(
                [str(hta_python), "-c", HTA, str(folder)],
                args.timeout_s,
                int(args.hta_max_gb * 2**30),
            )
            if hta_python is not None
            else {"seconds": None, "rss_mb": None, "cpu_s": None, "error": "skipped", "stdout": ""}
        )
        if args.upload:
            upload = measure([sys.executable, "-c", UPLOAD, str(folder)], args.timeout_s)
            print(json.dumps({"ranks": ranks, "upload": upload})[:600], flush=True)
            uploads.append((ranks, ours, upload))
        rows.append((ranks, size_mb, ours, hta))
        print(json.dumps({"ranks": ranks, "ours": ours, "hta": hta})[:600], flush=True)
    print(f"\ncores: {cores}; source {SOURCE.name} (35 MB of JSON a rank)\n")
    print(
        "| ranks | JSON MB | ours s | ours CPU s | ours CPU s/rank | ours peak RSS GB "
        "| HTA s | HTA CPU s | HTA peak RSS GB | HTA ranks read | ours/HTA wall | ours/HTA RSS |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def cell(v: float | None, err: str | None = None, digits: int = 1) -> str:
        return f"{v:.{digits}f}" if v is not None else (err or "n/a")

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}×" if a and b else "n/a"

    def gb(measured: dict) -> float | None:
        return None if measured["rss_mb"] is None else measured["rss_mb"] / 1024

    for ranks, size_mb, ours, hta in rows:
        try:
            read = len(json.loads(hta["stdout"].strip().splitlines()[-1]))
        except (ValueError, IndexError):
            read = None
        print(
            f"| {ranks} | {size_mb:.0f} | {cell(ours['seconds'], ours['error'])} "
            f"| {cell(ours['cpu_s'])} | {cell((ours['cpu_s'] or 0) / ranks, None, 2)} "
            f"| {cell(gb(ours), None, 2)} | {cell(hta['seconds'], hta['error'])} "
            f"| {cell(hta['cpu_s'])} | {cell(gb(hta), None, 2)} | {read} "
            f"| {ratio(ours['seconds'], hta['seconds'])} | {ratio(gb(ours), gb(hta))} |"
        )
    if uploads:
        print(
            "\n| ranks | ours s | upload s | upload ÷ ours (wall) | ours peak RSS GB | upload peak RSS GB |"
        )
        print("|---|---|---|---|---|---|")
        for ranks, ours, upload in uploads:
            print(
                f"| {ranks} | {cell(ours['seconds'], ours['error'], 2)} "
                f"| {cell(upload['seconds'], upload['error'], 2)} "
                f"| {ratio(upload['seconds'], ours['seconds'])} | {cell(gb(ours), None, 2)} "
                f"| {cell(gb(upload), None, 2)} |"
            )
    if len(rows) > 1:
        (r0, _, o0, _), (r1, _, o1, _) = rows[0], rows[-1]
        if o0["seconds"] and o1["seconds"]:
            print(
                f"\nours, {r0} -> {r1} ranks: wall x{o1['seconds'] / o0['seconds']:.2f}, "
                f"CPU x{o1['cpu_s'] / o0['cpu_s']:.2f}, ranks x{r1 / r0:.2f} "
                f"(ranks / cores: {r0 / cores:.0f} -> {r1 / cores:.0f})"
            )


if __name__ == "__main__":
    main()
