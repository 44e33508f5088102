"""Datasets and DataLoaders over the synthetic transaction corpus.

Data order is a pure function of (seed, phase, epoch): the map-style sampler draws its
permutation from that key and the sharded dataset its shard order, so a resumed run can
start an epoch part-way through and see exactly the batches an uninterrupted run would.
Nothing in a worker touches the global RNG (augmentation noise is keyed by sample index),
which keeps batches identical whatever the worker count or process.
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing
from tokenizers import Tokenizer
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    Sampler,
    default_collate,
    get_worker_info,
)

from trainer.config import DataConfig, split_sizes
from trainer.corpus import (
    CATEGORIES,
    MERCHANT_TYPES,
    load_tokenizer,
    make_corpus,
    save_tokenizer,
    train_tokenizer,
)
from trainer.embedding_store import EmbeddingStore, build_store, transaction_features
from trainer.vocab import ModelVocab, full_vocab, used_id_mask

Sample = dict[str, torch.Tensor]
PHASES = ("pretrain", "finetune")


def order_key(seed: int, phase: str, epoch: int) -> list[int]:
    """The RNG key of one epoch's data order."""
    return [seed, PHASES.index(phase), epoch]


@dataclass
class Corpus:
    """The corpus split into train/validation texts and labels, plus its tokenizer."""

    train_texts: list[str]
    train_labels: np.ndarray  # (n, 2): category_id, merchant_type_id
    val_texts: list[str]
    val_labels: np.ndarray
    tokenizer: Tokenizer
    # per row of the corpus (train then validation): what the embedding store is built from
    amounts: np.ndarray | None = None
    weekdays: np.ndarray | None = None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def pad_id(self) -> int:
        return self.tokenizer.token_to_id("[PAD]")

    @property
    def mask_id(self) -> int:
        return self.tokenizer.token_to_id("[MASK]")

    @property
    def special_ids(self) -> list[int]:
        return [self.tokenizer.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")]


def load_corpus(
    data: DataConfig, seed: int, cache_dir: Path | None, tokenizer_path: Path | None = None
) -> Corpus:
    """The corpus and its tokenizer: the one at ``tokenizer_path`` when it exists (a resumed
    run), else one trained (or taken from the cache) and then saved there."""
    frame = make_corpus(data.rows, seed)
    n_train, _ = split_sizes(data.rows)
    texts = frame["text"].to_list()
    labels = frame.select("category_id", "merchant_type_id").to_numpy()
    if tokenizer_path is not None and tokenizer_path.exists():
        tokenizer = load_tokenizer(tokenizer_path, data.max_length)
    else:
        # the tokenizer learns from the training split only: validation stays unseen text
        tokenizer = train_tokenizer(texts[:n_train], data.vocab_size, data.max_length, cache_dir)
        if tokenizer_path is not None:
            save_tokenizer(tokenizer, tokenizer_path)
    return Corpus(
        texts[:n_train],
        labels[:n_train],
        texts[n_train:],
        labels[n_train:],
        tokenizer,
        amounts=frame["amount"].to_numpy(),
        weekdays=frame["date"].dt.weekday().to_numpy(),
    )


STORE_DIR = "embeddings"  # in the run folder


def open_embedding_store(
    corpus: Corpus, data: DataConfig, seed: int, run_dir: Path
) -> EmbeddingStore | None:
    """The run's store (built on first use: deterministic, so a resumed run that finds it
    reads the same vectors), not yet opened; None when ``data.embedding_store`` is off."""
    if not data.embedding_store:
        return None
    root = run_dir / STORE_DIR
    if not root.exists():
        assert corpus.amounts is not None and corpus.weekdays is not None
        vectors = transaction_features(corpus.amounts, corpus.weekdays, data.embedding_dim, seed)
        build_store(root, vectors, shards=data.embedding_shards)
    return EmbeddingStore(root, read_latency_ms=data.store_latency_ms)


def augment(text: str, seed: int, epoch: int, index: int) -> str:
    """Statement noise for one epoch: a dropped character or a swapped pair, keyed by index.

    Keyed by (seed, epoch, index) rather than drawn from a global RNG so workers, processes
    and resumed runs all produce the same variant.
    """
    rng = np.random.default_rng([seed, epoch, index])
    if len(text) < 4 or rng.random() < 0.5:
        return text
    at = int(rng.integers(1, len(text) - 2))
    if rng.random() < 0.5:
        return text[:at] + text[at + 1 :]
    return text[:at] + text[at + 1] + text[at] + text[at + 2 :]


class TransactionDataset(Dataset[Sample]):
    """Map-style dataset of tokenised transactions.

    With ``tokenize_on_the_fly`` each ``__getitem__`` augments and tokenises its text and
    then sleeps ``sample_latency_ms`` (a read from remote storage): the realistic per-sample
    cost of the slow-loader scenario. Otherwise the whole split is tokenised once up front.

    ``apply_id_map`` renumbers the ids fed to the model (a pruned vocabulary): the cached
    ids once, in one index lookup; on the fly, each sample's ids as it is tokenised.
    """

    def __init__(
        self,
        texts: Sequence[str],
        labels: np.ndarray,
        tokenizer: Tokenizer,
        *,
        tokenize_on_the_fly: bool = False,
        augmenting: bool = False,
        sample_latency_ms: float = 0.0,
        seed: int = 0,
        store: EmbeddingStore | None = None,
        store_batched: bool = False,
        first_key: int = 0,
    ):
        self.texts = list(texts)
        # the store opens itself in the process that reads it (after the DataLoader's fork)
        self.store = store
        self.store_batched = store_batched
        self.first_key = first_key  # store key of row 0: validation rows follow training's
        self.labels = torch.as_tensor(labels, dtype=torch.long)
        self.tokenizer = tokenizer
        self.tokenize_on_the_fly = tokenize_on_the_fly
        self.augmenting = augmenting
        self.sample_latency_s = sample_latency_ms / 1000.0
        self.seed = seed
        self.epoch = 0
        self._ids: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self.id_map: torch.Tensor | None = None
        if not tokenize_on_the_fly:
            encoded = tokenizer.encode_batch(self.texts)
            self._ids = torch.tensor([e.ids for e in encoded], dtype=torch.long)
            self._mask = torch.tensor([e.attention_mask for e in encoded], dtype=torch.long)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def apply_id_map(self, lookup: torch.Tensor) -> None:
        """Feeds ``lookup[id]`` instead of each tokenizer id from now on (once per dataset)."""
        if self.id_map is not None:
            raise RuntimeError("the dataset's ids are already remapped")
        self.id_map = lookup
        if self._ids is not None:
            self._ids = lookup[self._ids]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, key: int | tuple[int, int], *, read_store: bool = True) -> Sample:
        # (epoch, index) from EpochSampler: the epoch travels with the index, so a worker
        # (persistent or not) augments for the right epoch without shared state
        epoch, index = key if isinstance(key, tuple) else (self.epoch, key)
        if self._ids is not None and self._mask is not None:
            ids, mask = self._ids[index], self._mask[index]
        else:
            text = self.texts[index]
            if self.augmenting:
                text = augment(text, self.seed, epoch, index)
            encoding = self.tokenizer.encode(text)
            ids = torch.tensor(encoding.ids, dtype=torch.long)
            if self.id_map is not None:
                ids = self.id_map[ids]
            mask = torch.tensor(encoding.attention_mask, dtype=torch.long)
        if self.sample_latency_s:
            time.sleep(self.sample_latency_s)
        sample = {
            "input_ids": ids,
            "attention_mask": mask,
            "category": self.labels[index, 0],
            "merchant_type": self.labels[index, 1],
        }
        if self.store is not None and read_store:
            sample["store_vectors"] = self.store.get(self.first_key + index)
            sample.update(_store_counts(self.store))
        return sample

    def __getitems__(self, keys: list[int | tuple[int, int]]) -> list[Sample]:
        """A batch's samples. DataLoader calls this instead of ``__getitem__`` per index
        when the dataset has it: with a batched store, the batch's vectors come from one
        ``batch_get`` (one read transaction per shard) instead of one read per sample."""
        if self.store is None or not self.store_batched:
            return [self[key] for key in keys]
        samples = [self.__getitem__(key, read_store=False) for key in keys]
        indices = [key[1] if isinstance(key, tuple) else key for key in keys]
        vectors = self.store.batch_get([self.first_key + index for index in indices])
        counts = _store_counts(self.store)
        for position, sample in enumerate(samples):
            sample["store_vectors"] = vectors[position]
            # the batch's reads on its first sample: collating sums them per batch
            sample.update(counts if position == 0 else _NO_STORE_COUNTS)
        return samples


