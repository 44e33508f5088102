"""The multi-task model and masked-LM masking."""

from __future__ import annotations

import torch

from trainer.config import ModelConfig
from trainer.model import MLM_MASK_PROBABILITY, MultiTaskModel, mask_tokens, parameter_count


def _model(vocab_size=450):
    return MultiTaskModel(
        ModelConfig(),
        vocab_size=vocab_size,
        max_length=32,
        num_categories=10,
        num_merchant_types=5,
        pad_id=0,
    )


def test_default_size_is_one_to_five_million_parameters():
    # the default corpus trains a ~450-token vocabulary; a larger one only adds embeddings
    for vocab in (450, 3000):
        assert 1_000_000 <= parameter_count(_model(vocab)) <= 5_000_000


def test_forward_gives_a_loss_per_task_and_a_shared_backbone():
    torch.manual_seed(0)
    model = _model()
    ids = torch.randint(5, 450, (4, 32))
    out = model(ids, torch.ones_like(ids), torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2, 3]))
    assert out.category_logits.shape == (4, 10)
    assert out.merchant_type_logits.shape == (4, 5)
    assert out.hidden.shape == (4, 32, 192)
    out.loss.backward()
    # both heads and the backbone learn from the task loss; the MLM head does not
    assert model.category_head.weight.grad is not None
    assert model.backbone.embeddings.word_embeddings.weight.grad is not None
    assert all(p.grad is None for p in model.mlm_head.parameters())
    model.zero_grad(set_to_none=True)
    labels = torch.full_like(ids, -100)
    labels[:, 1] = ids[:, 1]
    model.mlm_loss(ids, torch.ones_like(ids), labels).backward()
    assert model.mlm_head.predictions.decoder.weight.grad is not None
    assert model.category_head.weight.grad is None


def test_masking_never_targets_special_tokens_and_hits_about_15_percent():
    torch.manual_seed(0)
    special = [0, 2, 3, 4]  # pad, cls, sep, mask
    ids = torch.randint(5, 450, (256, 32))
    ids[:, 0], ids[:, -1], ids[:, 20:31] = 2, 3, 0
    masked, labels = mask_tokens(ids, special, mask_id=4, vocab_size=450)
    targets = labels != -100
    real = ~torch.isin(ids, torch.tensor(special))
    assert not (targets & ~real).any()
    rate = targets.sum().item() / real.sum().item()
    assert abs(rate - MLM_MASK_PROBABILITY) < 0.02  # 256 x 19 real tokens: sd ~ 0.005
    # of the targets, about 80 % become [MASK]; untouched tokens stay as they were
    assert abs((masked[targets] == 4).float().mean().item() - 0.8) < 0.05
    assert torch.equal(masked[~targets], ids[~targets])
    assert torch.equal(labels[targets], ids[targets])


def test_masking_always_leaves_a_target_when_the_batch_has_a_real_token():
    # batch 2, one real token a line: at 15 % a line, no target in about 72 % of draws; a
    # batch with no target has a NaN masked-LM loss (0/0), as the small-batch scenario had
    special = [0, 2, 3, 4]
    ids = torch.tensor([[2, 17, 3, 0], [2, 99, 3, 0]])
    for seed in range(50):
        torch.manual_seed(seed)
        _, labels = mask_tokens(ids, special, mask_id=4, vocab_size=450)
        targets = labels != -100
        assert targets.any(), seed
        assert set(ids[targets].tolist()) <= {17, 99}  # never a special token
    all_special = torch.tensor([[2, 3, 0, 0]])
    _, labels = mask_tokens(all_special, special, mask_id=4, vocab_size=450)
    assert (labels == -100).all()  # nothing real to predict: still no target


def test_vocab_matrices_counts_the_untied_mlm_decoder():
    # the MLM head is built on its own, outside BertForMaskedLM: its decoder is a second
    # vocabulary-sized matrix, not the input embedding (pruning a row saves it in both)
    model = _model(450)
    embedding = model.backbone.embeddings.word_embeddings.weight
    decoder = model.mlm_head.predictions.decoder.weight
    assert embedding.shape == decoder.shape == (450, 192)
    assert embedding.data_ptr() != decoder.data_ptr()
    assert model.vocab_matrices() == 2
    model.mlm_head.predictions.decoder.weight = embedding  # tie them, as BertForMaskedLM does
    assert model.vocab_matrices() == 1
