"""LMDB reads counted by the probe: what a step record's store fields say, in process.

The oracle is the test's own arithmetic over the reads it makes (one transaction per key
is one read per key; one ``getmulti`` in one transaction is one read), the values come
back as the unpatched library returns them, and DataLoader workers' reads reach the main
process with their batch. The real lmdb package and real DataLoader workers, no mocks.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from probe.integrations import Integrations
from probe.key_values import READS, CountedBatch, DataLoaderPlumbing
from tests.probe.helpers import child_env

KEYS = 64
DIM = 4


def key_of(index: int) -> bytes:
    return index.to_bytes(8, "big")


def _vector(index: int) -> np.ndarray:
    return np.full(DIM, float(index), dtype=np.float32)


@pytest.fixture
def lmdb_patched():
    """The lmdb module as a profiled script sees it; the process's counter reset around."""
    notes: list[str] = []
    integrations = Integrations(notes.append)
    READS.__init__()
    integrations.install()
    import lmdb

    try:
        yield lmdb, notes
    finally:
        integrations.uninstall()
        READS.__init__()  # inactive again: no other test's session records store fields


@pytest.fixture
def store(tmp_path, lmdb_patched):
    lmdb, _ = lmdb_patched
    path = str(tmp_path / "store")
    env = lmdb.open(path, map_size=2**22)
    with env.begin(write=True) as txn:
        for index in range(KEYS):
            txn.put(key_of(index), _vector(index).tobytes())
    env.close()
    READS.take()  # the build's own activity is not part of any test's count
    return path


def test_the_proxies_stand_in_for_lmdb_and_uninstall_restores_it(lmdb_patched, store):
    lmdb, _ = lmdb_patched
    import lmdb.cpython as real

    env = lmdb.open(store, readonly=True, lock=False)
    assert isinstance(env, lmdb.Environment) and lmdb.open is lmdb.Environment
    assert type(env) is not real.Environment  # a proxy: the C type cannot be patched
    with env.begin() as txn:
        assert txn.get(key_of(3)) == _vector(3).tobytes()
        assert txn.get(b"missing", b"default") == b"default"
        assert sum(1 for _ in txn.cursor()) == KEYS  # iteration is the real cursor's
    assert env.stat()["entries"] == KEYS  # what is not timed passes through
    txn = lmdb.Transaction(env)  # built from the proxy: the real environment underneath
    assert txn.get(key_of(7)) == _vector(7).tobytes()
    txn.abort()
    env.close()


def test_one_transaction_per_key_is_one_read_per_key(lmdb_patched, store):
    lmdb, _ = lmdb_patched
    env = lmdb.open(store, readonly=True, lock=False)
    started = time.perf_counter()
    for index in range(5):
        with env.begin() as txn:
            txn.get(key_of(index))
    wall_ms = (time.perf_counter() - started) * 1e3
    taken = READS.take()
    assert (taken["store_reads"], taken["store_keys"]) == (5, 5)
    # the library's time inside the calls: some, and less than the loop around them took
    assert 0.0 < taken["store_read_ms"] < wall_ms


def test_getmulti_or_many_gets_in_one_transaction_is_one_read(lmdb_patched, store):
    lmdb, _ = lmdb_patched
    env = lmdb.open(store, readonly=True, lock=False)
    with env.begin() as txn:
        found = dict(txn.cursor().getmulti([key_of(i) for i in (1, 2, 3)]))
        single = txn.get(key_of(4))
        with txn.cursor() as cursor:
            by_cursor = cursor.get(key_of(5))
    assert found == {key_of(i): _vector(i).tobytes() for i in (1, 2, 3)}
    assert (single, by_cursor) == (_vector(4).tobytes(), _vector(5).tobytes())
    taken = READS.take()
    assert (taken["store_reads"], taken["store_keys"]) == (1, 3 + 1 + 1)


def test_a_transaction_kept_open_counts_once_in_each_step_it_reads_in(lmdb_patched, store):
    lmdb, _ = lmdb_patched
    env = lmdb.open(store, readonly=True, lock=False)
    txn = env.begin()
    for index in range(3):
        txn.get(key_of(index))
    first = READS.take()
    txn.get(key_of(9))
    second = READS.take()
    third = READS.take()  # a step without a read
    txn.abort()
    assert (first["store_reads"], first["store_keys"]) == (1, 3)
    assert (second["store_reads"], second["store_keys"]) == (1, 1)
    assert (third["store_reads"], third["store_keys"], third["store_read_ms"]) == (0, 0, 0.0)


def test_writes_are_not_reads(lmdb_patched, tmp_path):
    lmdb, _ = lmdb_patched
    env = lmdb.open(str(tmp_path / "w"), map_size=2**20)
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    taken = READS.take()
    assert (taken["store_reads"], taken["store_keys"], taken["store_read_ms"]) == (0, 0, 0.0)