STORE_COUNT_KEYS = ("store_reads", "store_keys", "store_read_ms")
_NO_STORE_COUNTS = {
    "store_reads": torch.tensor(0),
    "store_keys": torch.tensor(0),
    "store_read_ms": torch.tensor(0.0, dtype=torch.float64),
}


def _store_counts(store: EmbeddingStore) -> dict[str, torch.Tensor]:
    reads, keys, read_ms = store.take_counts()
    return {
        "store_reads": torch.tensor(reads),
        "store_keys": torch.tensor(keys),
        "store_read_ms": torch.tensor(read_ms, dtype=torch.float64),
    }


# a collated batch's time.monotonic() at the end of its collate (a plain float: as a tensor it
# would be one more shared-memory segment to hand over per batch)
LOADED_AT_KEY = "loaded_at"


def collate_stamped(samples: list[Sample]) -> dict[str, Any]:
    """The default collate, stamped with when the batch finished loading: in a worker, a
    batch stamped before the training step asked for it was waited on only while it was
    handed over, which more workers cannot shorten."""
    batch = default_collate(samples)
    batch[LOADED_AT_KEY] = time.monotonic()
    return batch


def take_loading_wait_ms(batch: dict[str, Any], asked_at: float, fetched_at: float) -> float | None:
    """Removes the batch's load stamp; of the wait from ``asked_at`` to ``fetched_at``
    (time.monotonic()), the milliseconds before the batch had finished loading. None for
    a batch without a stamp."""
    loaded_at = batch.pop(LOADED_AT_KEY, None)
    if loaded_at is None:
        return None
    return max(0.0, min(loaded_at, fetched_at) - asked_at) * 1e3


