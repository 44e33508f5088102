"""An HF Trainer script nobody in this project wrote, run unmodified under
``pipeline-doctor profile``: transformers' examples/pytorch/language-modeling/run_clm.py
(provenance and hash in tests/scripts/third_party/run_clm/PROVENANCE.md).

Made here, nothing downloaded: a 2-layer, 32-wide GPT-2 config with random weights and a
WordLevel tokenizer over 40 words (tests/probe/hf_fixtures.py), and 200 lines of 12 of those
words. The Trainer's arguments give the expected figures: ``--max_steps 20`` optimizer
updates of ``--gradient_accumulation_steps 2`` micro-batches each, so 20 steps and 40
micro-batches at least (accelerate's loader fetches one batch ahead: one more is fetched).
``--logging_steps 5``: the script prints its Trainer's log every 5 updates, the mean loss
of the 5 and the last update's gradient norm, read by HF itself: that printout is the
oracle for the step records' loss and gradient norm.

The script is told ``--dataloader_num_workers 1`` and the wrapper ``--override
dataloader.num_workers=0``: the override must reach the loader the Trainer builds from its
TrainingArguments (and accelerate's re-built one), so the run has no worker process.

Its pathology: little or none the CPU run can show. No worker, but an Arrow dataset of
16-token blocks costs about a millisecond a batch against a 20-200 ms step (1-3 % waiting
measured idle, 5.5-5.9 % under load). too-few-workers (threshold 5 %) may fire or not,
as the measured share says; when it does, its fix is in TrainingArguments, at the
script's trainer.train() line, never in transformers' own code. No other rule fires.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import re
import statistics

import pytest

from diagnostics.analyze import analyze
from diagnostics.facts.mfu import model_utilisation, run_device_identity
from diagnostics.metrics import steady_steps
from diagnostics.runs import RunFolder
from diagnostics.sources import RunData
from diagnostics.thresholds import Thresholds
from tests.conftest import REPO_ROOT
from tests.probe.helpers import child_env, profile_command, run_folder
from tests.probe.hf_fixtures import offline_env, write_corpus, write_tiny_model

SCRIPT_DIR = REPO_ROOT / "tests" / "scripts" / "third_party" / "run_clm"
SCRIPT = SCRIPT_DIR / "run_clm.py"
# huggingface/transformers at 00d481d1, as PROVENANCE.md lists it
PUBLISHED_SHA256 = "1031342ea9c5cf11710b669a2aea574154821f9c323184c9c9d38bfca58aac7e"
MAX_STEPS, ACCUMULATION, BATCH, LOG_EVERY = 20, 2, 4, 5
# hf_fixtures' GPT-2: n_embd 32, 2 layers, 2 heads, a 42-word vocabulary (40 words and 2
# specials). N by hand: a block is ln_1 (2h), c_attn (3h² + 3h), c_proj (h² + h), ln_2 (2h),
# c_fc (4h² + 4h) and the MLP's c_proj (4h² + h), 12h² + 13h in all; then ln_f (2h) and the
# lm_head tied to wte, h·V, once; the position table left out
WIDTH, LAYERS, HEADS, VOCAB = 32, 2, 2, 42
TINY_GPT2_N = LAYERS * (12 * WIDTH**2 + 13 * WIDTH) + 2 * WIDTH + VOCAB * WIDTH  # 26,816
BLOCK = 16  # --block_size: run_clm's group_texts cuts the corpus into blocks of 16 real tokens
H200_FP32_TFLOPS = 67.0  # NVIDIA's H200 page: dense FP32 (no autocast in this run)
# where run_clm.py calls the Trainer (grep "trainer.train(" in the vendored copy): the
# line of the user's code under which the Trainer builds its DataLoader
TRAIN_CALL_LINE = 654


def _run(tmp):
    import subprocess

    model = write_tiny_model(tmp / "model")
    corpus = write_corpus(tmp / "train.txt", lines=200)
    args = [
        "--config_name", str(model), "--tokenizer_name", str(model),
        "--train_file", str(corpus), "--do_train", "--output_dir", str(tmp / "out"),
        "--max_steps", str(MAX_STEPS), "--per_device_train_batch_size", str(BATCH),
        "--gradient_accumulation_steps", str(ACCUMULATION), "--block_size", str(BLOCK),
        "--dataloader_num_workers", "1", "--logging_steps", str(LOG_EVERY),
        "--report_to", "none", "--save_strategy", "no", "--use_cpu",
    ]  # fmt: skip
    runs = tmp / "runs"
    result = subprocess.run(
        profile_command(runs, "--override", "dataloader.num_workers=0", str(SCRIPT), *args),
        cwd=tmp,
        env={**child_env(), **offline_env(tmp)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, RunFolder(run_folder(result))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("run-clm"))


def _logged(stdout: str) -> list[dict[str, float]]:
    """The Trainer's own log lines, as the script prints them: {'loss': '3.514', ...}."""
    rows = []
    for line in stdout.splitlines():
        if re.match(r"^\{'loss': ", line):
            rows.append({k: float(v) for k, v in ast.literal_eval(line).items()})
    return rows


