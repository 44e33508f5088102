"""Trainer configs as the pages show and build them: config tables, patches, re-run
overrides and the launch form's layout and values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from diagnostics.dotted import flatten_dotted
from diagnostics.report.sections import is_script_patch, rerun_command, script_rows
from diagnostics.runs import TRACE_DIR, default_runs_dir


def rerun_overrides(
    config: Mapping[str, Any], patch: Mapping[str, Any], known_keys: Iterable[str]
) -> dict[str, Any]:
    """The overrides that rebuild a run's config exactly, with the patch applied on top.

    Every known key of the stored config is passed (not just the preset's differences) so
    the re-run keeps what the first run had even if a scenario preset changed since.
    """
    known = set(known_keys)
    flat = {k: v for k, v in flatten_dotted(config).items() if k in known}
    flat.update(patch)
    return flat


def patch_rows(patch: Mapping[str, Any], before: Mapping[str, Any] | None = None) -> pl.DataFrame:
    """A config patch as a table: setting, from, to."""
    before_flat = flatten_dotted(before)
    return pl.DataFrame(
        {
            "setting": list(patch.keys()),
            "from": [_config_text(before_flat.get(k, "—")) for k in patch],
            "to": [_config_text(v) for v in patch.values()],
        },
        schema={"setting": pl.String, "from": pl.String, "to": pl.String},
    )


def _config_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def script_table(manifest: Any) -> pl.DataFrame:
    """A script run's script, arguments, sha256 and command line as measure/value rows
    (empty for a trainer run)."""
    rows = script_rows(manifest)
    return pl.DataFrame(
        {"measure": [r[0] for r in rows], "value": [r[1] for r in rows]},
        schema={"measure": pl.String, "value": pl.String},
    )


def config_table(config: Mapping[str, Any]) -> pl.DataFrame:
    """A stored config as setting/value rows (the scenario first)."""
    flat = flatten_dotted(config)
    keys = sorted(flat, key=lambda k: (k != "scenario", k))
    return pl.DataFrame(
        {"setting": keys, "value": [_config_text(flat[k]) for k in keys]},
        schema={"setting": pl.String, "value": pl.String},
    )


def patch_summary(patch: Mapping[str, Any] | None) -> str:
    """'data.num_workers = 4, data.pin_memory = true' for captions and links."""
    if not patch:
        return "no changes"
    return ", ".join(f"{k} = {_config_text(v)}" for k, v in patch.items())


def resolve_runs_dir(environ: Mapping[str, str]) -> Path:
    """The runs directory the app reads and launches into (the trainer's own rule)."""
    return default_runs_dir(environ)


def patch_command(
    patch: Mapping[str, Any],
    config: Mapping[str, Any] | None = None,
    evidence: Mapping[str, Any] | None = None,
) -> str:
    """The command that re-runs with a patch: the trainer's with ``--set``, or for a script
    run's ``dataloader.*`` patch ``pipeline-doctor profile --override`` (the rule's own
    command from ``evidence``, naming the script, when it gave one)."""
    if is_script_patch(patch):
        return rerun_command(patch, evidence or {}) or ""
    scenario = (config or {}).get("scenario")
    head = "python -m trainer run" + (f" --scenario {scenario}" if scenario else "")
    return " ".join([head, *(f"--set {k}={_config_text(v)}" for k, v in patch.items())])


def tensorboard_command(run_path: str | Path) -> str:
    return f"tensorboard --logdir {Path(run_path) / TRACE_DIR}"


@dataclass(frozen=True)
class FormField:
    key: str  # the trainer's dotted config key
    label: str
    widget: str  # "int", "float", "bool", "choice", "off_at_zero" (float; 0 = off, null)
    help: str = ""


# Sections of the launch form, in order. Numbers are free-form (no widget bounds) so the
# trainer's own validation judges them and its message shows next to the field.
LAUNCH_FORM: tuple[tuple[str, tuple[FormField, ...]], ...] = (
    (
        "Run",
        (
            FormField("device", "Device", "choice", "auto = CUDA when present, else CPU"),
            FormField("train.steps", "Fine-tuning steps", "int"),
            FormField("train.batch_size", "Batch size", "int"),
            FormField("train.pretrain_steps", "Masked-LM steps first (0 = none)", "int"),
        ),
    ),
    (
        "Data loading",
        (
            FormField("data.num_workers", "DataLoader workers", "int"),
            FormField("data.pin_memory", "Pinned host memory (pin_memory)", "bool"),
            FormField(
                "data.sample_latency_ms", "Simulated storage latency per sample (ms)", "float"
            ),
        ),
    ),
    (
        "Precision and stability",
        (
            FormField("train.amp", "Mixed precision (AMP)", "choice"),
            FormField("train.grad_clip", "Gradient clipping, max norm (0 = off)", "off_at_zero"),
            FormField("train.lr", "Learning rate", "float"),
        ),
    ),
    (
        "Profiler schedule",
        (
            FormField("profiler.enabled", "Record a trace", "bool"),
            FormField("profiler.wait", "Wait steps", "int"),
            FormField("profiler.warmup", "Warm-up steps", "int"),
            FormField("profiler.active", "Active (recorded) steps", "int"),
            FormField("profiler.repeat", "Cycles (0 = until the end)", "int"),
        ),
    ),
    (
        "Too-long-run alert",
        (
            FormField(
                "runtime.alert_after_s",
                "Alert when the run passes (seconds, 0 = off)",
                "off_at_zero",
                "posts once to the webhook in $PIPELINE_DOCTOR_ALERT_WEBHOOK (Slack-compatible) "
                "with the run, its step, elapsed time and ETA; never stops the run",
            ),
        ),
    ),
)


# The size preset is chosen next to the scenario, outside the form: the form's fields start
# at the chosen size's values (trainer.config.SIZE_PRESETS), and only fields the user
# changes are sent, so "auto" can still become the gpu preset when the run finds CUDA.
SIZE_FIELD = FormField(
    "model.size",
    "Model size",
    "choice",
    "auto = the gpu preset on CUDA, the cpu preset on CPU (decided when the run starts). "
    "cpu: hidden 192, 2 layers, batch 32, 32 tokens, 1 worker. gpu: hidden 768, 6 layers, "
    "12 heads, batch 256, 128 tokens, 4 workers (82.7 % GPU busy on an H200). "
    "A field changed below overrides the preset",
)


def form_value(form_field: FormField, preset_value: Any) -> Any:
    """What a widget starts at for a scenario's preset value."""
    if form_field.widget == "off_at_zero":
        return 0.0 if preset_value is None else float(preset_value)
    if form_field.widget == "float":
        return float(preset_value)
    return preset_value


def form_overrides(
    values: Mapping[str, Any], preset: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Widget values -> trainer overrides (0 in an off-at-zero field, such as clipping or
    the alert, is null: off).

    With ``preset`` (the values the form started at), only the fields the user changed are
    overrides, and ``device`` always: an unchanged field must not pin a value that the size
    preset, resolved when the run starts, would choose differently.
    """
    fields = {f.key: f for _, section in LAUNCH_FORM for f in section}
    off_at_zero = {key for key, f in fields.items() if f.widget == "off_at_zero"}
    overrides = {
        key: (None if key in off_at_zero and value == 0 else value) for key, value in values.items()
    }
    if preset is None:
        return overrides
    return {
        key: value
        for key, value in overrides.items()
        if key == "device"
        or key not in fields
        or key not in preset
        or values[key] != form_value(fields[key], preset[key])
    }


def form_error_summary(errors: Mapping[str, str]) -> tuple[list[str], str | None]:
    """(messages for no single form field, the count line for the fields' own messages)."""
    form_keys = {form_field.key for _, section in LAUNCH_FORM for form_field in section}
    others = [message for key, message in errors.items() if key not in form_keys]
    count = sum(key in form_keys for key in errors)
    if not count:
        return others, None
    plural = count > 1
    summary = (
        f"{count} setting{'s' if plural else ''} need{'' if plural else 's'} fixing: "
        "see the messages next to the fields."
    )
    return others, summary