def take_store_counts(batch: Sample) -> dict[str, float | int]:
    """Removes the per-sample read counts from a collated batch; their sums per batch."""
    if "store_reads" not in batch:
        return {}
    counts = {key: batch.pop(key).sum().item() for key in STORE_COUNT_KEYS}
    return {
        "store_reads": int(counts["store_reads"]),
        "store_keys": int(counts["store_keys"]),
        "store_read_ms": float(counts["store_read_ms"]),
    }


class CachedDataset(Dataset[Sample]):
    """Processes each sample once and serves it from memory on every later epoch.

    For validation data, whose samples never change. A base dataset that augments returns
    a different sample every epoch, so caching it would silently freeze one variant: then
    this wrapper passes through without caching.
    """

    def __init__(self, base: TransactionDataset):
        self.base = base
        self.caching = not getattr(base, "augmenting", False)
        self._cache: dict[int, Sample] = {}
        self.misses = 0

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Sample:
        if not self.caching:
            return self.base[index]
        sample = self._cache.get(index)
        if sample is None:
            self.misses += 1
            sample = self.base[index]
            self._cache[index] = sample
        return sample


class EpochSampler(Sampler[tuple[int, int]]):
    """A permutation keyed by (seed, phase, epoch), optionally started part-way through.

    Yields (epoch, index) keys for :class:`TransactionDataset`. With ``world_size`` > 1 it
    is DistributedSampler's split of that one permutation: rank r takes every world_size-th
    index from position r, after the tail that would make the shards unequal is dropped
    (unequal shards would leave one rank waiting in an all-reduce the others never join).
    ``start`` then counts within the rank's shard, so every rank resumes at the same batch.
    """

    def __init__(self, size: int, seed: int, phase: str, rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} of {world_size}")
        self.size = size
        self.seed = seed
        self.phase = phase
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch = epoch
        self.start = start

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = np.random.default_rng(order_key(self.seed, self.phase, self.epoch)).permutation(
            self.size
        )
        if self.world_size > 1:
            order = order[: self.shard_size * self.world_size][self.rank :: self.world_size]
        return iter([(self.epoch, index) for index in order[self.start :].tolist()])

    @property
    def shard_size(self) -> int:
        return self.size // self.world_size if self.world_size > 1 else self.size

    def __len__(self) -> int:
        return self.shard_size - self.start


def assign_shards(num_shards: int, num_workers: int, worker_id: int) -> list[int]:
    """Shard positions a worker reads: every num_workers-th, starting at its id.

    Round-robin gives every shard to exactly one worker. The naive contiguous split
    ``per = num_shards // num_workers; shards[id*per:(id+1)*per]`` drops the remainder
    (5 shards on 2 workers reads 4) and gives nothing at all when workers outnumber shards.
    """
    if num_workers < 1 or not 0 <= worker_id < num_workers:
        raise ValueError(f"worker {worker_id} of {num_workers}")
    return list(range(worker_id, num_shards, num_workers))


