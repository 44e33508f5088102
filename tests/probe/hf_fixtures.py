"""A tiny causal LM made locally for HF Trainer tests: no download, random weights.

The tokenizer is a ``tokenizers`` WordLevel model over this module's own 40 words, saved
as a ``PreTrainedTokenizerFast``; the model a GPT-2 config, by default 2 layers 32 wide. Both are
written with ``save_pretrained`` into a folder the test owns, and the training text into a
``train.txt`` beside them.
"""

from __future__ import annotations

import random
from pathlib import Path

WORDS = [f"w{i}" for i in range(40)]
SPECIAL = ["<unk>", "<eos>"]


def offline_env(home: Path) -> dict[str, str]:
    """Everything HF would download or cache, kept offline and under ``home``."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(home / "hf-home"),
        "HF_DATASETS_CACHE": str(home / "hf-datasets"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def write_tiny_model(
    folder: Path, *, positions: int = 64, width: int = 32, layers: int = 2, heads: int = 2
) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<eos>",
        bos_token="<eos>",
        pad_token="<eos>",
        model_max_length=positions,
    )
    tokenizer.save_pretrained(folder)
    config = GPT2Config(
        vocab_size=len(vocab),
        n_positions=positions,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        bos_token_id=1,
        eos_token_id=1,
    )
    config.save_pretrained(folder)
    return folder


def write_corpus(path: Path, lines: int, words_a_line: int = 12) -> Path:
    rng = random.Random(0)
    text = "".join(
        " ".join(rng.choice(WORDS) for _ in range(words_a_line)) + "\n" for _ in range(lines)
    )
    path.write_text(text)
    return path


# The re-run proof on transformers' run_clm.py (tests/probe/test_hf_trainer_rerun.py and
# ``bench/bench_fix.py --script run_clm``): 2,048 rows of 16-token blocks a batch, read and
# collated on the training thread, against a 1-layer, 32-wide GPT-2.
PROOF_BATCH, PROOF_BLOCK = 2048, 16


def write_run_clm_proof(folder: Path, steps: int) -> list[str]:
    """The proof's model and corpus written into ``folder`` (one epoch of ``steps``
    batches, 12 words a line), and run_clm.py's arguments for them."""
    model = folder / "model"
    if not model.exists():
        write_tiny_model(model, positions=PROOF_BLOCK, width=32, layers=1, heads=1)
        write_corpus(folder / "train.txt", lines=steps * PROOF_BATCH * PROOF_BLOCK // 12 + 1000)
    return [
        "--config_name", str(model), "--tokenizer_name", str(model),
        "--train_file", str(folder / "train.txt"), "--do_train",
        "--output_dir", str(folder / "out"), "--max_steps", str(steps),
        "--per_device_train_batch_size", str(PROOF_BATCH), "--block_size", str(PROOF_BLOCK),
        "--logging_steps", "10", "--report_to", "none", "--save_strategy", "no", "--use_cpu",
    ]  # fmt: skip
