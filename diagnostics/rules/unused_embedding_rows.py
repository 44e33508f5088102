"""unused-embedding-rows: many vocabulary rows are never used by the data.

What it finds
    The share of the token vocabulary the training data never produces, from the run's
    vocabulary usage record (``vocab_usage`` in the run environment: ``vocab_size``,
    ``used_token_ids``, optionally ``embedding_dim``, ``embedding_matrices``), with the embedding parameters and the training memory that
    pruning the unused rows would save. The vocabulary size and embedding width fall back
    to the config's ``data.vocab_size`` and ``model.hidden_size``.

Why it matters
    Every row of the input embedding (and of a tied output projection) is a parameter with
    a gradient and two AdamW moments: rows no token ever selects cost memory and optimiser
    time and, in the output softmax, compute on every step.

How to fix
    Prune the vocabulary to the ids the data uses: remap ids once when preprocessing (ids
    outside the kept set become [UNK]) and build the embedding with only those rows. A
    smaller tokenizer vocabulary does not do it: WordPiece keeps its whole character
    alphabet and the intermediate merges whatever size it is asked for. In the reference
    trainer ``data.prune_vocab=true`` does the remap (the ids of the training split plus
    [PAD], [UNK], [CLS], [SEP] and, with masked-LM pre-training, [MASK]). On a GPU, pad
    the pruned size up to a multiple of 64 (misshapen-matmul: an output projection of, say,
    111 rows is off the Tensor Core alignment): the patch adds
    ``model.pad_vocab_to_multiple_of=64`` for a CUDA run whose pruned size is not one.
"""

from __future__ import annotations

from typing import Any, ClassVar

from diagnostics import percent
from diagnostics.model import AnalysisInputs
from diagnostics.rules import examples as ex
from diagnostics.rules.base import Example, Finding, Fix, Need, Rule, Severity
from diagnostics.rules.evidence import chart, config_value, r, run_device
from diagnostics.thresholds import Thresholds

# pad the pruned rows to this on a GPU: misshapen-matmul's vocabulary multiple
PAD_MULTIPLE = 64
# fp32 parameter + gradient + AdamW's two moments: 4 copies of each parameter in training.
TRAINING_COPIES = 4
BYTES_PER_PARAM = 4

FIX_CODE = """\
# before: the full tokenizer vocabulary
model = BertModel(BertConfig(vocab_size=tokenizer.get_vocab_size()))

# after: only the ids the training data uses, plus the special tokens
# (the reference trainer: --set data.prune_vocab=true)
specials = [tokenizer.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
kept = torch.unique(torch.cat([train_ids.flatten(), torch.tensor(specials)]))  # ascending
lookup = torch.full((tokenizer.get_vocab_size(),), int(torch.searchsorted(kept, specials[1])))
lookup[kept] = torch.arange(len(kept))  # old id -> new id; ids not kept -> [UNK]
train_ids, val_ids = lookup[train_ids], lookup[val_ids]  # one index lookup, no Python loop
model = BertModel(BertConfig(vocab_size=len(kept), pad_token_id=int(lookup[specials[0]])))
# on a GPU, pad the rows to a multiple of 64 (Tensor Core alignment; ids never reach them)
# vocab_size=(len(kept) + 63) // 64 * 64
"""


def vocab_usage(inputs: AnalysisInputs) -> dict[str, Any] | None:
    # the trainer records it in the run manifest's environment; a trace carries no token ids
    raw = inputs.run.environment.get("vocab_usage") if inputs.run is not None else None
    if not isinstance(raw, dict) or not isinstance(raw.get("used_token_ids"), int):
        return None
    usage = dict(raw)
    usage.setdefault("vocab_size", config_value(inputs.run, "data.vocab_size"))
    usage.setdefault("embedding_dim", config_value(inputs.run, "model.hidden_size"))
    if not isinstance(usage["vocab_size"], int) or usage["vocab_size"] <= 0:
        return None
    return usage


def _step_range(inputs: AnalysisInputs) -> list[int] | None:
    run = inputs.run
    if run is None or run.steps.height == 0 or "step" not in run.steps.columns:
        return None
    return [int(run.steps["step"].min()), int(run.steps["step"].max())]


