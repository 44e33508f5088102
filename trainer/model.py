"""The multi-task model: one BERT backbone, a head per task, and a masked-LM head.

Built from a ``transformers.BertConfig`` with random initialisation: nothing is downloaded.
The masked-LM head shares the backbone, so the optional pre-training phase (the seed's
two-stage recipe: masked LM on the unlabelled text, then supervised fine-tuning) shapes
the same encoder the task heads read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import BertConfig, BertModel
from transformers.models.bert.modeling_bert import BertOnlyMLMHead

from trainer.config import ModelConfig

MLM_MASK_PROBABILITY = 0.15  # BERT's masking rate


@dataclass(frozen=True)
class TaskOutput:
    loss: torch.Tensor
    category_logits: torch.Tensor
    merchant_type_logits: torch.Tensor
    hidden: torch.Tensor  # the encoder's last hidden state, (batch, tokens, hidden)


class MultiTaskModel(nn.Module):
    def __init__(
        self,
        model: ModelConfig,
        *,
        vocab_size: int,
        max_length: int,
        num_categories: int,
        num_merchant_types: int,
        pad_id: int,
        store_dim: int = 0,
    ):
        super().__init__()
        self.bert_config = BertConfig(
            vocab_size=vocab_size,
            hidden_size=model.hidden_size,
            num_hidden_layers=model.layers,
            num_attention_heads=model.heads,
            intermediate_size=model.intermediate_size,
            max_position_embeddings=max_length,
            pad_token_id=pad_id,
        )
        self.backbone = BertModel(self.bert_config, add_pooling_layer=False)
        self.category_head = nn.Linear(model.hidden_size, num_categories)
        self.merchant_type_head = nn.Linear(model.hidden_size, num_merchant_types)
        self.mlm_head = BertOnlyMLMHead(self.bert_config)
        # created last and only with a store: every other weight draws the same initial
        # values as without one, and a run without a store is unchanged bit for bit
        self.store_projection = nn.Linear(store_dim, model.hidden_size) if store_dim else None

    def vocab_matrices(self) -> int:
        """Vocabulary-sized weight matrices: the input embedding, plus the masked-LM decoder
        unless it is tied to it (it is not: BertOnlyMLMHead outside a BertForMaskedLM gets
        its own decoder weight)."""
        embedding = self.backbone.embeddings.word_embeddings.weight
        decoder = self.mlm_head.predictions.decoder.weight
        return 1 if decoder is embedding else 2

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        category: torch.Tensor,
        merchant_type: torch.Tensor,
        store_vectors: torch.Tensor | None = None,
    ) -> TaskOutput:
        hidden = self.encode(input_ids, attention_mask)
        cls = hidden[:, 0]
        if self.store_projection is not None and store_vectors is not None:
            # the looked-up feature vector joins the statement's [CLS] summary for the heads
            cls = cls + self.store_projection(store_vectors.to(cls.dtype))
        category_logits = self.category_head(cls)
        merchant_type_logits = self.merchant_type_head(cls)
        # equal weights: both tasks are single-label classification of the same statement
        loss = F.cross_entropy(category_logits.float(), category) + F.cross_entropy(
            merchant_type_logits.float(), merchant_type
        )
        return TaskOutput(loss, category_logits, merchant_type_logits, hidden)

    def mlm_loss(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        logits = self.mlm_head(self.encode(input_ids, attention_mask))
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)


def mask_tokens(
    input_ids: torch.Tensor, special_ids: list[int], mask_id: int, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking: 15 % of real tokens are targets; of those 80 % [MASK], 10 % random,
    10 % kept. Draws from the default RNG of the tensor's device (checkpointed on resume).
    """
    special = torch.zeros_like(input_ids, dtype=torch.bool)
    for token_id in special_ids:
        special |= input_ids == token_id
    draw = torch.rand(input_ids.shape, device=input_ids.device)
    chosen = (draw < MLM_MASK_PROBABILITY) & ~special
    # A small batch of short lines can draw no target at all; its loss is then 0/0 = NaN
    # (seen on an H200 with batch 2). Then the real token with the lowest draw is the one
    # target. Decided on the device, with no host read: the same draws as before, so every
    # batch that had a target is masked exactly as before.
    lowest = draw.masked_fill(special, 2.0)
    chosen |= ~chosen.any() & (lowest == lowest.min()) & ~special
    # masked_fill/where, not x[mask] = ...: boolean-mask indexing counts the mask on the
    # host (nonzero), a device sync every step on CUDA; same draws, same values
    labels = input_ids.masked_fill(~chosen, -100)
    roll = torch.rand(input_ids.shape, device=input_ids.device)
    masked = input_ids.masked_fill(chosen & (roll < 0.8), mask_id)
    randomise = chosen & (roll >= 0.8) & (roll < 0.9)
    random_ids = torch.randint(vocab_size, input_ids.shape, device=input_ids.device)
    masked = torch.where(randomise, random_ids, masked)
    return masked, labels


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
