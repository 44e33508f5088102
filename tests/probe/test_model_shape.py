"""probe/model_shape.py on real transformers models built from a config (random weights,
nothing downloaded), and on configs it must refuse.

Each expected N is worked out here from the config, layer by layer, from what the model's
modules are (GPT-2's Conv1D projections, BERT's Linear ones, LayerNorms' weight and bias),
not from the code under test or from diagnostics' BERT formula."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from probe.model_shape import fp32_matmul_precision, model_shape, non_embedding_parameters

VOCAB, POSITIONS = 50, 32


def gpt2_block(h: int) -> int:
    """ln_1 (2h), c_attn h -> 3h (3h² + 3h), attention c_proj (h² + h), ln_2 (2h), mlp c_fc
    h -> 4h (4h² + 4h), mlp c_proj 4h -> h (4h² + h)."""
    return 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (4 * h * h + 4 * h) + (4 * h * h + h)


def bert_layer(h: int, i: int) -> int:
    """query, key, value, attention output dense (h² + h each), its LayerNorm (2h), the
    intermediate dense h -> i (h·i + i), the output dense i -> h (i·h + h), its LayerNorm."""
    return 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h


@pytest.mark.slow  # transformers' import is 10-35 s on a loaded 2-core host
def test_gpt2_counts_the_tied_head_once_and_leaves_the_position_table_out():
    from transformers import GPT2Config, GPT2LMHeadModel

    h, layers = 64, 2
    config = GPT2Config(n_layer=layers, n_head=2, n_embd=h, vocab_size=VOCAB, n_positions=POSITIONS)
    model = GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: one parameter
    # the blocks, ln_f (2h), and wte once as the head's h·V matmul; wpe (P·h) left out
    expected = layers * gpt2_block(h) + 2 * h + VOCAB * h
    assert expected == 2 * (12 * h * h + 13 * h) + 2 * h + VOCAB * h == 103_296
    shape, reason = model_shape(model, model.config)
    assert reason is None and shape is not None
    assert shape["non_embedding_params"] == expected
    assert sum(p.numel() for p in model.parameters()) == expected + POSITIONS * h
    assert {k: shape[k] for k in ("model_type", "layers", "heads", "head_dim", "vocab_size")} == {
        "model_type": "gpt2",
        "layers": layers,
        "heads": 2,
        "head_dim": h // 2,
        "vocab_size": VOCAB,
    }
    assert shape["parameter_dtype"] == "float32"
    assert shape["fp32_matmul"] in ("ieee", "tf32")


@pytest.mark.slow
def test_bert_for_masked_lm_counts_its_tied_decoder_and_bert_model_no_table_at_all():
    from transformers import BertConfig, BertForMaskedLM, BertModel

    h, layers, i = 64, 2, 128
    config = BertConfig(
        hidden_size=h,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=i,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
        type_vocab_size=2,
    )
    encoder = layers * bert_layer(h, i) + 2 * h  # + the embeddings' LayerNorm
    masked_lm = BertForMaskedLM(config)
    assert (
        masked_lm.cls.predictions.decoder.weight is masked_lm.bert.embeddings.word_embeddings.weight
    )
    # the MLM head: transform dense (h² + h), its LayerNorm (2h), the decoder's tied h·V
    # weight and its V bias; word, position and token-type tables otherwise left out
    expected_mlm = encoder + (h * h + h) + 2 * h + VOCAB * h + VOCAB
    shape, reason = model_shape(masked_lm, masked_lm.config)
    assert reason is None and shape is not None
    assert shape["non_embedding_params"] == expected_mlm
    assert (shape["layers"], shape["heads"], shape["head_dim"]) == (layers, 4, h // 4)
    # without a head nothing holds the word table: all three tables out, the pooler in
    bare = BertModel(config)
    assert non_embedding_parameters(bare) == encoder + (h * h + h)
    tables = VOCAB * h + POSITIONS * h + 2 * h
    assert sum(p.numel() for p in bare.parameters()) == encoder + (h * h + h) + tables


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(10, 8)
        self.linear = torch.nn.Linear(8, 8)  # 72 parameters


def _config(**overrides):
    values = {
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "hidden_size": 8,
        "vocab_size": 10,
        "model_type": "toy",
    }
    return SimpleNamespace(**{**values, **overrides})


def test_a_head_dim_attribute_wins_over_hidden_over_heads():
    shape, _ = model_shape(TwoLayers(), _config(head_dim=16))
    assert shape is not None and shape["head_dim"] == 16 and shape["non_embedding_params"] == 72
    shape, _ = model_shape(TwoLayers(), _config(head_dim=None))  # None: hidden / heads
    assert shape is not None and shape["head_dim"] == 4


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers is not a positive integer"),
        ({"num_attention_heads": 0}, "num_attention_heads is not a positive integer"),
        ({"hidden_size": 8.0}, "hidden_size is not a positive integer"),
        ({"vocab_size": True}, "vocab_size is not a positive integer"),
        ({"num_attention_heads": 3}, "not a multiple of 3 heads"),
        ({"head_dim": -1}, "head_dim -1 is not a positive integer"),
        ({"is_encoder_decoder": True}, "encoder-decoder"),
        ({"num_local_experts": 8}, "mixture of experts (num_local_experts=8)"),
    ],
)
def test_no_shape_rather_than_a_guess(overrides, says):
    shape, reason = model_shape(TwoLayers(), _config(**overrides))
    assert shape is None and says in (reason or ""), reason


def test_a_missing_attribute_or_config_gives_no_shape():
    config = _config()
    del config.num_attention_heads
    assert model_shape(TwoLayers(), config)[0] is None
    assert model_shape(TwoLayers(), None) == (None, "the model has no config")


def test_the_parameter_dtype_is_where_most_elements_are():
    model = TwoLayers().to(torch.bfloat16)
    shape, _ = model_shape(model, _config())
    assert shape is not None and shape["parameter_dtype"] == "bfloat16"


def test_tf32_is_read_from_the_matmul_backend_whichever_api_set_it():
    matmul = torch.backends.cuda.matmul
    if getattr(matmul, "fp32_precision", None) is None:
        pytest.skip("torch before 2.9: no per-backend fp32 precision")
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        assert fp32_matmul_precision() == "tf32"
        matmul.fp32_precision = "ieee"
        assert fp32_matmul_precision() == "ieee"
    finally:
        matmul.fp32_precision = before
