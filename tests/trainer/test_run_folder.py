"""A real run's folder: status, step records, samples, trace, checkpoints, manifest."""

from __future__ import annotations

import json

import polars as pl
import psutil
import pytest
import torch
from torch_tb_profiler.profiler.data import RunProfileData

from diagnostics.runs import STEP_SCHEMA, RunFolder
from trainer.config import TrainerConfig, split_sizes
from trainer.corpus import SPECIAL_TOKENS, load_tokenizer, make_corpus

# tiny_run (tests/conftest.py): 2 masked-LM steps, then 8 fine-tuning steps, batches of 16,
# checkpoints every 4 steps, profiler schedule wait=1, warmup=1, active=3 from fine-tuning.
PRETRAIN, FINETUNE = 2, 8
TOTAL = PRETRAIN + FINETUNE


@pytest.fixture(scope="module")
def run(tiny_run):
    return RunFolder(tiny_run)


def test_status_is_completed_with_every_step(run):
    status = run.status()
    assert status.status == "completed"
    assert status.reason is None
    assert (status.step, status.total_steps) == (TOTAL, TOTAL)
    assert status.started_at <= status.ended_at


def test_a_record_for_every_step_with_every_cpu_field(run):
    steps = run.steps()
    assert steps["step"].to_list() == list(range(1, TOTAL + 1))
    assert steps["phase"].to_list() == ["pretrain"] * PRETRAIN + ["finetune"] * FINETUNE
    cpu_fields = [
        name
        for name in STEP_SCHEMA
        # CUDA / fp16 only; marks are null on steps with no known cause; the embedding
        # store's read counts exist only with a store (data.embedding_store); tokens and
        # seq_len are a script run's (the trainer's MFU reads batch x data.max_length)
        if not name.startswith(("cuda_", "store_"))
        and name not in ("amp_scale", "marks", "tokens", "seq_len")
    ]
    assert steps.select(cpu_fields).null_count().sum_horizontal().item() == 0
    store_fields = [name for name in STEP_SCHEMA if name.startswith("store_")]
    assert store_fields and steps.select(store_fields).null_count().row(0) == (TOTAL,) * len(
        store_fields
    )
    assert steps["amp_scale"].null_count() == TOTAL
    assert (steps["batch_size"] == 16).all()
    # the phases add up to the step: wait + copy + compute + optimiser (ms, float rounding)
    parts = steps["data_wait_ms"] + steps["h2d_ms"] + steps["compute_ms"] + steps["optimizer_ms"]
    assert ((parts - steps["step_time_ms"]).abs() < 1e-6).all()
    # the loading part of the wait is within it (two clocks read microseconds apart)
    assert ((steps["loading_wait_ms"] - steps["data_wait_ms"]) < 0.1).all()
    assert (steps["loading_wait_ms"] >= 0).all()
    # samples/s is the batch over the step time
    expected = 16 / (steps["step_time_ms"] / 1000)
    assert ((steps["samples_per_s"] - expected).abs() < 1e-6 * expected).all()
    assert steps["wall_time"].is_sorted()
    assert (steps["rss_bytes"] > 0).all()
    assert (steps["lr"] == 1e-3).all()


def test_profiled_steps_are_the_schedules_active_window(run):
    # fine-tuning starts at global step 3: step 3 waits, step 4 warms up, 5-7 are recorded
    profiled = run.steps().filter(pl.col("profiled"))["step"].to_list()
    assert profiled == [PRETRAIN + 3, PRETRAIN + 4, PRETRAIN + 5]


def test_step_marks_name_the_known_causes_of_extra_time(run):
    marks = dict(zip(*run.steps().select("step", "marks"), strict=True))
    # each phase's first batch starts an epoch; checkpoint_every=4 writes one after step 4;
    # the profiler warms up at step 4, records 5-7 and writes its trace before step 8;
    # the second checkpoint comes after step 8
    assert marks == {
        1: "epoch_start",
        2: None,
        3: "epoch_start",
        4: "profiler_warmup",
        5: "after_checkpoint,profiler_active",
        6: "profiler_active",
        7: "profiler_active",
        8: "after_trace_export",
        9: "after_checkpoint",
        10: None,
    }


def test_trace_parses_with_torch_tb_profilers_own_loader(run, tmp_path):
    traces = run.trace_files()
    assert len(traces) == 1  # repeat=1: one window, one file
    assert traces[0].name.endswith(".pt.trace.json.gz")
    profile = RunProfileData.parse("worker0", "span", str(traces[0]), str(tmp_path))
    assert len(profile.steps_names) == 3  # the three active steps
    assert profile.events


def test_system_samples_join_the_step_clock(run):
    samples = run.samples()
    status = run.status()
    assert samples.height >= 5  # 10 Hz over a run of several seconds
    assert samples["wall_time"].min() >= status.started_at
    assert samples["wall_time"].max() <= status.ended_at
    assert (samples["trainer_rss_bytes"] > 0).all()
    assert (samples["cpu_percent"] >= 0).all()
    # healthy has one DataLoader worker: seen (with its own RSS) while an epoch is loading
    with_workers = samples.filter(pl.col("worker_count") >= 1)
    assert with_workers.height > 0
    assert (with_workers["workers_rss_bytes"] > 0).all()


