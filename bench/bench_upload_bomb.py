"""Benchmark: the issue's upload bomb through the Upload page, with the default limits.

Builds a gzip of valid Kineto kernel events that inflates to ``--inflated-gib`` (default
1.5 GiB, the issue's bomb: 5.3 MB of gzip, 12 GB peak RSS in the server before the fix),
uploads it through the real Upload page in Streamlit's AppTest (the page's script runs in
this process, as in `streamlit run`), and prints what the page says, the server process's
peak RSS (VmHWM, reset just before the upload), the analysis child's peak RSS and the
wall time. The limits are whatever the PIPELINE_DOCTOR_* environment sets, else the
defaults (docs/LIMITS.md).

    .venv/bin/python bench/bench_upload_bomb.py [--inflated-gib 1.5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EVENT = {
    "ph": "X",
    "cat": "kernel",
    "name": "volta_sgemm_128x64_nn",
    "pid": 0,
    "tid": 7,
    "ts": 1623142623460172,
    "dur": 14,
    "args": {"device": 0, "stream": 7, "correlation": 81421, "External id": 5123},
}


def write_bomb(path: Path, inflated_bytes: int) -> tuple[int, int]:
    """(file bytes, events): valid events streamed through gzip, never held whole."""
    text = json.dumps(EVENT) + ","
    block = (text * 1000).encode()
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    blocks = max(1, inflated_bytes // len(block))
    with path.open("wb") as out:
        out.write(packer.compress(b'{"traceEvents":['))
        for _ in range(blocks):
            out.write(packer.compress(block))
        out.write(packer.compress(json.dumps(EVENT).encode() + b"]}"))
        out.write(packer.flush())
    return path.stat().st_size, blocks * 1000 + 1


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inflated-gib", type=float, default=1.5)
    args = parser.parse_args()
    from streamlit.testing.v1 import AppTest

    from diagnostics.isolated import ChildLimits
    from diagnostics.trace.budget import Limits

    limits, child = Limits.from_env(), ChildLimits.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("PIPELINE_DOCTOR_RUNS_DIR", str(Path(tmp) / "runs"))
        bomb = Path(tmp) / "bomb.json.gz"
        size, events = write_bomb(bomb, int(args.inflated_gib * 2**30))
        at = AppTest.from_file(str(REPO / "app.py"), default_timeout=child.timeout_s + 60)
        at.switch_page("pages/4_Upload_trace.py")
        at.run()
        at.file_uploader[0].set_value(("bomb.json.gz", bomb.read_bytes(), "application/gzip"))
        before = status_bytes("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM
        started = time.perf_counter()
        at.run()
        wall_s = time.perf_counter() - started
        peak = status_bytes("VmHWM")
        child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        shown = [e.value for e in at.error] or ["(no error: analysed)"]
    mib = 2**20
    print("| quantity | value |")
    print("|---|---|")
    print(
        f"| upload | {size / mib:.1f} MiB gzip, {args.inflated_gib:g} GiB JSON, {events:,} events |"
    )
    print(
        f"| limits | {limits.max_decompressed_bytes / 2**30:g} GiB, {limits.max_events:,} events, "
        f"{child.memory_bytes / 2**30:g} GiB address space, {child.timeout_s:g} s |"
    )
    print(f"| page shows | {shown[0]} |")
    print(f"| server RSS before / peak | {before / mib:.0f} / {peak / mib:.0f} MiB |")
    print(f"| analysis child peak RSS | {child_peak / mib:.0f} MiB |")
    print(f"| wall time | {wall_s:.1f} s |")


if __name__ == "__main__":
    main()