class ShardedTransactionDataset(IterableDataset[Sample]):
    """The training split cut into contiguous shards, read shard by shard.

    Each epoch the shard order is permuted by (seed, phase, epoch) and the shards are
    dealt round-robin to the DataLoader's workers (:func:`assign_shards`).

    With a batched store (``base.store_batched``) each worker reads its stream
    ``batch_size`` samples at a time through ``base.__getitems__`` (one ``batch_get``):
    the DataLoader's fetcher takes a worker's next ``batch_size`` samples as one batch, so
    those groups are exactly its batches, and each batch's read counts stay on it.
    """

    def __init__(
        self,
        base: TransactionDataset,
        num_shards: int,
        seed: int,
        phase: str,
        batch_size: int = 1,
    ):
        self.base = base
        self.shards = [a.tolist() for a in np.array_split(np.arange(len(base)), num_shards)]
        self.seed = seed
        self.phase = phase
        self.batch_size = batch_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.base.set_epoch(epoch)

    def shard_order(self) -> list[int]:
        rng = np.random.default_rng(order_key(self.seed, self.phase, self.epoch))
        return rng.permutation(len(self.shards)).tolist()

    def _keys(self) -> Iterator[tuple[int, int]]:
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info else (0, 1)
        order = self.shard_order()
        for position in assign_shards(len(order), num_workers, worker_id):
            for index in self.shards[order[position]]:
                yield self.epoch, index

    def __iter__(self) -> Iterator[Sample]:
        keys = self._keys()
        if self.base.store is None or not self.base.store_batched:
            yield from (self.base[key] for key in keys)
            return
        while batch := list(itertools.islice(keys, self.batch_size)):
            yield from self.base.__getitems__(batch)


def _worker_init(_: int) -> None:
    # a worker only tokenises and collates: one intra-op thread each, or workers and the
    # training process fight over the same two cores
    torch.set_num_threads(1)
    # forked workers inherit the trainer's flag-setting SIGTERM handler; a worker told to
    # stop (e.g. SIGTERM to the whole process group) should simply stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def make_train_dataset(
    corpus: Corpus, data: DataConfig, seed: int, store: EmbeddingStore | None = None
) -> TransactionDataset:
    return TransactionDataset(
        corpus.train_texts,
        corpus.train_labels,
        corpus.tokenizer,
        tokenize_on_the_fly=data.tokenize_on_the_fly,
        # on-the-fly pipelines also augment: a fresh statement variant each epoch
        augmenting=data.tokenize_on_the_fly,
        sample_latency_ms=data.sample_latency_ms,
        seed=seed,
        store=store,
        store_batched=data.embedding_lookup == "batched",
    )


def make_val_dataset(
    corpus: Corpus,
    data: DataConfig,
    id_map: torch.Tensor | None = None,
    store: EmbeddingStore | None = None,
) -> CachedDataset:
    """Validation, cached; ``id_map`` renumbers its ids as the training split's were (ids
    the map did not keep, i.e. text only validation has, become [UNK])."""
    base = TransactionDataset(
        corpus.val_texts,
        corpus.val_labels,
        corpus.tokenizer,
        tokenize_on_the_fly=data.tokenize_on_the_fly,
        store=store,
        first_key=len(corpus.train_texts),
    )
    if id_map is not None:
        base.apply_id_map(id_map)
    return CachedDataset(base)


def _loader_generator(seed: int, phase: str, epoch: int) -> torch.Generator:
    # DataLoader otherwise draws worker seeds from the global RNG, which a resumed run
    # would consume at a different point than the uninterrupted one
    key = np.random.default_rng(order_key(seed, phase, epoch)).integers(0, 2**62)
    return torch.Generator().manual_seed(int(key))


