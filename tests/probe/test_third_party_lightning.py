"""A public Lightning script nobody in this project wrote, run unmodified under
``pipeline-doctor profile``: Lightning's examples/pytorch/basics/transformer.py (provenance,
licence and hash in tests/scripts/third_party/lightning_transformer/PROVENANCE.md).

Its data is made here: ``./data/wikitext-2.txt``, 11728 lines of 11 words from a 50-word
vocabulary. The script's own numbers give the expected steps: ``WikiText2`` has
``len(tokens) // 35 - 1`` = 140736 // 35 - 1 = 4020 blocks, ``random_split`` keeps
``n - 4000`` = 20 for training, one batch of 20 an epoch, ``max_epochs=20``: 20 steps, of
which Lightning's ``max_steps`` (an environment default, below: the script leaves it out)
keeps 8, so 8 epochs. The callback is attached by the wrapper (the script does not know it).
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
import subprocess

import pytest

from diagnostics.analyze import analyze
from diagnostics.runs import RunFolder
from tests.conftest import REPO_ROOT
from tests.probe.helpers import child_env, line_of, profile_command, run_folder

SCRIPT_DIR = REPO_ROOT / "tests" / "scripts" / "third_party" / "lightning_transformer"
SCRIPT = SCRIPT_DIR / "transformer.py"
PUBLISHED_SHA256 = "417e7ceb2e0611d7656ea6ea72927c18a04dcf4fda824e3baca2645a9e464367"
ALIAS = REPO_ROOT / "tests" / "scripts" / "lightning_alias"
LINES, WORDS_A_LINE, VOCABULARY = 11728, 11, 50
BLOCK, BATCH, MAX_EPOCHS, HELD_OUT = 35, 20, 20, 4000  # the script's and WikiText2's own
MAX_STEPS = 8  # a step is ~0.5 s of CPU (nn.Transformer's 2048-wide feed-forward)
BLOCKS = LINES * (WORDS_A_LINE + 1) // BLOCK - 1  # each line ends in <eos>
BATCHES_AN_EPOCH = math.ceil((BLOCKS - HELD_OUT) / BATCH)  # 1
EXPECTED_STEPS = min(MAX_STEPS, MAX_EPOCHS * BATCHES_AN_EPOCH)  # 8
EPOCHS = EXPECTED_STEPS // BATCHES_AN_EPOCH
CLIP = 0.25  # the script's gradient_clip_val
# Lightning's own defaults for Trainer arguments the script leaves out: quiet, no files,
# one validation and one test batch, MAX_STEPS steps
LIGHTNING_ENV = {
    "PL_TRAINER_MAX_STEPS": str(MAX_STEPS),
    "PL_TRAINER_ENABLE_PROGRESS_BAR": "False",
    "PL_TRAINER_LOGGER": "False",
    "PL_TRAINER_ENABLE_CHECKPOINTING": "False",
    "PL_TRAINER_ENABLE_MODEL_SUMMARY": "False",
    "PL_TRAINER_LIMIT_VAL_BATCHES": "1",
    "PL_TRAINER_LIMIT_TEST_BATCHES": "1",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    work = tmp_path_factory.mktemp("lightning-transformer")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(VOCABULARY)]
    (work / "data").mkdir()
    (work / "data" / "wikitext-2.txt").write_text(
        "".join(
            " ".join(rng.choice(words) for _ in range(WORDS_A_LINE)) + "\n" for _ in range(LINES)
        )
    )
    env = child_env()
    env.update(LIGHTNING_ENV, PYTHONPATH=f"{REPO_ROOT}:{ALIAS}")
    result = subprocess.run(
        profile_command(work / "runs", str(SCRIPT)),
        cwd=work,  # WikiText2 reads ./data
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, RunFolder(run_folder(result))


def test_the_vendored_file_is_the_published_one():
    assert hashlib.sha256(SCRIPT.read_bytes()).hexdigest() == PUBLISHED_SHA256


@pytest.mark.slow
def test_an_unmodified_lightning_example_yields_a_complete_run_folder(run):
    result, folder = run
    assert "test_loss" in result.stdout  # the script's trainer.test() table: it ran to its end
    status = folder.status()
    assert (status.status, status.step) == ("completed", EXPECTED_STEPS)
    steps = folder.steps()
    assert steps["step"].to_list() == list(range(1, EXPECTED_STEPS + 1))
    assert steps["batch_size"].to_list() == [BATCH] * EXPECTED_STEPS
    assert steps["loss"].null_count() == 0 and steps["data_wait_ms"].null_count() == 0
    # an untrained model over 50 words + <eos> predicts about uniformly: ln(51) = 3.93
    assert steps["loss"][0] == pytest.approx(math.log(VOCABULARY + 1), abs=0.3)
    # the norm before the script's clipping: after it, none would exceed 0.25
    assert min(steps["grad_norm"].to_list()) > CLIP
    assert min(steps["rss_bytes"].to_list()) > 0
    assert len(folder.trace_files()) == 1 and folder.samples().height > 0
    manifest = folder.manifest()
    assert manifest.kind == "script"
    assert manifest.extra["script"]["sha256"] == PUBLISHED_SHA256
    assert manifest.extra["probe"]["optimizers"] == [
        {"class": "SGD", "steps": EXPECTED_STEPS, "thread": "training"}
    ]
    assert manifest.extra["lightning"] == {
        "package": "pytorch_lightning",
        "callbacks": 1,
        "attached": "automatic",
    }


@pytest.mark.slow
def test_its_three_loaders_are_recorded_at_the_scripts_lines(run):
    _, folder = run
    loaders = folder.dataloaders()
    assert [r.site for r in loaders] == [
        f"transformer.py:{line_of(SCRIPT, name)}"
        for name in ("train_dataloader = DataLoader(", "val_dataloader = ", "test_dataloader = ")
    ]
    assert [r.num_workers for r in loaders] == [0, 0, 0]
    # every training batch is one step's; validation: one sanity batch and one an epoch
    assert [r.batches for r in loaders] == [EXPECTED_STEPS, 1 + EPOCHS, 1]


@pytest.mark.slow
def test_loaders_without_workers_are_not_told_too_few_workers_when_nothing_waits(run):
    _, folder = run
    # each step's share of its time waiting for the batch, over the steady steps (the first,
    # which starts the loop, left out): the figure the cards, the reports and the rule read
    steady = folder.steps().slice(1)
    shares = [w / t for w, t in zip(steady["data_wait_ms"], steady["step_time_ms"], strict=True)]
    # a batch is 20 slices of a tensor: the loader is not what the steps wait on. The median
    # step, as the tool judges: a loaded host can take the CPU from one step during its fetch
    assert statistics.median(shares) < 0.02
    result = analyze(folder.path)
    assert result.metrics.data_wait_pct == pytest.approx(statistics.median(shares) * 100)
    assert "too-few-workers" not in {s.rule for s in result.skipped}  # it ran, and is silent
    # nothing else is wrong with this job either: no finding at all
    assert [f.rule for f in result.findings] == []
