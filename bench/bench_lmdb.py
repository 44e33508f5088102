"""Benchmark: one ``get`` per key against ``batch_get`` on the same sharded LMDB store.

Builds one store per shard count (1, 4 and 16 by default) from the same vectors, then
reads the same random keys in batches of ``--batch`` both ways, alternating the two for
``--rounds`` rounds so that both see the same drift in the machine's load:

- ``get``: what a per-sample ``__getitem__`` does, one read transaction and one tensor per
  key (``EmbeddingStore.get``);
- ``batch_get``: what ``__getitems__`` does, one read transaction per shard touched, keys
  sorted, ``Cursor.getmulti``, one tensor per batch.

``--latency-ms 0`` is the local LMDB cost alone. A positive value adds a simulated round
trip per read transaction (``data.store_latency_ms``, a remote key-value store), which
batching pays once per shard instead of once per key; those rows read ``--latency-batches``
batches a round. The store is warm in the page cache after building; the first round is a
warm-up and not reported.

    .venv/bin/python bench/bench_lmdb.py                          # 200k keys, dim 64
    .venv/bin/python bench/bench_lmdb.py --keys 1000000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from trainer.embedding_store import EmbeddingStore, build_store  # noqa: E402

GUIDE_RATIO = 50.0  # the field guide: batch_get about 50x faster than one get per key


def _time_gets(store: EmbeddingStore, batches: list[list[int]]) -> float:
    started = time.perf_counter()
    for batch in batches:
        for key in batch:
            store.get(key)
    return time.perf_counter() - started


def _time_batch_gets(store: EmbeddingStore, batches: list[list[int]]) -> float:
    started = time.perf_counter()
    for batch in batches:
        store.batch_get(batch)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=100, help="batches read per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--latency-batches", type=int, default=10)
    args = parser.parse_args(argv)

    vectors = np.random.default_rng(0).standard_normal((args.keys, args.dim), dtype=np.float32)
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, args.keys, args.batch).tolist() for _ in range(args.batches)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shards in args.shards:
            started = time.perf_counter()
            root = build_store(Path(tmp) / f"store-{shards}", vectors, shards=shards)
            build_s = time.perf_counter() - started
            for latency_ms in args.latency_ms:
                store = EmbeddingStore(root, read_latency_ms=latency_ms)
                chosen = batches[: args.latency_batches] if latency_ms else batches
                reads = args.batch * len(chosen)
                single, batched = [], []
                for round_ in range(args.rounds + 1):
                    one, many = _time_gets(store, chosen), _time_batch_gets(store, chosen)
                    if round_:  # round 0 warms the environments and the page cache
                        single.append(one)
                        batched.append(many)
                one_us = statistics.median(single) / reads * 1e6
                many_us = statistics.median(batched) / reads * 1e6
                rows.append((shards, latency_ms, build_s, one_us, many_us, one_us / many_us))
    print(
        f"{args.keys} keys x {args.dim} float16, batches of {args.batch}, "
        f"{args.batches} batches a round, median of {args.rounds} rounds"
    )
    print()
    print(
        "| shards | round trip per read (ms) | build (s) | get, µs/key | batch_get, µs/key "
        "| speed-up | against the guide's 50× |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for shards, latency_ms, build_s, one_us, many_us, ratio in rows:
        print(
            f"| {shards} | {latency_ms:g} | {build_s:.1f} | {one_us:.2f} | {many_us:.2f} | "
            f"{ratio:.1f}× | {ratio / GUIDE_RATIO:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
