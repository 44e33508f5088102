"""Thresholds: documented defaults with sources, overridable from one TOML/JSON file or dict."""

from __future__ import annotations

import dataclasses

import pytest

from diagnostics.rules import examples as ex
from diagnostics.rules.engine import run_rules
from diagnostics.rules.registry import RULES
from diagnostics.thresholds import Thresholds, ThresholdsError, load_thresholds


def test_every_threshold_says_what_it_means_and_where_its_default_comes_from():
    for name, default, doc, source in Thresholds.field_docs():
        assert default is not None, name
        assert len(doc) > 20, f"{name}: doc too short"
        assert len(source) > 10, f"{name}: source too short"


def test_every_threshold_is_read_by_some_rule_and_rules_name_only_real_ones():
    names = {f.name for f in dataclasses.fields(Thresholds)}
    used = {name for rule in RULES for name in rule.threshold_names}
    assert used <= names, used - names
    assert names <= used, f"thresholds no rule reads: {names - used}"


def test_anchored_defaults_match_their_cited_sources():
    t = Thresholds()
    assert t.gpu_util_low_pct == 50.0  # torch-tb-profiler: larger batch below 50%
    assert t.gpu_util_p95_low_pct == 70.0  # SageMaker LowGPUUtilization p95 < 70%
    assert t.dataloader_share_min_pct == 5.0  # torch-tb-profiler: DataLoader > 5% of step
    assert t.grad_spike_z == 2.5 and t.grad_warmup_steps == 25  # ZClip
    assert t.memory_capacity_high_pct == 90.0  # torch-tb-profiler: peak > 90% of device
    assert t.step_outlier_sigma == 3.0  # SageMaker StepOutlier
    assert t.launch_delay_outlier_us == 100.0  # HTA launch-delay outliers


def test_toml_file_overrides_named_fields_only(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text("[thresholds]\ndataloader_share_min_pct = 12.5\ngrad_warmup_steps = 10\n")
    t = load_thresholds(path)
    assert t.dataloader_share_min_pct == 12.5
    assert t.grad_warmup_steps == 10 and isinstance(t.grad_warmup_steps, int)
    assert t.gpu_util_low_pct == Thresholds().gpu_util_low_pct


def test_json_file_and_mapping_override(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"memory_capacity_high_pct": 80}')
    assert load_thresholds(path).memory_capacity_high_pct == 80.0
    assert load_thresholds({"sync_share_min_pct": 1}).sync_share_min_pct == 1.0
    assert load_thresholds(None) == Thresholds()


def test_a_file_from_an_earlier_version_with_a_retired_threshold_still_loads(tmp_path):
    """step_outlier_cpu_wait_share tuned what the rule now measures (each step's own time):
    a thresholds file that set it is valid input, read with the rest of its values."""
    path = tmp_path / "t.json"
    path.write_text('{"step_outlier_cpu_wait_share": 0.3, "step_outlier_sigma": 4}')
    loaded = load_thresholds(path)
    assert loaded == dataclasses.replace(Thresholds(), step_outlier_sigma=4.0)
    assert not hasattr(loaded, "step_outlier_cpu_wait_share")


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ('{"dataloader_share_pct": 3}', ".json", "unknown threshold 'dataloader_share_pct'"),
        ('{"grad_spike_z": "high"}', ".json", "'grad_spike_z' must be a number"),
        ('{"grad_warmup_steps": 2.5}', ".json", "'grad_warmup_steps' must be an integer"),
        ('{"grad_spike_z": -1}', ".json", "must not be negative"),
        ('{"grad_spike_z": true}', ".json", "must be a number"),
        # a loss median over no steps: unstable-gradients crashed on it (numpy min of [])
        ('{"loss_window_steps": 0}', ".json", "'loss_window_steps' must be at least 1"),
        ("grad_spike_z = nan", ".toml", "'grad_spike_z' must be a finite number"),
        ("grad_spike_z = inf", ".toml", "'grad_spike_z' must be a finite number"),
        ("[1, 2]", ".json", "top level must be a table"),
        ("not = [valid", ".toml", "not valid toml"),
        ("{}", ".yaml", "must be a .toml or .json file"),
    ],
)
def test_bad_config_is_one_line_naming_the_file(tmp_path, text, suffix, message):
    path = tmp_path / f"t{suffix}"
    path.write_text(text)
    with pytest.raises(ThresholdsError) as info:
        load_thresholds(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ThresholdsError, match="cannot read"):
        load_thresholds(tmp_path / "absent.toml")


def test_engine_applies_overrides():
    # 40 of 50 ms waiting (80%) fires at the default 5%, and not with the bar at 90%
    inputs = ex.inputs(
        run=ex.run(
            ex.series(20, step_time_ms=50.0, data_wait_ms=40.0),
            config={"data.num_workers": 0},
            environment=ex.CPU_ENV,
        )
    )
    fired = {f.rule for f in run_rules(inputs).findings}
    assert "too-few-workers" in fired
    fired = {f.rule for f in run_rules(inputs, {"dataloader_share_min_pct": 90}).findings}
    assert "too-few-workers" not in fired
