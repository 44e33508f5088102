"""model.size: the cpu and gpu size presets, resolved when the run starts (issue 9).

The gpu figures are the ones measured on an H200 (../shared/gpu-runs/h200-sized/m768l6b256:
82.7 % GPU busy, 34.9 ms a step); the cpu figures are the defaults CPU CI has always run.
"""

from __future__ import annotations

import json

import pytest

from diagnostics.thresholds import DEFAULT_THRESHOLDS
from tests.conftest import run_trainer_cli
from trainer.config import (
    SCENARIO_PRESETS,
    SCENARIOS,
    SIZE_PRESETS,
    ConfigError,
    TrainerConfig,
    build_config,
    resolve_size,
)

CPU_SIZE = {
    "model.hidden_size": 192,
    "model.layers": 2,
    "model.heads": 4,
    "model.intermediate_size": 768,
    "train.batch_size": 32,
    "data.max_length": 32,
    "data.num_workers": 1,
}
H200_SIZE = {  # h200-sized/m768l6b256, as PROVENANCE.md records its --set values
    "model.hidden_size": 768,
    "model.layers": 6,
    "model.heads": 12,
    "model.intermediate_size": 3072,
    "train.batch_size": 256,
    "data.max_length": 128,
    "data.num_workers": 4,
}


def _values(config: TrainerConfig, keys) -> dict:
    flat = config.to_flat()
    return {key: flat[key] for key in keys}


def test_cpu_runs_keep_todays_size_exactly():
    # the defaults (what every CPU test and CI run has used) are the cpu preset
    assert _values(TrainerConfig(), CPU_SIZE) == CPU_SIZE
    assert SIZE_PRESETS["cpu"] == CPU_SIZE
    config = build_config("healthy", resolved_device="cpu")
    assert config.model.size == "cpu"
    assert _values(config, CPU_SIZE) == CPU_SIZE


def test_auto_on_cuda_is_the_measured_h200_size():
    assert SIZE_PRESETS["gpu"] == H200_SIZE
    config = build_config("healthy", resolved_device="cuda")
    assert config.model.size == "gpu"
    assert _values(config, H200_SIZE) == H200_SIZE


def test_auto_stays_auto_until_the_device_is_known():
    # a form validated without torch: cpu values, size still "auto" (decided at run start)
    config = build_config("healthy")
    assert config.model.size == "auto"
    assert _values(config, CPU_SIZE) == CPU_SIZE
    assert resolve_size("auto", None) == "auto"
    assert (resolve_size("auto", "cuda"), resolve_size("auto", "cpu")) == ("gpu", "cpu")
    assert resolve_size("gpu", "cpu") == "gpu"  # an explicit choice is never replaced


def test_explicit_settings_override_the_preset():
    config = build_config(
        "healthy",
        {"model.hidden_size": 384, "model.heads": 6, "train.batch_size": "128"},
        resolved_device="cuda",
    )
    assert (config.model.hidden_size, config.model.heads, config.train.batch_size) == (384, 6, 128)
    assert config.model.layers == 6  # the rest of the gpu preset stays
    explicit = build_config("healthy", {"model.size": "gpu"}, resolved_device="cpu")
    assert explicit.model.size == "gpu" and explicit.model.hidden_size == 768


def test_scenario_presets_apply_after_the_size_preset():
    for name in SCENARIOS:
        config = build_config(name, resolved_device="cuda")
        for key, value in SCENARIO_PRESETS[name].items():
            assert config.to_flat()[key] == value, (name, key)
    assert build_config("small-batch", resolved_device="cuda").train.batch_size == 2


def test_a_preset_value_that_does_not_fit_says_where_it_came_from():
    with pytest.raises(ConfigError) as info:
        build_config("healthy", {"data.rows": 240}, resolved_device="cuda")
    assert info.value.key == "train.batch_size"
    assert "from the model.size=gpu preset" in str(info.value)
    # typed by the user: no hint about a preset
    with pytest.raises(ConfigError) as info:
        build_config("healthy", {"data.rows": 240, "train.batch_size": 300})
    assert "preset" not in str(info.value)


def test_resolved_size_is_what_a_stored_config_replays():
    config = build_config("healthy", resolved_device="cuda")
    again = TrainerConfig.from_dict(config.to_dict())
    assert again.model.size == "gpu" and again.to_flat() == config.to_flat()


def _h2d_bytes_per_step(config: TrainerConfig) -> int:
    # input_ids + attention_mask (int64, batch x tokens) and two int64 labels per sample
    batch, tokens = config.train.batch_size, config.data.max_length
    return batch * tokens * 8 * 2 + batch * 8 * 2


def test_each_scenario_still_shows_its_fault_at_the_gpu_size():
    gpu = {name: build_config(name, resolved_device="cuda") for name in SCENARIOS}
    healthy_batch = gpu["healthy"].train.batch_size
    # small-batch: two orders of magnitude below the healthy batch, as at the cpu size
    assert gpu["small-batch"].train.batch_size * 64 <= healthy_batch
    # no-pin-memory: its pageable copies over the profiler's active steps must clear the
    # missing-pin-memory rule's floor (they did not at the cpu size: h200-default/
    # gpu-no-pin-memory fired too-few-workers instead)
    active = gpu["no-pin-memory"].profiler.active
    floor = DEFAULT_THRESHOLDS.pageable_h2d_min_bytes
    assert _h2d_bytes_per_step(gpu["no-pin-memory"]) * active >= floor
    cpu_no_pin = build_config("no-pin-memory", resolved_device="cpu")
    assert _h2d_bytes_per_step(cpu_no_pin) * active < floor
    # slow-loader: no workers and 2 ms a sample, far beyond the 34.9 ms GPU step measured
    # for the healthy run at this size
    slow = gpu["slow-loader"]
    assert slow.data.num_workers == 0
    assert slow.train.batch_size * slow.data.sample_latency_ms > 10 * 34.9
    # fp32: no autocast and TF32 off; its fix is bf16 autocast
    assert (gpu["fp32"].train.amp, gpu["fp32"].train.tf32) == ("off", False)
    assert gpu["healthy"].train.amp == "bf16"


def test_cli_records_the_resolved_size_in_the_manifest(tiny_run):
    manifest = json.loads((tiny_run / "run.json").read_text())
    assert manifest["config"]["model"]["size"] == "cpu"
    assert manifest["environment"]["model_size"] == "cpu"
    assert manifest["environment"]["model_size_requested"] == "auto"


def test_cli_refuses_a_preset_that_does_not_fit_before_creating_a_folder(tmp_path):
    result = run_trainer_cli(
        [
            "run",
            "--device",
            "cpu",
            "--set",
            "model.size=gpu",
            "--set",
            "data.rows=240",
            "--runs-dir",
            str(tmp_path),
        ]
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: train.batch_size: 256 is larger than")
    assert "model.size=gpu preset" in result.stderr
    assert not any(tmp_path.iterdir())