def test_each_reading_line_is_named_with_its_calls_and_keys(lmdb_patched, store):
    lmdb, _ = lmdb_patched
    env = lmdb.open(store, readonly=True, lock=False)

    def read_each(indices):
        for index in indices:
            with env.begin() as txn:
                get_line = sys._getframe().f_lineno + 1
                txn.get(key_of(index))
        return get_line

    get_line = read_each(range(KEYS))
    with env.begin() as txn:
        multi_line = sys._getframe().f_lineno + 1
        txn.cursor().getmulti(key_of(i) for i in range(10))  # a generator: 10 keys
    READS.take()
    summary = READS.summary(base=None)
    by_line = {site["line"]: site for site in summary["sites"]}
    assert by_line[get_line]["call"] == "Transaction.get"
    assert by_line[get_line]["function"].endswith("read_each")
    # one single-key read in 16 notes its line, for 16 (SITE_SAMPLE): 64 = 4 x 16
    assert (by_line[get_line]["calls"], by_line[get_line]["keys"]) == (KEYS, KEYS)
    assert (by_line[multi_line]["call"], by_line[multi_line]["keys"]) == ("Cursor.getmulti", 10)
    assert by_line[get_line]["code"] == "txn.get(key_of(index))"
    assert (summary["library"], summary["reads"], summary["keys"]) == ("lmdb", KEYS + 1, KEYS + 10)


class LmdbRows(Dataset):
    """One transaction and one get per sample, the environment opened where it is read."""

    def __init__(self, path: str):
        self.path = path
        self.env = None

    def __len__(self) -> int:
        return KEYS

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.env is None:
            import lmdb

            self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False)
        with self.env.begin() as txn:
            raw = txn.get(key_of(index))
        return torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy())


@pytest.fixture
def plumbing():
    notes: list[str] = []
    hooks = DataLoaderPlumbing(notes.append)
    hooks.install()
    try:
        yield notes
    finally:
        hooks.uninstall()


def test_workers_reads_come_back_with_their_batch(store, plumbing):
    batch_size = 8
    dataset = LmdbRows(store)
    dataset[0]  # a read in the main process, not yet taken when the workers fork
    dataset.env = None  # as the script would: the environment is not used across the fork
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=2)
    per_batch = []
    rows = []
    for batch in loader:
        assert type(batch) is torch.Tensor  # unwrapped before the script sees it
        rows.append(batch[:, 0])
        taken = READS.take()
        per_batch.append((taken["store_reads"], taken["store_keys"]))
    # each sample's own transaction, read in a forked worker, counted in the main process;
    # the main process's read once, in the first step, not again in a worker's batch
    expected = [(batch_size, batch_size)] * (KEYS // batch_size)
    expected[0] = (batch_size + 1, batch_size + 1)
    assert per_batch == expected
    assert torch.cat(rows).tolist() == [float(i) for i in range(KEYS)]
    sites = READS.summary(base=None)["sites"]
    assert [site["function"] for site in sites] == ["LmdbRows.__getitem__"]
    assert plumbing == []


def test_spawned_workers_reads_are_unknown_not_zero(store, plumbing):
    loader = DataLoader(
        LmdbRows(store), batch_size=32, num_workers=1, multiprocessing_context="spawn"
    )
    fields = []
    for _ in loader:
        fields.append(READS.take())
    assert fields == [dict.fromkeys(("store_reads", "store_keys", "store_read_ms"))] * 2
    assert any("spawn" in note for note in plumbing)


def test_a_counted_batch_survives_the_pickling_of_the_worker_queue():
    import pickle

    batch = CountedBatch(torch.arange(3), "lmdb", 2, 5, 0.25, {("f.py", 3): ["x", "g", 1, 5]})
    copy = pickle.loads(pickle.dumps(batch))
    assert copy.batch.tolist() == [0, 1, 2]
    assert (copy.library, copy.reads, copy.keys, copy.seconds) == ("lmdb", 2, 5, 0.25)
    assert copy.sites == {("f.py", 3): ["x", "g", 1, 5]}


def test_a_script_without_lmdb_never_imports_it_and_gets_its_batches_bare():
    code = """
import sys
from torch.utils.data import DataLoader
from probe.integrations import Integrations
from probe.key_values import READS, DataLoaderPlumbing
Integrations(print).install()
DataLoaderPlumbing(print).install()
batches = list(DataLoader(list(range(8)), batch_size=4, num_workers=2))
print('lmdb' in sys.modules, READS.active, [type(b).__name__ for b in batches])
"""
    result = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False False ['Tensor', 'Tensor']"


def test_both_record_paths_carry_the_store_fields_and_only_when_given():
    from probe.step_values import HOST_FIELDS, host_step_record, step_record

    row = (3, "train", 100.0, 256, 1 << 20, False, None, 1.0, 1.5, 0.1, None, None, 0.2)
    store = {"store_reads": 256, "store_keys": 256, "store_read_ms": 0.4}
    cpu = host_step_record(row, 0.5, 2.0, None, store)
    cpu_without = host_step_record(row, 0.5, 2.0, None)
    # the CUDA path: the host's figures with the store's, completed by step_record
    cuda = step_record({**dict(zip(HOST_FIELDS, row, strict=True)), **store}, {}, host_clock=False)
    for record in (cpu, cuda):
        assert {k: record[k] for k in store} == store
    assert not set(store) & set(cpu_without)
