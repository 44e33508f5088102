"""Corpus, tokenizer, datasets and the shard split (real DataLoaders where it matters)."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from trainer.config import DataConfig, split_sizes
from trainer.corpus import CATEGORIES, MERCHANT_TYPES, make_corpus, train_tokenizer
from trainer.data import (
    CachedDataset,
    EpochBatches,
    ShardedTransactionDataset,
    TransactionDataset,
    assign_shards,
    load_corpus,
    make_train_dataset,
    take_loading_wait_ms,
    used_token_ids,
)

# more workers than this machine's 2 cores is the point of some cases here
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return load_corpus(DataConfig(rows=300), seed=0, cache_dir=tmp_path_factory.mktemp("cache"))


def test_corpus_is_deterministic_and_labelled():
    frame = make_corpus(500, seed=3)
    assert frame.equals(make_corpus(500, seed=3))
    assert not frame.equals(make_corpus(500, seed=4))
    assert frame.height == 500
    assert frame["category_id"].is_between(0, len(CATEGORIES) - 1).all()
    assert frame["merchant_type_id"].is_between(0, len(MERCHANT_TYPES) - 1).all()
    # preprocessing: lower case, digits replaced by a "num" word, no '*' or '#'
    texts = frame["text"].to_list()
    assert all(t == t.lower() and not any(c.isdigit() or c in "*#" for c in t) for t in texts)
    assert all(" amount " in t for t in texts)
    # noisy: the same merchant appears as more than one statement string
    assert frame["statement"].n_unique() > 2 * frame["category_id"].n_unique()


def test_tokenizer_is_trained_locally_and_cached(tmp_path):
    texts = make_corpus(200, seed=0)["text"].to_list()
    first = train_tokenizer(texts, vocab_size=500, max_length=16, cache_dir=tmp_path)
    cached = list(tmp_path.glob("wordpiece-*.json"))
    assert len(cached) == 1
    again = train_tokenizer(texts, vocab_size=500, max_length=16, cache_dir=tmp_path)
    assert again.get_vocab() == first.get_vocab()
    encoding = again.encode(texts[0])
    assert len(encoding.ids) == 16  # padded/truncated to max_length
    assert encoding.tokens[0] == "[CLS]"
    # a different vocabulary size is a different cache entry
    train_tokenizer(texts, vocab_size=400, max_length=16, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("wordpiece-*.json"))) == 2


def test_split_is_train_then_validation(corpus):
    n_train, n_val = split_sizes(300)
    assert (len(corpus.train_texts), len(corpus.val_texts)) == (n_train, n_val)


def test_on_the_fly_and_pretokenised_samples_agree_without_augmentation(corpus):
    texts, labels = corpus.train_texts[:20], corpus.train_labels[:20]
    eager = TransactionDataset(texts, labels, corpus.tokenizer)
    lazy = TransactionDataset(texts, labels, corpus.tokenizer, tokenize_on_the_fly=True)
    for i in range(20):
        a, b = eager[i], lazy[i]
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_augmentation_changes_with_epoch_but_not_with_process(corpus):
    texts, labels = corpus.train_texts[:50], corpus.train_labels[:50]
    ds = TransactionDataset(
        texts, labels, corpus.tokenizer, tokenize_on_the_fly=True, augmenting=True
    )
    epoch0 = [ds[i]["input_ids"] for i in range(50)]
    ds.set_epoch(1)
    epoch1 = [ds[i]["input_ids"] for i in range(50)]
    assert any(not torch.equal(a, b) for a, b in zip(epoch0, epoch1, strict=True))
    # keyed by (seed, epoch, index): a second dataset object gives the same variants
    other = TransactionDataset(
        texts, labels, corpus.tokenizer, tokenize_on_the_fly=True, augmenting=True
    )
    other.set_epoch(1)
    assert all(torch.equal(other[i]["input_ids"], epoch1[i]) for i in range(50))


class CountingDataset(TransactionDataset):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def __getitem__(self, index):
        self.calls += 1
        return super().__getitem__(index)


def test_cached_dataset_processes_once_and_never_caches_augmentation(corpus):
    texts, labels = corpus.val_texts, corpus.val_labels
    base = CountingDataset(texts, labels, corpus.tokenizer, tokenize_on_the_fly=True)
    cached = CachedDataset(base)
    for _epoch in range(3):
        for i in range(len(cached)):
            cached[i]
    assert base.calls == len(texts)  # three epochs, each sample processed once
    augmenting = CountingDataset(
        texts, labels, corpus.tokenizer, tokenize_on_the_fly=True, augmenting=True
    )
    passthrough = CachedDataset(augmenting)
    assert not passthrough.caching
    for _epoch in range(3):
        for i in range(len(passthrough)):
            passthrough[i]
    assert augmenting.calls == 3 * len(texts)


@pytest.mark.parametrize("num_workers", range(1, 9))
@pytest.mark.parametrize("num_shards", range(1, 21))
def test_assign_shards_gives_every_shard_to_exactly_one_worker(num_shards, num_workers):
    read = Counter(
        shard
        for worker in range(num_workers)
        for shard in assign_shards(num_shards, num_workers, worker)
    )
    assert read == Counter(range(num_shards))
    # and as evenly as possible: loads differ by at most one shard
    loads = [len(assign_shards(num_shards, num_workers, w)) for w in range(num_workers)]
    assert max(loads) - min(loads) <= 1


def test_naive_split_would_drop_shards():
    # why the round-robin exists: 5 shards on 2 workers with len // workers reads only 4
    per_worker = 5 // 2
    naive = [s for w in range(2) for s in range(w * per_worker, (w + 1) * per_worker)]
    assert len(naive) == 4
    assert sorted(s for w in range(2) for s in assign_shards(5, 2, w)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(("num_shards", "num_workers"), [(5, 2), (3, 4), (7, 3), (1, 1)])
def test_sharded_dataset_reads_every_row_once_through_a_real_dataloader(
    corpus, num_shards, num_workers
):
    base = TransactionDataset(corpus.train_texts[:60], corpus.train_labels[:60], corpus.tokenizer)
    # tag each row with its index through the labels so rows can be counted exactly
    base.labels = torch.stack([torch.arange(60), torch.zeros(60, dtype=torch.long)], dim=1)
    sharded = ShardedTransactionDataset(base, num_shards, seed=0, phase="finetune")
    loader = DataLoader(sharded, batch_size=7, num_workers=num_workers)
    seen = Counter(int(i) for batch in loader for i in batch["category"])
    assert seen == Counter(range(60))


def test_epoch_order_depends_only_on_seed_phase_epoch_and_resumes_mid_epoch(corpus):
    data = DataConfig(rows=300, num_workers=0)
    ds = TransactionDataset(corpus.train_texts, corpus.train_labels, corpus.tokenizer)

    def stream(start_epoch=0, start_batch=0, n=30, **kw):
        batches = EpochBatches(
            ds, data, batch_size=16, seed=1, phase="finetune", pin_memory=False, **kw
        )
        it = batches.iterate(start_epoch, start_batch)
        return [(e, p, b["input_ids"]) for (e, p, b), _ in zip(it, range(n), strict=False)]

    full = stream()
    per_epoch = len(ds) // 16  # drop_last: whole batches only
    assert [p for e, p, _ in full if e == 0] == list(range(1, per_epoch + 1))
    assert full[per_epoch][0] == 1  # the epoch after runs on
    resumed = stream(0, 5, n=30 - 5)
    assert all(
        (a[0], a[1]) == (b[0], b[1]) and torch.equal(a[2], b[2])
        for a, b in zip(full[5:], resumed, strict=True)
    )
    # a different epoch is a different order
    assert not torch.equal(full[0][2], full[per_epoch][2])


def test_sharded_stream_resumes_by_skipping_batches(corpus):
    data = DataConfig(rows=300, num_workers=2, dataset="sharded", shards=5)
    ds = TransactionDataset(corpus.train_texts, corpus.train_labels, corpus.tokenizer)

    def take(start_batch, n):
        it = EpochBatches(
            ds, data, batch_size=16, seed=0, phase="pretrain", pin_memory=False
        ).iterate(0, start_batch)
        return [b["input_ids"] for (_, _, b), _ in zip(it, range(n), strict=False)]

    full, resumed = take(0, 8), take(3, 5)
    assert all(torch.equal(a, b) for a, b in zip(full[3:], resumed, strict=True))
    assert np.isclose(sum(len(b) for b in full), 8 * 16, atol=16 * 2)


def test_persistent_workers_see_each_epochs_augmentation(corpus):
    # augmenting data through one persistent worker, across an epoch boundary: the same
    # batches as fresh workers per epoch, and as a run resumed in the second epoch
    ds = TransactionDataset(
        corpus.train_texts[:64],
        corpus.train_labels[:64],
        corpus.tokenizer,
        tokenize_on_the_fly=True,
        augmenting=True,
    )

    def take(persistent, start_epoch, n):
        data = DataConfig(rows=300, num_workers=1, persistent_workers=persistent)
        it = EpochBatches(
            ds, data, batch_size=16, seed=0, phase="finetune", pin_memory=False
        ).iterate(start_epoch, 0)
        return [b["input_ids"] for (_, _, b), _ in zip(it, range(n), strict=False)]

    persistent, fresh = take(True, 0, 8), take(False, 0, 8)  # 64 rows / 16 = 4 per epoch
    assert all(torch.equal(a, b) for a, b in zip(persistent, fresh, strict=True))
    resumed = take(True, 1, 4)
    assert all(torch.equal(a, b) for a, b in zip(persistent[4:], resumed, strict=True))


def test_used_token_ids_counts_distinct_ids_fed_to_the_model(corpus):
    data = DataConfig(rows=300)
    cached = make_train_dataset(corpus, data, seed=0)
    expected = {i for e in corpus.tokenizer.encode_batch(corpus.train_texts) for i in e.ids}
    # padding, [CLS] and [SEP] are fed to the model: counted; far fewer ids than the vocabulary
    specials = {corpus.pad_id, corpus.tokenizer.token_to_id("[CLS]")}
    assert specials | {corpus.tokenizer.token_to_id("[SEP]")} <= expected
    assert used_token_ids(corpus, cached, masking=False) == len(expected) < corpus.vocab_size
    # masked-LM pre-training feeds [MASK] too, which no clean text contains
    assert corpus.mask_id not in expected
    assert used_token_ids(corpus, cached, masking=True) == len(expected) + 1
    # an on-the-fly dataset holds no ids: the texts are tokenised (in chunks) for the count
    fly = make_train_dataset(corpus, DataConfig(rows=300, tokenize_on_the_fly=True), seed=0)
    assert fly._ids is None
    assert used_token_ids(corpus, fly, masking=False) == len(expected)


STRATEGIES = ("file_descriptor", "file_system")


class _ReportsSharingStrategy(TransactionDataset):
    """Each sample carries the sharing strategy of the process that made it (the worker)."""

    def __getitem__(self, key, **kwargs):
        sample = super().__getitem__(key, **kwargs)
        strategy = torch.multiprocessing.get_sharing_strategy()
        sample["strategy"] = torch.tensor(STRATEGIES.index(strategy))
        return sample


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_workers_share_batches_by_the_configured_strategy(corpus, strategy):
    # by file name is the default: each tensor handed over by file descriptor is a round
    # trip to a thread of the worker, which on a busy host waits for a core
    assert DataConfig().sharing_strategy == "file_system"
    before = torch.multiprocessing.get_sharing_strategy()
    other = next(s for s in STRATEGIES if s != strategy)
    torch.multiprocessing.set_sharing_strategy(other)
    try:
        ds = _ReportsSharingStrategy(corpus.train_texts, corpus.train_labels, corpus.tokenizer)
        data = DataConfig(rows=300, num_workers=1, sharing_strategy=strategy)
        it = EpochBatches(ds, data, batch_size=8, seed=0, phase="finetune", pin_memory=False)
        batches = [b for (_, _, b), _ in zip(it.iterate(0, 0), range(3), strict=False)]
        assert torch.multiprocessing.get_sharing_strategy() == strategy
        made_with = {STRATEGIES[int(i)] for b in batches for i in b["strategy"]}
        assert made_with == {strategy}
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


def _timed_next(batches) -> tuple[float, float | None]:
    """(the data wait, its loading part) of one batch, in ms, as the training loop takes them."""
    asked_at = time.monotonic()
    _, _, batch = next(batches)
    fetched_at = time.monotonic()
    return (fetched_at - asked_at) * 1e3, take_loading_wait_ms(batch, asked_at, fetched_at)


def test_the_loading_part_of_the_wait_is_the_wait_without_workers(corpus):
    # 8 samples a batch, each sleeping 3 ms in __getitem__, inside next(): ~24 ms of loading
    data = DataConfig(rows=300, num_workers=0, sample_latency_ms=3.0)
    ds = make_train_dataset(corpus, data, seed=0)
    batches = EpochBatches(
        ds, data, batch_size=8, seed=0, phase="finetune", pin_memory=False
    ).iterate()
    for _ in range(3):
        wait, loading = _timed_next(batches)
        assert loading is not None and loading >= 24.0 and loading <= wait
        assert loading > 0.9 * wait


def test_a_batch_loaded_before_it_is_asked_for_has_no_loading_wait(corpus):
    # one worker, two batches in flight (prefetch_factor 2): after a pause the next two are
    # loaded (24 ms each), so whatever the training process then waits is the hand-over
    data = DataConfig(rows=300, num_workers=1, persistent_workers=False, sample_latency_ms=3.0)
    ds = make_train_dataset(corpus, data, seed=0)
    batches = EpochBatches(
        ds, data, batch_size=8, seed=0, phase="finetune", pin_memory=False
    ).iterate()
    _, first = _timed_next(batches)  # the worker starts and loads inside this wait
    assert first is not None and first >= 24.0
    time.sleep(1.0)
    for _ in range(2):
        wait, loading = _timed_next(batches)
        assert loading == 0.0 and wait > 0.0