class EpochBatches:
    """Batches of one phase, epoch after epoch, from any (epoch, batch) position.

    Yields (epoch, batches consumed in the epoch so far, batch). A new DataLoader is built
    per epoch (worker start-up shows as data wait at epoch boundaries, as it really does)
    unless ``persistent_workers`` is set for the map-style dataset, whose sampler can be
    re-pointed without touching the workers.
    """

    def __init__(
        self,
        dataset: TransactionDataset,
        data: DataConfig,
        *,
        batch_size: int,
        seed: int,
        phase: str,
        pin_memory: bool,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.data = data
        self.batch_size = batch_size
        self.seed = seed
        self.phase = phase
        self.pin_memory = pin_memory
        self.base = dataset
        self.sharded = data.dataset == "sharded"
        self.persistent = data.persistent_workers and data.num_workers > 0 and not self.sharded
        self._sampler = EpochSampler(len(dataset), seed, phase, rank, world_size)
        self._persistent_loader: DataLoader[Sample] | None = None
        self.loaders_built = 0
        if data.num_workers > 0:
            # process-wide; forked workers inherit it, and the workers are the side that
            # shares each batch's tensors
            torch.multiprocessing.set_sharing_strategy(data.sharing_strategy)

    def _loader_kwargs(self, epoch: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "num_workers": self.data.num_workers,
            "pin_memory": self.pin_memory,
            "generator": _loader_generator(self.seed, self.phase, epoch),
            "collate_fn": collate_stamped,
        }
        if self.data.num_workers > 0:
            kwargs["prefetch_factor"] = self.data.prefetch_factor
            kwargs["worker_init_fn"] = _worker_init
            kwargs["persistent_workers"] = self.persistent
        return kwargs

    def _epoch_iter(self, epoch: int, start_batch: int) -> Iterator[Sample]:
        self.base.set_epoch(epoch)
        if self.sharded:
            sharded = ShardedTransactionDataset(
                self.base, self.data.shards, self.seed, self.phase, self.batch_size
            )
            sharded.set_epoch(epoch)
            loader: DataLoader[Sample] = DataLoader(
                sharded, batch_size=self.batch_size, **self._loader_kwargs(epoch)
            )
            self.loaders_built += 1
            # an iterable dataset cannot seek: replay and drop the batches already trained on
            return itertools.islice(iter(loader), start_batch, None)
        self._sampler.set_epoch(epoch, start_batch * self.batch_size)
        batches = BatchSampler(self._sampler, self.batch_size, drop_last=True)
        if self.persistent:
            if self._persistent_loader is None:
                self._persistent_loader = DataLoader(
                    self.base, batch_sampler=batches, **self._loader_kwargs(0)
                )
                self.loaders_built += 1
            return iter(self._persistent_loader)
        loader = DataLoader(self.base, batch_sampler=batches, **self._loader_kwargs(epoch))
        self.loaders_built += 1
        return iter(loader)

    def iterate(self, epoch: int = 0, start_batch: int = 0) -> Iterator[tuple[int, int, Sample]]:
        while True:
            produced = 0
            for position, batch in enumerate(self._epoch_iter(epoch, start_batch), start_batch):
                produced += 1
                every = self.data.stall_every
                if every and (position + 1) % every == 0 and self.data.stall_ms > 0:
                    time.sleep(self.data.stall_ms / 1000.0)  # data.stall_every: shows as data wait
                yield epoch, position + 1, batch
            if produced == 0 and start_batch == 0:
                raise RuntimeError(f"{self.phase}: an epoch produced no batches")
            epoch += 1
            start_batch = 0


def used_token_ids(
    corpus: Corpus, dataset: TransactionDataset, *, masking: bool, vocab: ModelVocab | None = None
) -> int:
    """Distinct token ids the model is fed from the training split, as tokenised for it.

    Padded and truncated as in training, so [PAD], [CLS] and [SEP] count and ids past
    ``max_length`` do not. With masked-LM pre-training ``masking`` adds [MASK], which the
    masking puts into the inputs. Counted on the split's clean text: an augmenting
    (on-the-fly) pipeline's per-epoch variants may reach a few more ids. Counted in the
    model's numbering (``vocab``; the tokenizer's when not given) after the dataset's id map.
    """
    vocab = vocab or full_vocab(corpus.tokenizer)
    used = used_id_mask(corpus.tokenizer, dataset.texts, dataset._ids, vocab.size, dataset.id_map)
    if masking:
        if vocab.mask_id is None:
            raise ValueError("masking with a vocabulary that has no [MASK]")
        used[vocab.mask_id] = True
    return int(used.sum())


def num_labels() -> tuple[int, int]:
    return len(CATEGORIES), len(MERCHANT_TYPES)
