"""Vocabulary pruning (data.prune_vocab): the id map, the datasets it feeds, exact resume."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from diagnostics.runs import TOKENIZER_FILE, RunFolder, RunWriter
from trainer.config import ConfigError, DataConfig, build_config
from trainer.corpus import SPECIAL_TOKENS
from trainer.data import (
    load_corpus,
    make_train_dataset,
    make_val_dataset,
    used_token_ids,
)
from trainer.loop import Trainer
from trainer.run_io import SafeWriter
from trainer.runtime import StopRequests
from trainer.vocab import full_vocab, pruned_vocab, used_id_mask

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return load_corpus(DataConfig(rows=300), seed=0, cache_dir=tmp_path_factory.mktemp("cache"))


def _train_ids(corpus) -> set[int]:
    return {i for e in corpus.tokenizer.encode_batch(corpus.train_texts) for i in e.ids}


def _unused_word(corpus) -> tuple[str, int]:
    """A vocabulary token the training split never produces that encodes to itself alone."""
    tokenizer, used = corpus.tokenizer, _train_ids(corpus)
    for token, token_id in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        if token_id in used or token.startswith("##") or token in SPECIAL_TOKENS:
            continue
        if tokenizer.encode(token).tokens[:3] == ["[CLS]", token, "[SEP]"]:
            return token, token_id
    raise AssertionError("every bare vocabulary token is used")


def test_pruned_map_keeps_used_ids_and_specials_in_order(corpus):
    tokenizer = corpus.tokenizer
    used = _train_ids(corpus)
    mask = np.zeros(corpus.vocab_size, dtype=bool)
    mask[list(used)] = True
    specials = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    for masking in (False, True):
        vocab = pruned_vocab(tokenizer, mask, masking=masking)
        # kept: the used ids, [UNK] (padding, [CLS] and [SEP] are used anyway) and [MASK]
        # when masked-LM pre-training feeds it
        expected = sorted(used | {specials["[UNK]"]} | ({specials["[MASK]"]} if masking else set()))
        assert vocab.kept_ids.tolist() == expected
        assert vocab.size == len(expected) < vocab.original_size == corpus.vocab_size
        # new ids are the positions in the ascending kept list: order preserved
        for new_id, old_id in enumerate(expected):
            assert int(vocab.lookup[old_id]) == new_id
        for name, attr in (("[PAD]", "pad_id"), ("[UNK]", "unk_id")):
            assert getattr(vocab, attr) == expected.index(specials[name])
        # everything not kept maps to [UNK]
        dropped = sorted(set(range(corpus.vocab_size)) - set(expected))
        assert dropped and (vocab.lookup[dropped] == vocab.unk_id).all()
        if masking:
            assert vocab.mask_id == expected.index(specials["[MASK]"])
            assert set(vocab.special_ids) == {
                expected.index(specials[t]) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
            }
        else:
            assert vocab.mask_id is None and specials["[MASK]"] not in expected


def test_full_vocab_is_the_identity(corpus):
    vocab = full_vocab(corpus.tokenizer)
    assert not vocab.pruned and vocab.size == vocab.original_size == corpus.vocab_size
    ids = torch.arange(corpus.vocab_size)
    assert vocab.remap(ids) is ids
    assert (vocab.pad_id, vocab.mask_id) == (corpus.pad_id, corpus.mask_id)


def test_datasets_feed_remapped_ids_and_unseen_validation_ids_become_unk(corpus):
    data = DataConfig(rows=300)
    train = make_train_dataset(corpus, data, seed=0)
    raw = train._ids.clone()
    mask = used_id_mask(corpus.tokenizer, train.texts, train._ids, corpus.vocab_size)
    vocab = pruned_vocab(corpus.tokenizer, mask, masking=False)
    train.apply_id_map(vocab.lookup)
    with pytest.raises(RuntimeError, match="already remapped"):
        train.apply_id_map(vocab.lookup)  # twice would renumber twice
    # every training id survives the map: old id = kept_ids[new id], and none is [UNK]
    assert torch.equal(vocab.kept_ids[train[5]["input_ids"]], raw[5])
    assert train._ids.max() < vocab.size and not (train._ids == vocab.unk_id).any()

    # the on-the-fly path (no augmentation) feeds the same remapped ids per sample
    fly = make_train_dataset(corpus, DataConfig(rows=300, tokenize_on_the_fly=True), seed=0)
    fly.augmenting = False
    fly.apply_id_map(vocab.lookup)
    assert fly._ids is None
    assert all(torch.equal(fly[i]["input_ids"], train[i]["input_ids"]) for i in (0, 7, 99))

    # validation: a word only validation has (a vocabulary token training never emits) is
    # fed as [UNK]; [CLS], [SEP] and padding keep their renumbered ids
    word, old_id = _unused_word(corpus)
    assert int(vocab.lookup[old_id]) == vocab.unk_id
    for on_the_fly in (False, True):
        corpus_with_word = type(corpus)(
            corpus.train_texts,
            corpus.train_labels,
            [word, *corpus.val_texts],
            np.vstack([corpus.val_labels[:1], corpus.val_labels]),
            corpus.tokenizer,
        )
        val = make_val_dataset(
            corpus_with_word, DataConfig(rows=300, tokenize_on_the_fly=on_the_fly), vocab.lookup
        )
        ids = val[0]["input_ids"].tolist()
        cls, sep = (int(vocab.lookup[corpus.tokenizer.token_to_id(t)]) for t in ("[CLS]", "[SEP]"))
        assert ids[:3] == [cls, vocab.unk_id, sep]
        assert ids[3:] == [vocab.pad_id] * (len(ids) - 3)
        # the rest of validation: old ids that were kept map back exactly, others are [UNK]
        old = torch.tensor([e.ids for e in corpus.tokenizer.encode_batch(corpus.val_texts)])
        fed = torch.stack([val[i]["input_ids"] for i in range(1, len(val))])
        kept = torch.isin(old, vocab.kept_ids)
        assert torch.equal(vocab.kept_ids[fed[kept]], old[kept])
        assert (fed[~kept] == vocab.unk_id).all()

    # the count in the model's numbering: the same used ids, now out of vocab.size rows
    assert used_token_ids(corpus, train, masking=False, vocab=vocab) == len(_train_ids(corpus))
    assert used_token_ids(corpus, fly, masking=False, vocab=vocab) == len(_train_ids(corpus))


SMALL = {
    "data.rows": 300,
    "data.num_workers": 0,
    "train.batch_size": 16,
    "train.pretrain_steps": 2,
    "train.checkpoint_every": 5,
    "instruments.enabled": False,
    "data.prune_vocab": True,
}


def _trainer(runs_dir, run_id, steps, cache_dir, tokenizer_from=None):
    config = build_config("healthy", SMALL, steps=steps, device="cpu")
    writer = RunWriter.create(runs_dir, config.to_dict(), {"device": "cpu"}, run_id=run_id)
    if tokenizer_from is not None:
        shutil.copy(tokenizer_from / TOKENIZER_FILE, writer.path / TOKENIZER_FILE)
    return Trainer(
        config, SafeWriter(writer), device="cpu", cache_dir=cache_dir, stop=StopRequests()
    )


def _losses(run_dir) -> dict[int, float]:
    steps = RunFolder(run_dir).steps()
    return dict(zip(steps["step"].to_list(), steps["loss"].to_list(), strict=True))


def test_pruned_trainer_builds_the_small_model_and_resumes_exactly(tmp_path):
    reference = _trainer(tmp_path, "reference", steps=6, cache_dir=tmp_path / "cache")
    vocab = reference.vocab
    # 2 masked-LM steps: [MASK] is kept; the embedding and the MLM decoder have vocab.size rows
    assert vocab.pruned and vocab.mask_id is not None
    embedding = reference.model.backbone.embeddings.word_embeddings
    assert embedding.num_embeddings == vocab.size == len(vocab.kept_ids) < vocab.original_size
    assert reference.model.mlm_head.predictions.decoder.out_features == vocab.size
    assert reference.model.bert_config.pad_token_id == vocab.pad_id
    usage = reference.vocab_usage()
    assert (usage["vocab_size"], usage["pruned_from"]) == (vocab.size, vocab.original_size)
    # used = the training split's ids + [MASK]; kept adds only [UNK], which it never feeds
    assert usage["used_token_ids"] == vocab.size - 1
    assert reference.run().status == "completed"
    reference.writer.finalise("completed")

    # a second run from the first one's checkpoint at step 5 (2 masked-LM + 3 fine-tuning),
    # with only the run's tokenizer.json: the shared cache is gone, the map is rebuilt
    shutil.rmtree(tmp_path / "cache")
    checkpoint = reference.checkpoint_path(5)
    assert checkpoint.exists()
    resumed = _trainer(
        tmp_path, "resumed", 6, tmp_path / "cache2", tokenizer_from=reference.run_dir
    )
    assert torch.equal(resumed.vocab.kept_ids, vocab.kept_ids)
    assert resumed.run(resume_from=checkpoint).status == "completed"
    resumed.writer.finalise("completed")
    after = _losses(resumed.run_dir)
    assert list(after) == [6, 7, 8]  # 2 + 6 steps in all
    assert after == {s: v for s, v in _losses(reference.run_dir).items() if s > 5}

    # a checkpoint whose map differs is refused rather than silently misaligned
    state = torch.load(checkpoint, weights_only=True)  # format 2: plain types only
    state["vocab_kept_ids"] = state["vocab_kept_ids"][:-1]
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="pruned vocabulary differs"):
        resumed.load_checkpoint(tmp_path / "bad.pt")


def test_prune_vocab_is_a_config_key_on_in_healthy_and_off_in_unpruned_vocab():
    assert build_config("healthy").data.prune_vocab is True
    assert build_config("unpruned-vocab").data.prune_vocab is False
    assert build_config("unpruned-vocab", {"data.prune_vocab": "true"}).data.prune_vocab is True
    with pytest.raises(ConfigError, match=r"^data.prune_vocab: 'maybe' is not a boolean"):
        build_config("healthy", {"data.prune_vocab": "maybe"})


def test_pruned_then_padded_vocabulary_pads_both_matrices_and_is_not_unused_rows(tmp_path):
    # misshapen-matmul's fix after unused-embedding-rows': prune, then pad to a multiple of 64
    config = build_config(
        "healthy", {**SMALL, "model.pad_vocab_to_multiple_of": 64}, steps=3, device="cpu"
    )
    writer = RunWriter.create(tmp_path, config.to_dict(), {"device": "cpu"}, run_id="padded")
    trainer = Trainer(
        config, SafeWriter(writer), device="cpu", cache_dir=tmp_path / "cache", stop=StopRequests()
    )
    size = trainer.vocab.size
    rows = -(-size // 64) * 64  # the pruned vocabulary rounded up: ~110 -> 128
    assert rows % 64 == 0 and size < rows < size + 64
    embedding = trainer.model.backbone.embeddings.word_embeddings
    assert embedding.num_embeddings == rows
    assert trainer.model.mlm_head.predictions.decoder.out_features == rows
    usage = trainer.vocab_usage()
    assert (usage["vocab_size"], usage["padding_rows"]) == (size, rows - size)
    assert trainer.run().status == "completed"  # 2 masked-LM steps over the padded decoder
    # the rows the padding added are by design never fed: not counted as unused
    from diagnostics.rules import examples as ex
    from diagnostics.rules.unused_embedding_rows import UnusedEmbeddingRows
    from diagnostics.thresholds import Thresholds

    # at a 5 % threshold: the pruned vocabulary leaves only [UNK] unused (under 1 %), while
    # its padding rows, were they counted, would be over 5 % of the rows
    strict = Thresholds(embedding_unused_min_pct=5.0)
    assert 100 * (rows - usage["used_token_ids"]) / rows > 5.0
    run = ex.run(ex.series(3, step_time_ms=10.0), environment={"vocab_usage": usage})
    assert UnusedEmbeddingRows().check(ex.inputs(run=run), strict) == []


def test_pad_vocab_to_multiple_of_defaults_to_no_padding_and_is_bounded():
    assert build_config("healthy").model.pad_vocab_to_multiple_of == 1
    with pytest.raises(ConfigError, match=r"^model.pad_vocab_to_multiple_of: "):
        build_config("healthy", {"model.pad_vocab_to_multiple_of": "0"})
