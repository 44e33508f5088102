"""A sharded LMDB store of precomputed per-transaction feature vectors.

The field guide keeps embeddings that do not fit in memory in LMDB behind a thin wrapper,
sharded by key hash, and reads them in batches (``batch_get``: one read transaction per
shard, keys sorted, ``getmulti``) rather than one ``get`` per key. Both paths are here so
the per-sample-lookups scenario can show the difference.

The shard of a key is ``crc32(key) % shards``: Python's ``hash`` is salted per process, so
a worker would look a key up in another shard than the builder wrote it to.

An environment is opened lazily, in the process that reads: an LMDB environment must not
be used across ``fork``, and the DataLoader forks its workers after the dataset is built.
Readers open it read-only, with ``lock=False`` (nothing writes while training reads) and
``readahead=False`` (random reads: readahead would fill the page cache with neighbours).

``read_latency_ms`` simulates the round trip of a remote key-value store, once per read
transaction: a local LMDB read costs microseconds, which no DataLoader would wait on.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import lmdb
import numpy as np
import torch

STORE_VERSION = 1
META_FILE = "store.json"
# room for the shard's values and LMDB's pages; a store is written once and never grows
_MAP_OVERHEAD = 4 * 2**20
_DTYPES = {"float16": np.float16, "float32": np.float32}


def key_bytes(key: int) -> bytes:
    """A key as LMDB stores it: 8 bytes big-endian, so byte order is numeric order."""
    return int(key).to_bytes(8, "big")


def shard_of(key: int, shards: int) -> int:
    """The shard a key lives in: stable across processes and machines (crc32)."""
    return zlib.crc32(key_bytes(key)) % shards


def shard_path(root: Path, shard: int) -> Path:
    return root / f"shard-{shard:03d}.lmdb"


def build_store(root: Path, vectors: np.ndarray, *, shards: int, dtype: str = "float16") -> Path:
    """Writes row ``i`` of ``vectors`` under key ``i`` into ``shards`` LMDB environments.

    Written into a temporary folder and renamed into place, so a reader never sees half a
    store (a run stopped while building leaves only the temporary folder).
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, not {shards}")
    values = np.ascontiguousarray(vectors, dtype=_DTYPES[dtype])
    root = Path(root)
    tmp = root.with_name(f".{root.name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True, exist_ok=False)
    by_shard: list[list[int]] = [[] for _ in range(shards)]
    for key in range(values.shape[0]):
        by_shard[shard_of(key, shards)].append(key)
    for shard, keys in enumerate(by_shard):
        size = _MAP_OVERHEAD + 2 * len(keys) * (values.itemsize * values.shape[1] + 64)
        env = lmdb.open(str(shard_path(tmp, shard)), map_size=size, subdir=True)
        with env.begin(write=True) as txn:
            for key in keys:  # ascending: append=True skips LMDB's search for the position
                txn.put(key_bytes(key), values[key].tobytes(), append=True)
        env.close()
    meta = {
        "version": STORE_VERSION,
        "shards": shards,
        "rows": int(values.shape[0]),
        "dim": int(values.shape[1]),
        "dtype": dtype,
    }
    (tmp / META_FILE).write_text(json.dumps(meta))
    try:
        tmp.rename(root)
    except OSError:
        if not (root / META_FILE).exists():
            raise
        # another process (a rank of the same job) built the same store first: same bytes
        shutil.rmtree(tmp, ignore_errors=True)
    return root


class EmbeddingStore:
    """Read side of :func:`build_store`: ``get`` one key, ``batch_get`` many.

    Counts what it did (``reads``: read transactions, ``keys``: values fetched,
    ``read_s``: time inside them, the simulated latency included) so the dataset can hand
    the figures to the step record; ``take_counts`` returns and resets them.
    """

    def __init__(self, root: Path, *, read_latency_ms: float = 0.0):
        self.root = Path(root)
        meta = json.loads((self.root / META_FILE).read_text())
        if meta.get("version") != STORE_VERSION:
            raise ValueError(f"{self.root / META_FILE}: store version {meta.get('version')!r}")
        self.shards = int(meta["shards"])
        self.rows = int(meta["rows"])
        self.dim = int(meta["dim"])
        self.dtype = np.dtype(_DTYPES[meta["dtype"]])
        self.read_latency_s = read_latency_ms / 1000.0
        self._envs: list[lmdb.Environment] | None = None
        self._opened_in: int | None = None
        self.reads = 0
        self.keys = 0
        self.read_s = 0.0

    def __getstate__(self) -> dict:
        # a dataset pickled to a spawned worker carries no open environment
        state = dict(self.__dict__)
        state["_envs"], state["_opened_in"] = None, None
        return state

    def _environments(self) -> list[lmdb.Environment]:
        pid = os.getpid()
        if self._envs is None or self._opened_in != pid:
            # a forked child inherits the parent's handles; it must not use them
            self._envs = _open_readonly(self.root, self.shards)
            self._opened_in = pid
        return self._envs

    @property
    def is_open(self) -> bool:
        return self._envs is not None and self._opened_in == os.getpid()

    def _decode(self, key: int, raw: bytes | None) -> np.ndarray:
        if raw is None:
            raise KeyError(f"{self.root}: no vector for key {key}")
        return np.frombuffer(raw, dtype=self.dtype)

    def get(self, key: int) -> torch.Tensor:
        """One key, one read transaction: the per-sample path."""
        envs = self._environments()
        started = time.perf_counter()
        with envs[shard_of(key, self.shards)].begin(buffers=False) as txn:
            if self.read_latency_s:
                time.sleep(self.read_latency_s)
            raw = txn.get(key_bytes(key))
        self.read_s += time.perf_counter() - started
        self.reads += 1
        self.keys += 1
        return torch.from_numpy(self._decode(key, raw).astype(np.float32))

    def batch_get(self, keys: Sequence[int]) -> torch.Tensor:
        """``(len(keys), dim)`` float32, in the order of ``keys``: one read transaction per
        shard touched, each reading its keys in sorted order with ``getmulti``."""
        envs = self._environments()
        keys = [int(key) for key in keys]
        raw_keys = [key_bytes(key) for key in keys]
        out = np.empty((len(keys), self.dim), dtype=np.float32)
        by_shard: dict[int, list[int]] = {}
        for position, raw_key in enumerate(raw_keys):
            by_shard.setdefault(zlib.crc32(raw_key) % self.shards, []).append(position)
        started = time.perf_counter()
        for shard, positions in by_shard.items():
            # byte order is numeric order, LMDB's B-tree order: fewer page jumps
            positions.sort(key=raw_keys.__getitem__)
            wanted = [raw_keys[p] for p in positions]
            with envs[shard].begin(buffers=False) as txn:
                if self.read_latency_s:
                    time.sleep(self.read_latency_s)
                with txn.cursor() as cursor:
                    found = cursor.getmulti(wanted)
            if len(found) != len(wanted):  # getmulti leaves missing keys out
                present = {raw_key for raw_key, _ in found}
                missing = next(
                    p for p, k in zip(positions, wanted, strict=True) if k not in present
                )
                self._decode(keys[missing], None)
            # one decode per shard, not one per key
            values = np.frombuffer(b"".join(value for _, value in found), dtype=self.dtype)
            out[positions] = values.reshape(len(positions), self.dim)
        self.read_s += time.perf_counter() - started
        self.reads += len(by_shard)
        self.keys += len(keys)
        return torch.from_numpy(out)

    def take_counts(self) -> tuple[int, int, float]:
        """(reads, keys, read ms) since the last call; resets them."""
        counts = (self.reads, self.keys, self.read_s * 1000.0)
        self.reads, self.keys, self.read_s = 0, 0, 0.0
        return counts

    def close(self) -> None:
        """Forgets this reader's handles; the process's environments stay open for others."""
        self._envs, self._opened_in = None, None


# (pid, store folder) -> its open environments. LMDB refuses to open one environment twice
# in a process, and the training and validation datasets read the same store.
_OPEN: dict[tuple[int, Path], list[lmdb.Environment]] = {}


def _open_readonly(root: Path, shards: int) -> list[lmdb.Environment]:
    key = (os.getpid(), root.resolve())
    envs = _OPEN.get(key)
    if envs is None:
        for stale in [k for k in _OPEN if k[0] != key[0]]:
            # the parent's, inherited through fork: py-lmdb still counts them as open here
            # (it keys open environments by file), so closing them in this process is
            # what lets it open its own; the parent's stay open
            for env in _OPEN.pop(stale):
                env.close()
        envs = [
            lmdb.open(
                str(shard_path(root, shard)),
                readonly=True,
                lock=False,
                readahead=False,
                subdir=True,
            )
            for shard in range(shards)
        ]
        _OPEN[key] = envs
    return envs


def transaction_features(
    amounts: np.ndarray, weekdays: np.ndarray, dim: int, seed: int
) -> np.ndarray:
    """A fixed feature vector per transaction: log amount and weekday, projected to ``dim``.

    Deterministic in (seed, inputs), so a resumed run rebuilds the same store.
    """
    base = np.zeros((len(amounts), 8), dtype=np.float64)
    base[:, 0] = np.log1p(np.asarray(amounts, dtype=np.float64)) / 8.0
    base[np.arange(len(weekdays)), 1 + np.asarray(weekdays, dtype=np.int64) % 7] = 1.0
    projection = np.random.default_rng([seed, STORE_VERSION]).standard_normal((8, dim))
    return base @ projection / np.sqrt(8.0)