def test_the_vendored_script_is_the_published_one():
    assert hashlib.sha256(SCRIPT.read_bytes()).hexdigest() == PUBLISHED_SHA256


@pytest.mark.slow
def test_an_unmodified_hf_trainer_script_yields_a_complete_run_folder(run):
    result, folder = run
    assert "***** train metrics *****" in result.stdout  # the script's own last words
    status = folder.status()
    assert (status.status, status.step) == ("completed", MAX_STEPS)
    steps = folder.steps()
    assert steps["step"].to_list() == list(range(1, MAX_STEPS + 1))
    for column in ("loss", "grad_norm", "data_wait_ms", "optimizer_ms", "rss_bytes"):
        assert steps[column].null_count() == 0, column
    manifest = folder.manifest()
    assert manifest.kind == "script"
    assert manifest.extra["script"]["sha256"] == PUBLISHED_SHA256
    probe = manifest.extra["probe"]
    assert probe["steps_counted_by"] == "explicit"  # the callback's steps
    # HF's AdamW under accelerate's wrapper: one optimizer, stepped once an update
    assert probe["optimizers"] == [{"class": "AdamW", "steps": MAX_STEPS, "thread": "training"}]
    assert manifest.extra["integrations"]["hf_trainer"] == {"trainers": 1, "callbacks_attached": 1}
    loaders = folder.dataloaders()
    assert {loader.num_workers for loader in loaders} == {0}
    assert sum(loader.batches for loader in loaders) >= MAX_STEPS * ACCUMULATION
    assert len(folder.trace_files()) == 1 and folder.samples().height > 0


@pytest.mark.slow
def test_each_steps_loss_and_grad_norm_agree_with_what_the_trainer_logged(run):
    result, folder = run
    logged = _logged(result.stdout)
    assert len(logged) == MAX_STEPS // LOG_EVERY
    steps = folder.steps()
    losses, norms = steps["loss"].to_list(), steps["grad_norm"].to_list()
    for index, row in enumerate(logged):
        window = losses[index * LOG_EVERY : (index + 1) * LOG_EVERY]
        # printed to 4 significant digits; a mean of the micro-batches would be half of it
        assert sum(window) / LOG_EVERY == pytest.approx(row["loss"], abs=6e-4)
        assert norms[(index + 1) * LOG_EVERY - 1] == pytest.approx(row["grad_norm"], abs=6e-4)


def _steady_wait_share_pct(steps) -> float:
    """Median over the steps after the first of data wait / step time, % (the key metrics'
    definition, docs/METRICS.md), from the step records themselves."""
    rows = steps.sort("step").to_dicts()[1:]
    return statistics.median(r["data_wait_ms"] / r["step_time_ms"] * 100 for r in rows)


@pytest.mark.slow
def test_the_trainers_loader_is_recorded_at_the_scripts_train_call_with_the_override(run):
    _, folder = run
    loaders = folder.dataloaders()
    assert loaders, "no DataLoader recorded"
    for loader in loaders:
        # the Trainer builds it (transformers/trainer.py), accelerate re-builds it: the
        # user's line is the one that called trainer.train()
        assert loader.site == f"run_clm.py:{TRAIN_CALL_LINE}", loader
        assert loader.code.startswith("train_result = trainer.train("), loader.code
        assert loader.built_by == "transformers"
        assert "site-packages" not in (loader.file or "")
        # --dataloader_num_workers 1 as the script passed it, 0 as the override made it
        assert (loader.num_workers, loader.overridden) == (0, {"num_workers": 1})
    lines = (folder.path / "dataloaders.jsonl").read_text().splitlines()
    raw = [json.loads(line) for line in lines]
    assert {r.get("rebuilt_from") for r in raw} >= {None, 0}  # accelerate's keeps the first's


