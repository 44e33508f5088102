"""Benchmark: inflating a gzip trace with ISA-L (``isal``) against stdlib zlib.

Both go through the trace source's own reader (``iter_blocks`` -> ``_gunzip``: 1 MiB reads,
1 MiB blocks, the byte budget) with the inflater forced (``inflater=ZLIB`` / ``ISAL``), in
one process, alternating the two for ``--rounds`` rounds after a warm-up round that is not
reported (it also checks both give the same bytes: a SHA-256 of the blocks); medians of wall
and CPU time. Inputs:

* the largest shared trace, ``../shared/traces/hta_v100_rank1_of_2_large.json.gz``;
* a synthetic trace of about ``--synthetic-mb`` MiB of JSON (default 1024; 0 skips it),
  the large trace's steps repeated with shifted timestamps and ids by
  ``bench_analyzer.write_synthetic``, gzipped at level 6 into a temporary folder, deleted
  after. Writing it takes a minute or two on the 2-core host.

Blocks are only counted, not decoded: this is the inflate cost alone. The analysis runs it
in a prefetch thread beside the JSON decode (``bench/bench_analyzer.py`` times the whole).

    .venv/bin/python bench/bench_inflate.py                     # large trace + ~1 GB
    .venv/bin/python bench/bench_inflate.py --synthetic-mb 0    # the large trace only
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
import zlib
from importlib.metadata import version
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from bench_analyzer import LARGE, TRACES, write_synthetic  # noqa: E402

from diagnostics.trace.source import ISAL, ZLIB, Inflater, iter_blocks  # noqa: E402

MIB = 1 << 20
NO_CAP = 1 << 45  # the default 2 GiB budget would stop a large synthetic trace


def inflate(path: Path, inflater: Inflater, digest: bool = False) -> tuple[float, float, int, str]:
    """(wall s, CPU s, bytes inflated, SHA-256 of them when ``digest``)."""
    sha = hashlib.sha256() if digest else None
    size = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for block in iter_blocks(path, max_bytes=NO_CAP, inflater=inflater):
        size += len(block)
        if sha is not None:
            sha.update(block)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, size, sha.hexdigest() if sha is not None else ""


def gzip_file(source: Path, target: Path, level: int = 6) -> None:
    packer = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with source.open("rb") as src, target.open("wb") as out:
        while chunk := src.read(16 * MIB):
            out.write(packer.compress(chunk))
        out.write(packer.flush())


def measure(name: str, path: Path, rounds: int) -> dict:
    warm = {inf.name: inflate(path, inf, digest=True) for inf in (ZLIB, ISAL)}
    (_, _, size_z, sha_z), (_, _, size_i, sha_i) = warm["zlib"], warm["isal"]
    if (size_z, sha_z) != (size_i, sha_i):
        raise SystemExit(f"error: {name}: zlib and isal inflate to different bytes")
    times: dict[str, list[tuple[float, float]]] = {"zlib": [], "isal": []}
    for round_ in range(rounds):
        order = (ZLIB, ISAL) if round_ % 2 == 0 else (ISAL, ZLIB)
        for inf in order:
            wall, cpu, _, _ = inflate(path, inf)
            times[inf.name].append((wall, cpu))
    row = {"name": name, "packed": path.stat().st_size, "size": size_z}
    for lib, runs in times.items():
        row[lib] = (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (medians)")
    parser.add_argument(
        "--synthetic-mb", type=int, default=1024, help="synthetic trace, MiB of JSON (0: none)"
    )
    args = parser.parse_args(argv)
    if ISAL is None:
        print("error: isal is not installed (requirements.txt pins it)", file=sys.stderr)
        return 2
    large = TRACES / LARGE
    if not large.exists():
        print(f"error: {large} is missing", file=sys.stderr)
        return 2
    rows = [measure(large.name.removesuffix(".json.gz"), large, args.rounds)]
    if args.synthetic_mb:
        with tempfile.TemporaryDirectory(prefix="pd-bench-inflate-") as folder:
            plain = Path(folder) / "synthetic.json"
            started = time.perf_counter()
            with plain.open("wb") as out:
                written, events = write_synthetic(large, out, args.synthetic_mb * MIB)
            packed = plain.with_suffix(".json.gz")
            gzip_file(plain, packed)
            plain.unlink()
            print(
                f"synthetic: {written / MIB:,.0f} MiB of JSON, {events:,} events, gzip level 6 "
                f"to {packed.stat().st_size / MIB:,.0f} MiB in {time.perf_counter() - started:.0f} s"
            )
            rows.append(measure(f"synthetic ({events:,} events)", packed, args.rounds))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"isal {version('isal')} against zlib {zlib.ZLIB_RUNTIME_VERSION}; {os.cpu_count()} "
        f"CPUs, load average {load}; median of {args.rounds} alternated rounds after a warm-up"
    )
    print()
    print(
        "| gzip trace | gzip MiB | JSON MiB | zlib s | zlib MiB/s | isal s | isal MiB/s "
        "| zlib ÷ isal, wall | zlib ÷ isal, CPU |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        (zw, zc), (iw, ic) = r["zlib"], r["isal"]
        mib = r["size"] / MIB
        print(
            f"| {r['name']} | {r['packed'] / MIB:,.1f} | {mib:,.0f} | {zw:.2f} | {mib / zw:,.0f} "
            f"| {iw:.2f} | {mib / iw:,.0f} | {zw / iw:.2f}× | {zc / ic:.2f}× |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