def _nvml_sees_a_gpu() -> bool:
    """Asked of pynvml here, not read from the run's samples (the output under test)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return pynvml.nvmlDeviceGetCount() > 0
    finally:
        pynvml.nvmlShutdown()


def test_no_nvml_is_noted_once_and_samples_carry_no_gpu(run):
    # decided by the host: a sampler that wrote a GPU index without NVML skipped this before
    if _nvml_sees_a_gpu():
        pytest.skip("NVML sees a GPU here: covered by the gpu tests")
    assert run.samples()["gpu_index"].null_count() == run.samples().height > 0
    notes = [n for n in run.manifest().notes if n.startswith("NVML unavailable")]
    assert len(notes) == 1
    assert run.samples()["gpu_util_pct"].null_count() == run.samples().height


def test_checkpoints_every_n_steps_keep_the_newest_two(run):
    # saved at 4, 8 and the final step 10; the two newest stay
    assert [p.name for p in run.checkpoints()] == ["step_00000008.pt", "step_00000010.pt"]


def test_manifest_holds_the_config_to_rerun_and_the_environment(run):
    manifest = run.manifest()
    config = TrainerConfig.from_dict(manifest.config)
    assert config.scenario == "healthy"
    assert (config.train.steps, config.train.pretrain_steps, config.data.rows) == (8, 2, 400)
    env = manifest.environment
    assert env["device"] == "cpu"
    assert env["cpu_count"] >= 1
    assert env["pytorch_version"].startswith("2.")
    assert env["torch_threads"] >= 1
    # the CLI pins MKL's reproducible mode for the run (no test sets these variables)
    assert env["math_library_env"] == {
        "MKL_CBWR": "AUTO",
        "MKL_DYNAMIC": "FALSE",
        "OMP_DYNAMIC": "FALSE",
    }
    raw = json.loads((run.path / "run.json").read_text())
    assert raw["model_parameters"] > 100_000
    assert raw["evaluations"][-1]["step"] == TOTAL
    assert 0.0 <= raw["evaluations"][-1]["category_accuracy"] <= 1.0


def test_the_runs_tokenizer_is_kept_for_resume(run):
    vocab = json.loads((run.path / "tokenizer.json").read_text())["model"]["vocab"]
    assert {"[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"} <= set(vocab)


def test_parquet_is_written_and_log_kept(run):
    assert (run.path / "steps.parquet").is_file()
    assert (run.path / "samples.parquet").is_file()
    assert pl.read_parquet(run.path / "steps.parquet").height == TOTAL
    assert "completed after" in run.log_tail()


def test_environment_records_the_memory_totals_the_leak_rule_projects_against(run):
    env = run.manifest().environment
    # the host's RAM, as psutil reports it on this (the same) machine
    assert env["memory_total_bytes"] == psutil.virtual_memory().total
    # a CPU run records no GPU total (the CUDA one is checked in test_gpu.py)
    assert "gpu_memory_bytes" not in env


def test_environment_records_steps_per_epoch_of_the_training_split(run):
    config = TrainerConfig.from_dict(run.manifest().config)
    train_rows, _ = split_sizes(config.data.rows)
    # 400 rows keep 400 - max(32, 40) = 360 for training; batches of 16, the last partial
    # one counted: ceil(360 / 16) = 23 steps, where data.rows alone would say 25
    assert (train_rows, config.train.batch_size) == (360, 16)
    assert run.manifest().environment["steps_per_epoch"] == 23


def test_vocab_usage_is_recorded_from_the_tokenised_training_split(run):
    usage = run.manifest().environment["vocab_usage"]
    config = TrainerConfig.from_dict(run.manifest().config)
    # the model's embedding rows: the checkpoint's word embedding and (untied) MLM decoder
    state = torch.load(run.checkpoints()[-1], map_location="cpu", weights_only=False)["model"]
    rows, width = state["backbone.embeddings.word_embeddings.weight"].shape
    assert state["mlm_head.predictions.decoder.weight"].shape == (rows, width)
    assert (usage["vocab_size"], usage["embedding_dim"]) == (rows, width)
    assert usage["embedding_matrices"] == 2 and width == config.model.hidden_size
    # WordPiece stops at what the corpus supports: fewer rows than data.vocab_size asked for
    assert usage["requested_vocab_size"] == config.data.vocab_size > rows
    # recounted from the run's own tokenizer over the training split of the same corpus,
    # plus [MASK], which the 2 masked-LM steps feed to the model
    tokenizer = load_tokenizer(run.path / "tokenizer.json", config.data.max_length)
    n_train, _ = split_sizes(config.data.rows)
    texts = make_corpus(config.data.rows, config.seed)["text"].to_list()[:n_train]
    ids = {i for encoding in tokenizer.encode_batch(texts) for i in encoding.ids}
    ids.add(tokenizer.token_to_id("[MASK]"))
    assert usage["used_token_ids"] == len(ids)
    # more than the 5 special tokens, never more than the vocabulary
    assert len(SPECIAL_TOKENS) < usage["used_token_ids"] <= rows
