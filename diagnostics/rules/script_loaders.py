"""The DataLoader of a profiled script that a finding is about, and fixes written against it.

A script run (``pipeline-doctor profile``) records each DataLoader the script built, with
the line that built it and the arguments it runs with (``RunData.dataloaders``). A finding
about the data pipeline then names that line and those arguments, gives the call rewritten
with the fix, and a ``config_patch`` in the keys ``--override`` takes (``dataloader.*``),
so the script can be re-run with the fix without an edit.

A loader HF's Trainer built (``built_by == "transformers"``) has no call in the user's code
to rewrite: its site is the script's ``trainer.train()`` line, and the user's knobs are
``TrainingArguments``' ``dataloader_*`` fields (``--dataloader_num_workers N`` for a
script that parses them with ``HfArgumentParser``); the fix is written in those.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from diagnostics.runs import DataLoaderRecord
from diagnostics.sources import RunData

OVERRIDE_PREFIX = "dataloader."

HF_TRAINER = "transformers"
# DataLoader argument -> the TrainingArguments field the Trainer passes it from
# (transformers' Trainer._get_dataloader); batch_size is not one: the Trainer's is
# per_device_train_batch_size times the GPUs of a DataParallel run
HF_TRAINING_ARGUMENTS = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
}


def built_by_hf_trainer(record: DataLoaderRecord) -> bool:
    return record.built_by == HF_TRAINER


def _hf_site(record: DataLoaderRecord) -> str:
    """``run_clm.py:612 trains with the HF Trainer, which builds the DataLoader from its
    TrainingArguments``."""
    return (
        f"{record.site or 'the script'} trains with the HF Trainer, which builds the "
        "DataLoader from its TrainingArguments"
    )


def _hf_flag_value(value: Any) -> str:
    # HfArgumentParser reads a bool field's flag as "--name True" / "--name False"
    return str(value)


def hf_fix_code(record: DataLoaderRecord, changes: Mapping[str, Any], why: str) -> str:
    """The TrainingArguments change, and the same as HfArgumentParser flags."""
    fields = [
        (HF_TRAINING_ARGUMENTS[k], v) for k, v in changes.items() if k in HF_TRAINING_ARGUMENTS
    ]
    arguments = ", ".join(f"{name}={_format(value)}" for name, value in fields)
    flags = " ".join(f"--{name} {_hf_flag_value(value)}" for name, value in fields)
    return (
        f"# {_hf_site(record)}: {why}:\n"
        f"training_args = TrainingArguments(..., {arguments})\n\n"
        "# or, for a script that reads them with HfArgumentParser, on its command line:\n"
        f"#   {flags}\n"
    )


def is_script_run(run: RunData | None) -> bool:
    return run is not None and run.kind == "script"


def training_loader(run: RunData | None) -> DataLoaderRecord | None:
    """The loader the training thread waited on longest (the run's end totals), else the
    first one that yielded batches, else the first built; None when the script built none."""
    if run is None or not run.dataloaders:
        return None
    timed = [d for d in run.dataloaders if d.wait_ms is not None and d.batches]
    if timed:
        return max(timed, key=lambda d: d.wait_ms or 0.0)
    return run.dataloaders[0]


def _format(value: Any) -> str:
    return repr(value)


def _argument_span(code: str, name: str) -> tuple[int, int] | None:
    """Where ``name=value`` sits in ``code`` (the value ends at a comma or closing bracket
    at its own depth), or None."""
    match = re.search(rf"\b{re.escape(name)}\s*=", code)
    if match is None:
        return None
    depth, end = 0, match.end()
    while end < len(code):
        char = code[end]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif char == "," and depth == 0:
            break
        end += 1
    return match.start(), end


def rewrite_call(code: str, changes: Mapping[str, Any]) -> str | None:
    """The DataLoader call in ``code`` (its source, one line or several) with ``changes``
    applied: an argument it passes gets the new value, one it does not is added before the
    closing parenthesis, in the call's own layout. None when ``code`` is not a whole call."""
    start = code.find("DataLoader(")
    close = code.rfind(")")
    if start < 0 or close < start or code.count("(") != code.count(")"):
        return None
    result = code
    added = []
    for name, value in changes.items():
        span = _argument_span(result, name)
        if span is None:
            added.append(f"{name}={_format(value)}")
        else:
            result = result[: span[0]] + f"{name}={_format(value)}" + result[span[1] :]
    if not added:
        return result
    close = result.rfind(")")
    head, tail = result[:close].rstrip(), result[close:]
    if "\n" in result[start:close]:  # one argument a line, as the call is written
        found = re.search(r"\n([ \t]*)\S", result[start:])
        pad = found.group(1) if found and found.group(1) else "    "
        head = head if head.endswith((",", "(")) else head + ","
        return head + "".join(f"\n{pad}{a}," for a in added) + "\n" + tail
    joiner = "" if head.endswith("(") else (" " if head.endswith(",") else ", ")
    return head + joiner + ", ".join(added) + tail


def fix_code(record: DataLoaderRecord, changes: Mapping[str, Any], why: str) -> str:
    """Before/after for the line that built the loader, or (a call over several lines)
    the arguments to add to it; for a loader the HF Trainer built, its TrainingArguments."""
    if built_by_hf_trainer(record):
        return hf_fix_code(record, changes, why)
    where = record.site or "the script"
    after = rewrite_call(record.code, changes) if record.code else None
    if after is not None:
        return f"# {where}, as written:\n{record.code}\n\n# {why}:\n{after}\n"
    arguments = ", ".join(f"{k}={_format(v)}" for k, v in changes.items())
    return f"# {where} builds the DataLoader: {why}, pass\n#   {arguments}\n"


def config_patch(changes: Mapping[str, Any]) -> dict[str, Any]:
    """The fix in ``--override`` keys: ``{"dataloader.num_workers": 4}``."""
    return {OVERRIDE_PREFIX + key: value for key, value in changes.items()}


def rerun_command(run: RunData, changes: Mapping[str, Any]) -> str | None:
    """``pipeline-doctor profile --override dataloader.num_workers=4 train.py ARGS``."""
    script = run.manifest.extra.get("script") or {}
    path = script.get("as_given") or script.get("path")
    if not isinstance(path, str):
        return None
    overrides = [
        f"--override {OVERRIDE_PREFIX}{k}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in changes.items()
    ]
    args = [str(a) for a in script.get("args") or []]
    return " ".join(["pipeline-doctor profile", *overrides, shlex.join([path, *args])])


def built_with(record: DataLoaderRecord, names: tuple[str, ...] | None = None) -> str:
    """``train.py:37 builds DataLoader(batch_size=64, num_workers=0, pin_memory=False)``;
    for the HF Trainer's loader, the TrainingArguments it came from."""
    shown = names or ("batch_size", "num_workers", "pin_memory")
    if built_by_hf_trainer(record):
        given = ", ".join(
            f"{HF_TRAINING_ARGUMENTS[n]}={getattr(record, n)!r}"
            for n in shown
            if n in HF_TRAINING_ARGUMENTS
        )
        return f"{_hf_site(record)} ({given})"
    return f"{record.site or 'the script'} builds {record.call_text(shown)}"
