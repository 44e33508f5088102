"""Small hand-made Chrome traces for the loader tests."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

SHARED_TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"


def provenance_trace_names() -> set[str]:
    """The trace files PROVENANCE.md's tables list (first cell of each row), read at test time.

    Tests that enumerate the folder compare its files with this set, so a missing folder or
    file fails instead of making a parametrised test vacuous, and a new trace is picked up.
    """
    text = (SHARED_TRACES / "PROVENANCE.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\|\s*([\w.\-]+\.json\.gz)\s*\|", text, flags=re.MULTILINE))


def kernel(ts: float, dur: float, *, correlation: int = 1, stream: int = 7) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": "volta_sgemm_128x64_nn",
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"device": 0, "stream": stream, "correlation": correlation, "External id": 5},
    }


def cpu_op(name: str, ts: float, dur: float, *, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur}


def runtime(ts: float, dur: float, *, correlation: int = 1) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 100,
        "tid": 100,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": correlation, "External id": 5},
    }


def small_events() -> list[dict[str, Any]]:
    """One profiler step: an operator launching one kernel, plus a flow pair and metadata."""
    return [
        {"name": "process_name", "ph": "M", "pid": 100, "tid": 0, "args": {"name": "python"}},
        {"name": "thread_name", "ph": "M", "pid": 100, "tid": 100, "args": {"name": "main"}},
        cpu_op("ProfilerStep#1", 0.0, 100.0, cat="user_annotation"),
        cpu_op("aten::mm", 10.0, 30.0),
        runtime(15.0, 5.0),
        {"ph": "s", "id": 1, "pid": 100, "tid": 100, "ts": 15.0, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 25.0, "cat": "ac2g", "name": "ac2g"},
        kernel(25.0, 50.0),
    ]


def trace_doc(events: list[Any], **top: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, **top, "traceEvents": events}


def write_json(path: Path, doc: Any, *, indent: int | None = None, gz: bool = False) -> Path:
    text = json.dumps(doc, indent=indent).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


def union_us(ranges) -> float:
    """Length of the union of (start, end) ranges: the plain-Python oracle of the tests."""
    total, current = 0.0, None
    for start, end in sorted(ranges):
        if current is None or start > current[1]:
            total += current[1] - current[0] if current else 0.0
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    return total + (current[1] - current[0] if current else 0.0)


# a real rank (69k events, 14.7 MiB of JSON): the cheapest real one to read several times
SMALL_REAL_RANK = SHARED_TRACES / "hta_v100_ns_timestamps.pt.trace.json.gz"


def write_rank_copies(folder: Path, ranks: list[int], source: Path = SMALL_REAL_RANK) -> list[Path]:
    """Copies of one real trace as the given ranks (``distributedInfo.rank``; the files are
    named partN, so the rank is read from the file, not its name)."""
    import msgspec

    with gzip.open(source, "rb") as handle:
        doc = msgspec.json.decode(handle.read())
    files = []
    for rank in ranks:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": len(ranks)}
        path = folder / f"part{rank}.json.gz"
        with gzip.open(path, "wb", compresslevel=1) as out:
            out.write(msgspec.json.encode(doc))
        files.append(path)
    return files