@pytest.mark.slow
def test_no_finding_is_made_up_and_a_data_wait_finding_points_at_training_arguments(run):
    _, folder = run
    thresholds = Thresholds()
    analysis = analyze(folder.path, thresholds=thresholds)
    assert analysis.summary["data_wait_pct"] is not None  # measured: the data wait is known
    rules = [f.rule for f in analysis.findings]
    assert set(rules) <= {"too-few-workers"}, rules
    steps = folder.steps()
    share = _steady_wait_share_pct(steps)
    waits = sorted(steps.sort("step")["data_wait_ms"].to_list()[1:])
    if "too-few-workers" in rules:
        (finding,) = analysis.findings
        assert share >= thresholds.dataloader_share_min_pct, share
        assert finding.evidence["data_wait_share_pct"] == pytest.approx(share, abs=0.05)
        text = finding.recommendation + finding.fix.code
        assert f"run_clm.py:{TRAIN_CALL_LINE} trains with the HF Trainer" in text
        assert "TrainingArguments(" in finding.fix.code
        assert "--dataloader_num_workers " in finding.fix.code
        assert "site-packages" not in text and "transformers/" not in text
        assert finding.fix.config_patch == {
            "dataloader.num_workers": finding.evidence["recommended_num_workers"]
        }
    else:
        # silent: the share is under the threshold, or the median wait under the rule's
        # floor in ms (dataloader_wait_min_ms)
        assert (
            share < thresholds.dataloader_share_min_pct
            or statistics.median(waits) < thresholds.dataloader_wait_min_ms
        ), share
    assert "worker-restarts" in {s.rule for s in analysis.skipped}  # needs the trainer config


@pytest.mark.slow
def test_the_callback_records_the_models_shape_and_each_step_its_tokens(run):
    _, folder = run
    assert folder.manifest().extra["model_shape"] == {
        "source": "hf_trainer",
        "model_type": "gpt2",
        "non_embedding_params": TINY_GPT2_N,
        "layers": LAYERS,
        "heads": HEADS,
        "head_dim": WIDTH // HEADS,
        "vocab_size": VOCAB,
        "parameter_dtype": "float32",
        "fp32_matmul": "ieee",
    }
    steps = folder.steps()
    # every block is BLOCK real tokens (default_data_collator's attention mask all ones),
    # so a step's tokens are its samples x BLOCK, however many batches it fetched
    assert steps["tokens"].null_count() == 0
    assert steps["tokens"].to_list() == [BLOCK * b for b in steps["batch_size"].to_list()]
    assert set(steps["seq_len"].to_list()) == {float(BLOCK)}
    assert steps["tokens"].sum() >= MAX_STEPS * ACCUMULATION * BATCH * BLOCK


@pytest.mark.slow
def test_the_runs_mfu_on_an_h200_is_its_tokens_times_the_recorded_model_over_the_fp32_peak(run):
    """The CPU run has no peak: the same records, as if run.json said an H200, against a
    hand computation from steps.jsonl read with json. The run had no autocast and fp32
    parameters without TF32, so the peak is the fp32 one."""
    _, folder = run
    data = RunData.read(folder)
    environment = {**data.environment, "device": "cuda", "gpu_name": "NVIDIA H200"}
    on_h200 = dataclasses.replace(
        data, manifest=dataclasses.replace(data.manifest, environment=environment)
    )
    model = model_utilisation(
        on_h200, steady_steps(on_h200.steps), run_device_identity(environment)
    )
    assert model is not None and model.unknown_reason is None
    assert (model.precision, model.peak_tflops, model.device) == ("fp32", 67.0, "H200 SXM")
    records = [json.loads(line) for line in (folder.path / "steps.jsonl").read_text().splitlines()]
    per_token = 6 * TINY_GPT2_N + 12 * LAYERS * HEADS * (WIDTH // HEADS) * BLOCK  # 173,184
    expected = {
        r["step"]: 100 * r["tokens"] * per_token / (r["step_time_ms"] / 1000) / 67e12
        for r in records
        if r["step"] > 1  # the first step is not steady (warm-up)
    }
    assert {s.step: s.pct for s in model.steps} == pytest.approx(expected)
    assert model.median_pct == pytest.approx(statistics.median(expected.values()))
    assert model.flops_per_token == {"train": per_token}
