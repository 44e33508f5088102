"""trainer.config: dotted keys, presets, --set coercion, one-line errors, round trips."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainer.config import (
    SCENARIO_PRESETS,
    SCENARIOS,
    ConfigError,
    TrainerConfig,
    build_config,
    config_fields,
    field_keys,
    parse_assignment,
    split_sizes,
    validate_overrides,
)

# The keys INTERFACES.md fixes (fix patches and the app's form use exactly these names).
INTERFACE_KEYS = [
    "seed",
    "device",
    "data.rows",
    "data.dataset",
    "data.shards",
    "data.num_workers",
    "data.pin_memory",
    "data.non_blocking",
    "data.prefetch_factor",
    "data.persistent_workers",
    "data.tokenize_on_the_fly",
    "data.sample_latency_ms",
    "data.max_length",
    "data.vocab_size",
    "model.hidden_size",
    "model.layers",
    "model.heads",
    "model.intermediate_size",
    "train.steps",
    "train.batch_size",
    "train.lr",
    "train.weight_decay",
    "train.grad_clip",
    "train.amp",
    "train.grad_scaler",
    "train.pretrain_steps",
    "train.checkpoint_every",
    "train.max_runtime_s",
    "train.accumulate_loss_as_tensor",
    "train.keep_batch_history",
    "profiler.enabled",
    "profiler.wait",
    "profiler.warmup",
    "profiler.active",
    "profiler.repeat",
    "profiler.record_shapes",
    "profiler.profile_memory",
    "instruments.enabled",
    "instruments.sample_hz",
    "instruments.memory_lines",
    "runtime.threads",
]


def test_every_interface_key_is_a_field():
    assert set(INTERFACE_KEYS) <= set(field_keys())


def test_scenarios_are_presets_of_ordinary_fields():
    assert set(SCENARIOS) == {
        "healthy",
        "slow-loader",
        "no-pin-memory",
        "unstable",
        "leak",
        "small-batch",
        "fp32",
        "per-sample-lookups",
        "unpruned-vocab",
    }
    for name, preset in SCENARIO_PRESETS.items():
        assert set(preset) <= set(field_keys()), name
        config = build_config(name)
        for key, value in preset.items():
            assert config.to_flat()[key] == value


def test_set_overrides_a_preset_one_field_at_a_time():
    config = build_config("slow-loader", [("data.num_workers", "2")])
    assert config.data.num_workers == 2
    # the rest of the preset stays
    assert config.data.tokenize_on_the_fly is True
    assert config.data.sample_latency_ms == 2.0


@pytest.mark.parametrize(
    ("key", "text", "expected"),
    [
        ("data.num_workers", "3", 3),
        ("train.lr", "1e-3", 1e-3),
        ("data.pin_memory", "false", False),
        ("data.pin_memory", "On", True),
        ("train.grad_clip", "null", None),
        ("train.grad_clip", "0.5", 0.5),
        ("train.max_runtime_s", "none", None),
        ("train.amp", "fp16", "fp16"),
        ("runtime.threads", "null", None),
        ("data.sample_latency_ms", "2", 2.0),
    ],
)
def test_set_strings_are_coerced_to_the_field_type(key, text, expected):
    value = build_config("healthy", {key: text}).to_flat()[key]
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("data.num_workers", "two", "data.num_workers: 'two' is not an integer; allowed: integer"),
        ("data.num_workers", "-1", "data.num_workers: '-1' is out of range; allowed: integer"),
        (
            "train.amp",
            "fp8",
            "train.amp: 'fp8' is not one of the choices; allowed: off, bf16, fp16",
        ),
        ("data.pin_memory", "maybe", "data.pin_memory: 'maybe' is not a boolean; allowed: true"),
        ("train.lr", "0", "train.lr: '0' is out of range; allowed: number > 0"),
        ("train.lr", "nan", "train.lr: 'nan' is not a finite number"),
        ("train.steps", "null", "train.steps: a value is required"),
        (
            "data.dataset",
            "csv",
            "data.dataset: 'csv' is not one of the choices; allowed: map, sharded",
        ),
        ("num_workers", "2", "num_workers: unknown key; allowed: did you mean data.num_workers?"),
        ("model.heads", "5", "model.heads: 5 does not divide model.hidden_size 192"),
        ("train.batch_size", "3000", "train.batch_size: 3000 is larger than the training split"),
    ],
)
def test_bad_values_name_the_field_and_what_is_allowed(key, value, message):
    with pytest.raises(ConfigError) as caught:
        build_config("healthy", {key: value})
    text = str(caught.value)
    assert text.startswith(message)
    assert "\n" not in text
    assert validate_overrides({key: value}) == {key: text}


def test_validate_overrides_reports_every_bad_field_and_nothing_for_good_ones():
    errors = validate_overrides({"data.num_workers": "x", "train.amp": "fp8", "train.lr": "0.1"})
    assert set(errors) == {"data.num_workers", "train.amp"}
    assert validate_overrides({"train.lr": 0.1, "data.pin_memory": True}) == {}


def test_json_values_from_patches_are_accepted_and_type_checked():
    config = build_config("unstable", {"train.grad_clip": 1.0, "train.lr": 1e-4})
    assert (config.train.grad_clip, config.train.lr) == (1.0, 1e-4)
    with pytest.raises(ConfigError, match="data.num_workers: True is not an integer"):
        build_config("healthy", {"data.num_workers": True})
    # an integral float is an integer (JSON writes 4.0 for 4 in some producers)
    assert build_config("healthy", {"data.num_workers": 4.0}).data.num_workers == 4


def test_to_dict_from_dict_round_trip_keeps_every_value():
    config = build_config("leak", {"train.lr": "3e-4", "train.grad_clip": "null"}, steps=7)
    again = TrainerConfig.from_dict(config.to_dict())
    assert again == config
    assert again.scenario == "leak"
    # the manifest is nested: sections of dotted keys
    assert config.to_dict()["train"]["steps"] == 7
    # dotted input works too
    assert TrainerConfig.from_dict({"scenario": "healthy", **config.to_flat()}) == build_config(
        "healthy", {k: v for k, v in config.to_flat().items()}
    )


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="^train.speed: unknown key"):
        TrainerConfig.from_dict({"scenario": "healthy", "train": {"speed": 3}})


def test_parse_assignment():
    assert parse_assignment("train.lr=1e-3") == ("train.lr", "1e-3")
    assert parse_assignment("train.grad_clip=") == ("train.grad_clip", "")
    with pytest.raises(ConfigError, match="^--set: 'train.lr' is not key=value"):
        parse_assignment("train.lr")


def test_config_fields_describe_every_key_for_the_form():
    fields = {f.key: f for f in config_fields()}
    assert list(fields) == field_keys()
    assert fields["train.amp"].choices == ("off", "bf16", "fp16")
    assert fields["train.grad_clip"].type == "float or null"
    assert fields["data.num_workers"].default == 1
    assert fields["data.num_workers"].allowed == "integer from 0 to 64"
    assert all(f.help for f in fields.values())


def test_split_sizes():
    # a tenth validates, at least 32 and at most 512 rows
    assert split_sizes(3000) == (3000 - 300, 300)
    assert split_sizes(100) == (100 - 32, 32)
    assert split_sizes(10_000) == (10_000 - 512, 512)


def test_config_and_launch_import_no_torch(repo_root):
    code = "import sys, trainer.config, trainer.launch; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=repo_root)
