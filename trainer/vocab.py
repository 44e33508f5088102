"""The model's vocabulary, and its pruning to the token ids the data uses (``data.prune_vocab``).

WordPiece keeps its whole character alphabet and every intermediate merge, yet greedy
longest-match tokenisation of the same texts emits mostly the longest pieces: most rows of
the tokenizer's vocabulary are never fed to the model. With pruning (the seed pipeline's
recipe) the trainer keeps only the ids the training split produces plus the special tokens
the model needs, renumbers them ``0..kept-1`` in their original order, and builds the
embedding with that many rows. One lookup tensor (old id -> new id) remaps every id fed to
the model; ids it did not keep (text seen only in validation, or an augmented variant)
become [UNK], as an out-of-vocabulary piece would.

The kept set is a pure function of the run's own ``tokenizer.json`` and its (seeded) corpus,
so a resumed run rebuilds the same map; checkpoints also carry it and are checked against it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

log = logging.getLogger("trainer")

# fed to the model by every pipeline: padding, sequence markers, and [UNK] for ids outside
# the kept set; [MASK] only when masked-LM pre-training puts it into the inputs
ALWAYS_KEPT = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
# never chosen as masked-LM targets
NOT_MASKED = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
SCAN_CHUNK = 8192  # texts tokenised at a time when no ids are cached: bounded memory


@dataclass(frozen=True)
class ModelVocab:
    """The ids the model sees: its embedding rows and special tokens, in its own numbering."""

    size: int  # embedding rows
    original_size: int  # the tokenizer's vocabulary
    pad_id: int
    unk_id: int
    mask_id: int | None  # None when [MASK] was pruned (no masked-LM pre-training)
    special_ids: tuple[int, ...]  # never masked-LM targets
    # old ids kept, ascending (new id = position); None when the vocabulary is not pruned
    kept_ids: torch.Tensor | None = None
    # old id -> new id, [UNK]'s new id where not kept; None when not pruned
    lookup: torch.Tensor | None = None

    @property
    def pruned(self) -> bool:
        return self.lookup is not None

    def remap(self, ids: torch.Tensor) -> torch.Tensor:
        """Tokenizer ids as model ids (one index lookup; unchanged when not pruned)."""
        return ids if self.lookup is None else self.lookup[ids]

    def same_kept_ids(self, kept_ids: torch.Tensor | None) -> bool:
        """Whether a checkpoint's kept ids (None: not pruned) are this vocabulary's."""
        if kept_ids is None or self.kept_ids is None:
            return kept_ids is None and self.kept_ids is None
        return torch.equal(kept_ids.cpu(), self.kept_ids)


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"tokenizer has no {token} token")
    return token_id


def full_vocab(tokenizer: Tokenizer) -> ModelVocab:
    """The tokenizer's vocabulary as is: one embedding row per token."""
    return ModelVocab(
        size=tokenizer.get_vocab_size(),
        original_size=tokenizer.get_vocab_size(),
        pad_id=_token_id(tokenizer, "[PAD]"),
        unk_id=_token_id(tokenizer, "[UNK]"),
        mask_id=_token_id(tokenizer, "[MASK]"),
        special_ids=tuple(_token_id(tokenizer, t) for t in NOT_MASKED),
    )


def pruned_vocab(tokenizer: Tokenizer, used: np.ndarray, *, masking: bool) -> ModelVocab:
    """Only the ids ``used`` marks (a bool per tokenizer id), plus the special tokens.

    ``masking``: masked-LM pre-training runs, so [MASK] is kept too.
    """
    original = tokenizer.get_vocab_size()
    if used.shape != (original,) or used.dtype != np.bool_:
        raise ValueError(f"used must be {original} booleans, got {used.dtype} {used.shape}")
    keep = used.copy()
    specials = ALWAYS_KEPT + (("[MASK]",) if masking else ())
    keep[[_token_id(tokenizer, t) for t in specials]] = True
    kept = torch.from_numpy(np.flatnonzero(keep)).long()
    unk_new = int(torch.searchsorted(kept, _token_id(tokenizer, "[UNK]")))
    lookup = torch.full((original,), unk_new, dtype=torch.long)
    lookup[kept] = torch.arange(len(kept))

    def new(token: str) -> int:
        return int(lookup[_token_id(tokenizer, token)])

    return ModelVocab(
        size=len(kept),
        original_size=original,
        pad_id=new("[PAD]"),
        unk_id=unk_new,
        mask_id=new("[MASK]") if masking else None,
        special_ids=tuple(new(t) for t in NOT_MASKED if masking or t != "[MASK]"),
        kept_ids=kept,
        lookup=lookup,
    )


def model_vocab(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    ids: torch.Tensor | None,
    *,
    prune: bool,
    masking: bool,
) -> ModelVocab:
    """The tokenizer's vocabulary, or with ``prune`` only the ids that ``texts`` (or their
    cached ``ids``, in the tokenizer's numbering) use plus the special tokens."""
    if not prune:
        return full_vocab(tokenizer)
    used = used_id_mask(tokenizer, texts, ids, tokenizer.get_vocab_size())
    vocab = pruned_vocab(tokenizer, used, masking=masking)
    log.info("vocabulary pruned to the %d of %d ids the data uses", vocab.size, used.size)
    return vocab


def used_id_mask(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    ids: torch.Tensor | None,
    size: int,
    lookup: torch.Tensor | None = None,
) -> np.ndarray:
    """A bool per id of a ``size``-row vocabulary: which ids the model is fed.

    From the cached ``ids`` (already in the model's numbering) when there are some, else by
    tokenising ``texts`` in chunks and mapping them through ``lookup``.
    """
    used = np.zeros(size, dtype=bool)
    if ids is not None:
        used[torch.unique(ids).numpy()] = True
        return used
    for start in range(0, len(texts), SCAN_CHUNK):
        encoded = tokenizer.encode_batch(list(texts[start : start + SCAN_CHUNK]))
        chunk = np.unique(np.fromiter(itertools.chain.from_iterable(e.ids for e in encoded), int))
        if lookup is not None:
            chunk = lookup.numpy()[chunk]
        used[chunk] = True
    return used
