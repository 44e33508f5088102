"""The sharded LMDB embedding store: get and batch_get agree with what was written, the
shard of a key is stable, readers open after a fork, and the per-sample and batched dataset
paths give the same batches through a real DataLoader with different read counts."""

from __future__ import annotations

import multiprocessing
import zlib

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from trainer.config import DataConfig, ModelConfig
from trainer.data import (
    ShardedTransactionDataset,
    TransactionDataset,
    load_corpus,
    take_store_counts,
)
from trainer.embedding_store import EmbeddingStore, build_store, shard_of
from trainer.model import MultiTaskModel

ROWS, DIM = 300, 8


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((ROWS, DIM))


@pytest.fixture(scope="module")
def store_root(tmp_path_factory, vectors):
    return build_store(tmp_path_factory.mktemp("store") / "embeddings", vectors, shards=4)


def _expected(vectors: np.ndarray, keys: list[int]) -> torch.Tensor:
    # what was written: float16 bytes, read back as float32
    return torch.from_numpy(vectors[keys].astype(np.float16).astype(np.float32))


def test_get_and_batch_get_return_the_written_vectors(store_root, vectors):
    store = EmbeddingStore(store_root)
    assert not store.is_open  # opened by the first read, in the process that reads
    for key in (0, 1, 137, ROWS - 1):
        assert torch.equal(store.get(key), _expected(vectors, [key])[0])
    keys = [299, 3, 150, 3, 42, 0]  # unsorted, with a duplicate: the answer keeps the order
    assert torch.equal(store.batch_get(keys), _expected(vectors, keys))
    assert store.is_open


def test_batch_get_makes_one_read_per_shard_touched(store_root):
    store = EmbeddingStore(store_root)
    keys = list(range(0, 64, 3))
    store.batch_get(keys)
    # the shard of a key, from crc32 of its 8 big-endian bytes, computed here independently
    shards = {zlib.crc32(k.to_bytes(8, "big")) % 4 for k in keys}
    assert store.take_counts()[:2] == (len(shards), len(keys))
    for key in keys:
        store.get(key)
    assert store.take_counts()[:2] == (len(keys), len(keys))


def test_the_shard_of_a_key_is_crc32_not_the_salted_hash():
    assert shard_of(5, 16) == zlib.crc32(b"\0\0\0\0\0\0\0\x05") % 16
    assert {shard_of(k, 4) for k in range(100)} == {0, 1, 2, 3}


def test_a_missing_key_is_a_key_error_naming_the_store(store_root):
    store = EmbeddingStore(store_root)
    with pytest.raises(KeyError, match="no vector for key 300"):
        store.get(ROWS)
    with pytest.raises(KeyError, match="no vector for key 1000"):
        store.batch_get([1, 1000])


def _read_in_child(store: EmbeddingStore, queue) -> None:
    queue.put((store.is_open, store.get(11).numpy(), store.batch_get([5, 250, 11]).numpy()))


def test_a_store_opened_before_fork_reads_correctly_in_the_child(store_root, vectors):
    store = EmbeddingStore(store_root)
    parent_value = store.get(11)  # the parent's environments are open now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(store, queue))
    child.start()
    open_in_child, one, many = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert not open_in_child  # the inherited handles were not the child's to use
    assert torch.equal(torch.from_numpy(one), parent_value)
    assert torch.equal(torch.from_numpy(many), _expected(vectors, [5, 250, 11]))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return load_corpus(DataConfig(rows=300), seed=0, cache_dir=tmp_path_factory.mktemp("cache"))


def _batches(corpus, store_root, *, batched: bool, workers: int) -> list[dict]:
    store = EmbeddingStore(store_root)
    dataset = TransactionDataset(
        corpus.train_texts,
        corpus.train_labels,
        corpus.tokenizer,
        store=store,
        store_batched=batched,
    )
    sampler = BatchSampler(SequentialSampler(range(64)), batch_size=16, drop_last=True)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=workers)
    out = []
    for batch in loader:
        counts = take_store_counts(batch)
        out.append({**batch, **counts})
    assert not store.is_open  # with workers, only they opened it
    return out


