"""A public training script nobody in this project wrote, run unmodified under
``pipeline-doctor profile``: pytorch/examples' word_language_model (provenance, licence and
hashes in tests/scripts/third_party/word_language_model/PROVENANCE.md).

Its data is made here: a 50-word corpus, 300 training lines of 12 words. The script's own
numbering gives the expected step count: 300 x (12 words + <eos>) = 3900 tokens, batchified
into 4 columns of 975; one epoch takes ``range(0, 974, bptt=10)`` = 98 batches, each an
AdamW step (``--use-optimizer``).
"""

from __future__ import annotations

import hashlib
import random

import pytest

from diagnostics.analyze import analyze
from diagnostics.runs import RunFolder
from tests.conftest import REPO_ROOT
from tests.probe.helpers import profile, run_folder

SCRIPT_DIR = REPO_ROOT / "tests" / "scripts" / "third_party" / "word_language_model"
PUBLISHED_SHA256 = {  # pytorch/examples at 77f55b91, as PROVENANCE.md lists them
    "main.py": "391de12bb7c6e07dbb105d47d017632bf80c01d2e5b25adbf83da9cdcdd5a862",
    "data.py": "15784815a6bd18e9b25eadf6ae049915f88d4fb8faebeba9d83ae6ec8e19883d",
    "model.py": "e4451a33e9b16953004bc639d736d14f42a2b21f2939ccabe4cff10d3c40b74c",
}
LINES, WORDS_A_LINE, BATCH, BPTT = 300, 12, 4, 10
EXPECTED_STEPS = len(range(0, LINES * (WORDS_A_LINE + 1) // BATCH - 1, BPTT))  # 98


def _corpus(folder):
    rng = random.Random(0)
    words = [f"w{i}" for i in range(50)]
    for name, lines in (("train.txt", LINES), ("valid.txt", 40), ("test.txt", 40)):
        text = "".join(
            " ".join(rng.choice(words) for _ in range(WORDS_A_LINE)) + "\n" for _ in range(lines)
        )
        (folder / name).write_text(text)
    return folder


def _run(tmp, lr, *, optimizer=True):
    data = _corpus(tmp)
    args = [
        "--data", str(data), "--epochs", "1", *(["--use-optimizer"] if optimizer else []),
        "--lr", lr,
        "--bptt", str(BPTT), "--batch_size", str(BATCH), "--emsize", "16", "--nhid", "16",
        "--nlayers", "1", "--save", str(tmp / "model.pt"), "--log-interval", "1000",
    ]  # fmt: skip
    result = profile(tmp / "runs", str(SCRIPT_DIR / "main.py"), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, RunFolder(run_folder(result))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {lr: _run(tmp_path_factory.mktemp(f"wlm-{lr}"), lr) for lr in ("20", "0.002")}


def test_the_vendored_files_are_the_published_ones():
    for name, digest in PUBLISHED_SHA256.items():
        assert hashlib.sha256((SCRIPT_DIR / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.slow
def test_an_unmodified_public_script_yields_a_complete_run_folder(runs):
    result, run = runs["20"]
    assert "End of training" in result.stdout  # the script's own last words
    status = run.status()
    assert (status.status, status.step) == ("completed", EXPECTED_STEPS)
    steps = run.steps()
    assert steps["step"].to_list() == list(range(1, EXPECTED_STEPS + 1))
    assert steps["loss"].null_count() == 0 and steps["grad_norm"].null_count() == 0
    # no DataLoader: the data wait is unknown, not zero
    assert steps["data_wait_ms"].null_count() == EXPECTED_STEPS
    assert run.dataloaders() == ()
    assert len(run.trace_files()) == 1 and run.samples().height > 0
    manifest = run.manifest()
    assert manifest.kind == "script"
    assert manifest.extra["script"]["sha256"] == PUBLISHED_SHA256["main.py"]
    assert manifest.extra["probe"]["optimizers"] == [
        {"class": "AdamW", "steps": EXPECTED_STEPS, "thread": "training"}
    ]


@pytest.mark.slow
def test_adamw_at_the_sgd_learning_rate_is_told_unstable_and_a_sane_one_is_not(runs):
    unstable = analyze(runs["20"][1].path)
    (finding,) = [f for f in unstable.findings if f.rule == "unstable-gradients"]
    assert "grad spikes" in finding.title
    # the norm before clipping (clip_grad_norm_'s result): after it, every step reads <= 0.25
    assert max(runs["20"][1].steps()["grad_norm"].to_list()) > 0.25
    quiet = analyze(runs["0.002"][1].path)
    assert "unstable-gradients" not in {f.rule for f in quiet.findings}
    assert "worker-restarts" in {s.rule for s in quiet.skipped}  # needs the trainer config


@pytest.mark.slow
def test_without_an_optimizer_each_batch_is_a_step_with_its_loss(tmp_path):
    """The script's default: no --use-optimizer, the weights updated by hand after each
    backward(). Before: 0 steps, no loss, and a note that no optimizer step was seen."""
    result, run = _run(tmp_path, "20", optimizer=False)
    assert "End of training" in result.stdout
    assert (run.status().status, run.status().step) == ("completed", EXPECTED_STEPS)
    steps = run.steps()
    assert steps["step"].to_list() == list(range(1, EXPECTED_STEPS + 1))
    assert steps["loss"].null_count() == 0 and steps["grad_norm"].null_count() == 0
    # a next-word loss over a 50-word vocabulary starts near ln(50)
    assert 3.0 < steps["loss"][0] < 5.0
    probe = run.manifest().extra["probe"]
    assert probe["steps_counted_by"] == "backward" and probe["optimizers"] == []
