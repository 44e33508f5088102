"""The config reference, generated from the trainer's config fields.

Every row comes from a field's ``_spec`` metadata (``trainer.config.config_fields()``: key,
type, default, allowed values, help); the preset tables come from ``SIZE_PRESETS``,
``SCENARIO_PRESETS`` and ``DISTRIBUTED_PRESETS``. ``docs/CONFIG.md`` is this module's output,
checked by a test to stay in sync, so a new field or a changed default cannot go undocumented.

Regenerate it with ``python -m trainer.config_docs -o docs/CONFIG.md``. Imports no torch.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from diagnostics.text_output import emit_or_exit_code
from trainer.config import (
    DISTRIBUTED_PRESETS,
    DISTRIBUTED_SCENARIOS,
    SCENARIO_PRESETS,
    SCENARIOS,
    SIZE_PRESETS,
    FieldInfo,
    config_fields,
)

# What a field's one-line help (shown by --help and the app's form) has no room for. Keyed by
# config key; a test fails when a key here is not a config field.
NOTES: dict[str, str] = {
    "data.dataset": "`sharded` is an IterableDataset whose shards are split across workers "
    "without dropping the remainder.",
    "data.vocab_size": "WordPiece training stops at what the corpus supports: ~350–440 tokens "
    "here.",
    "data.prune_vocab": "Keeps `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]` (and `[MASK]` with masked-LM "
    "pretraining). On in every scenario but `unpruned-vocab`, whose finding, "
    "`unused-embedding-rows`, it fixes (~350–440 → ~110–160 rows).",
    "model.pad_vocab_to_multiple_of": "64 is the fix the `misshapen-matmul` rule applies when "
    "the vocabulary is the misaligned GEMM dimension (NVIDIA's Tensor Core guide: multiples of "
    "64 in 16-bit for the best efficiency); with `data.prune_vocab` the pruned size is "
    "padded. The padding rows are recorded as `vocab_usage.padding_rows`, not as unused rows.",
    "model.size": "Resolved at run start and recorded in `run.json` "
    "([size presets](#size-presets), [why these sizes](TRAINER.md#size-presets)); any key it "
    "sets that you set yourself wins.",
    "train.amp": "Applies on CUDA only; a CPU run computes in fp32 and its notes say so.",
    "instruments.enabled": "`--instruments off` sets it to false.",
    "instruments.memory_lines": "`--memory-lines` sets it to true.",
    "instruments.memory_snapshot_steps": "`--memory-snapshots N` sets it. Off by default: "
    "history costs on every allocation while on, not yet measured on this trainer "
    "(`scripts/gpu_check.sh` measures it). A CPU run records none and its notes say "
    '"memory snapshots need CUDA"; an out-of-memory error writes '
    "`memory/oom_step_N.pickle` on CUDA even at 0 (then without stacks) "
    "([MEMORY.md](MEMORY.md#recording)).",
    "runtime.threads": "On CPU the trainer uses `max(1, cores − data.num_workers)` threads "
    "([why](TRAINER.md#the-cli)).",
    "runtime.alert_after_s": 'A Slack-compatible `{"text": ...}` naming the run, its step, '
    "elapsed time, ETA and host, from a background thread with a 5 s timeout: it never fails "
    "or slows the training (a post still in flight when the run ends delays its exit by at "
    "most the 5 s). Counted from the trainer process's start (imports and corpus included, "
    "which `train.max_runtime_s` leaves out; a resumed run from its own restart); one "
    "alert a run, resumes included. The outcome (sent, failed and why, not configured) is in "
    "the run folder's `alert.json` and on the run's page ([RUN-FOLDER.md](RUN-FOLDER.md)).",
    "distributed.sync": "Under torchrun only: a single process ignores the `distributed.*` "
    "keys. `overlap` = DDP's bucketed all-reduce during backward; "
    "`after-backward` = no DDP, one blocking all-reduce per gradient after backward.",
    "distributed.straggler_rank": "Its `__getitem__` is slowed by "
    "`distributed.straggler_delay_ms` per batch.",
}


def _value(value: Any) -> str:
    """A value as `--set` takes it: strings bare, the rest as JSON (true, null, 0.001)."""
    return value if isinstance(value, str) else json.dumps(value)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _field_row(info: FieldInfo) -> str:
    # a bare __getitem__ would render as bold "getitem"
    help_text = info.help.replace("__", "\\_\\_")
    return (
        f"| `{info.key}` | {info.type} | `{_value(info.default)}` | {_cell(info.allowed)} "
        f"| {_cell(help_text)} |"
    )


def render_markdown(fields: Sequence[FieldInfo] | None = None) -> str:
    fields = config_fields() if fields is None else fields
    sizes = list(dict.fromkeys(key for preset in SIZE_PRESETS.values() for key in preset))
    out = [
        "# Config reference",
        "",
        "Generated from the trainer's config fields by `python -m trainer.config_docs` "
        "(`trainer/config_docs.py`); do not edit by hand.",
        "",
        "Set a key with `python -m trainer run --set key=value` (repeatable); fix patches "
        "(`--patch-json`), the app's Launch form and `trainer.launch.config_fields()` use the "
        "same names, and `python -m trainer run --help` prints them with their allowed values. "
        "Values are converted to the field's type (`true/false/on/off`, `null` for optional "
        "fields, numbers range-checked); a bad one is one line, "
        "`error: <key>: <what>; allowed: ...`, and no run folder is created.",
        "",
        "Order of settings: defaults → size preset (`model.size`) → scenario preset → each "
        "`--set` in order → `--patch-json` → `--steps`, `--device`, `--instruments`, "
        "`--memory-lines`, `--memory-snapshots`.",
        "",
        "## Keys",
        "",
        "Defaults are the `cpu` size's; the `gpu` size changes the keys in "
        "[Size presets](#size-presets).",
        "",
        "| key | type | default | allowed | what |",
        "|---|---|---|---|---|",
    ]
    out += [_field_row(info) for info in fields]
    known = {info.key for info in fields}
    notes = [(key, text) for key, text in NOTES.items() if key in known]
    if notes:
        out += ["", "### Notes", ""]
        out += [f"- `{key}`: {text}" for key, text in notes]
    out += [
        "",
        "## Size presets",
        "",
        "`model.size=auto` is `gpu` on CUDA and `cpu` on CPU.",
        "",
        "| key | " + " | ".join(f"`{name}`" for name in SIZE_PRESETS) + " |",
        "|---|" + "---:|" * len(SIZE_PRESETS),
    ]
    out += [
        f"| `{key}` | "
        + " | ".join(_value(preset.get(key)) for preset in SIZE_PRESETS.values())
        + " |"
        for key in sizes
    ]
    out += [
        "",
        "## Scenario presets",
        "",
        "A scenario is nothing but these keys on top of the defaults and the size preset "
        "(`--scenario NAME`); the last two need two or more ranks (`--nproc-per-node 2`).",
        "",
        "| scenario | keys | what |",
        "|---|---|---|",
    ]
    presets = {**SCENARIO_PRESETS, **DISTRIBUTED_PRESETS}
    described = {**SCENARIOS, **DISTRIBUTED_SCENARIOS}
    for name, preset in presets.items():
        keys = ", ".join(f"`{key}={_value(value)}`" for key, value in preset.items()) or "—"
        out.append(f"| `{name}` | {_cell(keys)} | {_cell(described.get(name, ''))} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.config_docs", description="Print the config reference."
    )
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")
    args = parser.parse_args(argv)
    return emit_or_exit_code(render_markdown(), args.output)


if __name__ == "__main__":
    raise SystemExit(main())