def test_per_sample_and_batched_loaders_give_the_same_batches(corpus, store_root, vectors):
    per_sample = _batches(corpus, store_root, batched=False, workers=1)
    batched = _batches(corpus, store_root, batched=True, workers=1)
    assert len(per_sample) == len(batched) == 4
    for number, (one, many) in enumerate(zip(per_sample, batched, strict=True)):
        keys = list(range(16 * number, 16 * (number + 1)))
        assert torch.equal(one["store_vectors"], _expected(vectors, keys))
        assert torch.equal(many["store_vectors"], one["store_vectors"])
        assert torch.equal(many["input_ids"], one["input_ids"])
        assert one["store_reads"] == one["store_keys"] == 16  # one read per sample
        shards = {zlib.crc32(k.to_bytes(8, "big")) % 4 for k in keys}
        assert (many["store_reads"], many["store_keys"]) == (len(shards), 16)
        assert "store_read_ms" in one and "store_read_ms" in many


def _model(store_dim: int) -> MultiTaskModel:
    torch.manual_seed(0)
    return MultiTaskModel(
        ModelConfig(hidden_size=32, layers=1, heads=2, intermediate_size=64),
        vocab_size=100,
        max_length=16,
        num_categories=3,
        num_merchant_types=2,
        pad_id=0,
        store_dim=store_dim,
    )


def test_without_a_store_the_model_is_unchanged_and_with_one_it_reads_the_vectors():
    plain, with_store = _model(0), _model(DIM)
    assert plain.store_projection is None
    plain_state, store_state = plain.state_dict(), with_store.state_dict()
    # every weight but the projection draws the same initial values
    assert set(store_state) - set(plain_state) == {
        "store_projection.weight",
        "store_projection.bias",
    }
    for name, value in plain_state.items():
        assert torch.equal(value, store_state[name]), name
    ids = torch.randint(1, 100, (4, 16))
    mask = torch.ones_like(ids)
    labels = torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)
    zeros, ones = torch.zeros(4, DIM), torch.ones(4, DIM)
    a = with_store(ids, mask, *labels, zeros).category_logits
    b = with_store(ids, mask, *labels, ones).category_logits
    assert not torch.equal(a, b)


def test_a_second_build_of_the_same_store_keeps_the_first(store_root, vectors):
    # two ranks of one job build the run's store at once: the loser's copy is dropped
    build_store(store_root, vectors, shards=4)
    assert sorted(p.name for p in store_root.parent.iterdir()) == ["embeddings"]
    assert torch.equal(EmbeddingStore(store_root).get(3), _expected(vectors, [3])[0])


def _sharded_batches(corpus, store_root, *, batched: bool, workers: int) -> list[dict]:
    store = EmbeddingStore(store_root)
    base = TransactionDataset(
        corpus.train_texts[:96],
        corpus.train_labels[:96],
        corpus.tokenizer,
        store=store,
        store_batched=batched,
    )
    # rows tagged with their index (as the labels), so each batch's keys are known
    base.labels = torch.stack([torch.arange(96), torch.zeros(96, dtype=torch.long)], dim=1)
    sharded = ShardedTransactionDataset(base, 5, seed=0, phase="finetune", batch_size=16)
    loader = DataLoader(sharded, batch_size=16, num_workers=workers)
    return [{**batch, **take_store_counts(batch)} for batch in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_sharded_dataset_reads_a_batch_at_a_time_when_batched(
    corpus, store_root, vectors, workers
):
    per_sample = _sharded_batches(corpus, store_root, batched=False, workers=workers)
    batched = _sharded_batches(corpus, store_root, batched=True, workers=workers)
    assert len(per_sample) == len(batched) > 0
    assert sum(len(b["category"]) for b in batched) == 96  # every row once
    for one, many in zip(per_sample, batched, strict=True):
        keys = one["category"].tolist()
        assert many["category"].tolist() == keys  # the same stream, the same batches
        assert torch.equal(many["store_vectors"], _expected(vectors, keys))
        assert torch.equal(one["store_vectors"], many["store_vectors"])
        assert one["store_reads"] == one["store_keys"] == len(keys)  # a read per sample
        shards = {zlib.crc32(k.to_bytes(8, "big")) % 4 for k in keys}
        # one read per LMDB shard the batch touches, counted on the batch that made it
        assert (many["store_reads"], many["store_keys"]) == (len(shards), len(keys))