class UnusedEmbeddingRows(Rule):
    id = "unused-embedding-rows"
    title = "Embedding rows the data never uses"
    severity = Severity.LOW
    needs = (
        Need(
            "the run's vocabulary usage record",
            lambda inputs: vocab_usage(inputs) is not None,
            "no vocabulary usage recorded: needs vocab_usage (vocab_size, used_token_ids) "
            "in the run environment; traces carry no token ids",
        ),
    )
    threshold_names = ("embedding_unused_min_pct",)

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        usage = vocab_usage(inputs)
        assert usage is not None
        vocab, used = int(usage["vocab_size"]), int(usage["used_token_ids"])
        unused = max(vocab - used, 0)
        pct = 100.0 * unused / vocab
        if pct < thresholds.embedding_unused_min_pct:
            return []
        dim = usage.get("embedding_dim")
        matrices = int(usage.get("embedding_matrices", 1))
        params = unused * dim * matrices if isinstance(dim, int) else None
        memory = params * BYTES_PER_PARAM * TRAINING_COPIES if params is not None else None
        evidence: dict[str, Any] = {
            "source": "run: vocabulary usage of the training data",
            "vocab_size": vocab,
            "used_token_ids": used,
            "unused_rows": unused,
            "unused_pct": r(pct, 1),
            "embedding_dim": dim,
            "embedding_matrices": matrices,
            "prunable_parameters": params,
            "training_memory_saved_bytes": memory,
            # the kept ids: the used ones (special tokens the data never uses add a few)
            "rows_after_pruning": used,
            # the training data feeds every step: the usage covers the run's whole range
            "steps": _step_range(inputs),
            "chart": chart(
                "bar",
                "Vocabulary rows",
                "rows",
                "count",
                ["used", "never used"],
                {"rows": [used, unused]},
                highlight_x=["never used"],
            ),
        }
        patch: dict[str, Any] = {"data.prune_vocab": True}
        pad = ""
        assert inputs.run is not None
        if run_device(inputs.run) == "cuda" and used % PAD_MULTIPLE:
            padded = -(-used // PAD_MULTIPLE) * PAD_MULTIPLE
            patch["model.pad_vocab_to_multiple_of"] = PAD_MULTIPLE
            evidence["rows_after_pruning_padded"] = padded
            pad = (
                f" On the GPU, then pad the {used} rows to {padded} (a multiple of "
                f"{PAD_MULTIPLE}: the Tensor Core alignment misshapen-matmul checks); the "
                "patch does both."
            )
        saved = (
            f", {params:,} parameters and about {memory / 2**20:.1f} MiB of training memory"
            if params is not None and memory is not None
            else ""
        )
        return [
            Finding(
                rule=self.id,
                severity=self.severity,
                title=f"{percent.pct(pct)} of the {vocab} vocabulary rows are never used by the data",
                evidence=evidence,
                recommendation=(
                    f"The data uses {used} of {vocab} token ids. Pruning the other {unused} rows "
                    f"saves {percent.pct(pct)} of the embedding{saved}: remap the ids the data uses to "
                    "0..n-1 once (the rest to [UNK]) and size the embedding to them. A smaller "
                    "tokenizer vocabulary would not shed them: WordPiece keeps its whole "
                    "character alphabet. The reference trainer does this with "
                    f"data.prune_vocab=true.{pad}"
                ),
                fix=Fix(code=FIX_CODE, config_patch=patch),
                estimated_saving_pct=None,
            )
        ]

    examples: ClassVar = (
        Example(
            "run: 1200 of 3000 token ids used",
            True,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(3, step_time_ms=10.0),
                    config={"data.vocab_size": 3000, "model.hidden_size": 192},
                    environment={**ex.CPU_ENV, "vocab_usage": {"used_token_ids": 1200}},
                )
            ),
        ),
        Example(
            "CUDA run: 1200 of 3000 ids used: prune, then pad the 1200 rows to 1216",
            True,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(3, step_time_ms=10.0),
                    config={"data.vocab_size": 3000, "model.hidden_size": 192},
                    environment={**ex.CUDA_ENV, "vocab_usage": {"used_token_ids": 1200}},
                )
            ),
            expect=lambda f: _expect_padded(f, 1216),  # 19 x 64
        ),
        Example(
            "run: 2900 of 3000 token ids used",
            False,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(3, step_time_ms=10.0),
                    config={"data.vocab_size": 3000, "model.hidden_size": 192},
                    environment={**ex.CPU_ENV, "vocab_usage": {"used_token_ids": 2900}},
                )
            ),
        ),
        Example(
            "run: vocabulary pruned from 372 to 112 rows, 111 used ([UNK] kept, unused)",
            False,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(3, step_time_ms=10.0),
                    config={"data.vocab_size": 3000, "model.hidden_size": 192},
                    environment={
                        **ex.CPU_ENV,
                        "vocab_usage": {
                            "used_token_ids": 111,
                            "vocab_size": 112,
                            "pruned_from": 372,
                        },
                    },
                )
            ),
        ),
    )


def _expect_padded(finding: Finding, rows: int) -> None:
    assert finding.fix.config_patch == {
        "data.prune_vocab": True,
        "model.pad_vocab_to_multiple_of": PAD_MULTIPLE,
    }
    assert finding.evidence["rows_after_pruning_padded"] == rows
