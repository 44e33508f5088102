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

import io
import re
import shlex
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Call:
    """A DataLoader call found in source by its tokens: offsets into the source."""

    close: int  # its closing parenthesis
    last_end: int  # the end of its last argument (or of its opening parenthesis)
    last_is_comma: bool  # a trailing comma ends the arguments
    multiline: bool
    first_argument_line: str | None  # the line of its first argument, when on its own line
    keywords: dict[str, tuple[int, int]]  # name -> span of ``name=value``


def _find_call(code: str) -> _Call | None:
    """The first ``DataLoader(...)`` in ``code``, read with ``tokenize``: brackets, strings
    and comments as Python reads them, so a parenthesis in a comment or a string is no
    part of the call. None when ``code`` holds no whole call."""
    starts = [0]
    for line in code.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(position: tuple[int, int]) -> int:
        return starts[position[0] - 1] + position[1]

    try:
        tokens = [
            t
            for t in tokenize.generate_tokens(io.StringIO(code).readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)
        ]
    except (tokenize.TokenError, SyntaxError):  # an unclosed bracket: not the whole call
        return None
    for i, token in enumerate(tokens[:-1]):
        if token.string == "DataLoader" and tokens[i + 1].string == "(":
            break
    else:
        return None
    opening = tokens[i + 1]
    depth, keywords = 0, {}
    previous = opening
    name_start: int | None = None
    name: str | None = None
    for j in range(i + 1, len(tokens)):
        token = tokens[j]
        if token.type == tokenize.OP and token.string in "([{":
            depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            depth -= 1
            if depth == 0:
                if name is not None and name_start is not None:
                    keywords[name] = (name_start, offset(previous.end))
                first = tokens[i + 2] if i + 2 < j else None
                return _Call(
                    close=offset(token.start),
                    last_end=offset(previous.end),
                    last_is_comma=previous.string == ",",
                    multiline=token.start[0] != opening.start[0],
                    first_argument_line=code.splitlines()[first.start[0] - 1]
                    if first is not None and first.start[0] != opening.start[0]
                    else None,
                    keywords=keywords,
                )
        elif depth == 1 and token.string == ",":
            if name is not None and name_start is not None:
                keywords[name] = (name_start, offset(previous.end))
            name = name_start = None
        elif (
            depth == 1
            and token.type == tokenize.NAME
            and previous.string in ("(", ",")
            and j + 1 < len(tokens)
            and tokens[j + 1].string == "="
        ):
            name, name_start = token.string, offset(token.start)
        previous = token
    return None


def rewrite_call(code: str, changes: Mapping[str, Any]) -> str | None:
    """The DataLoader call in ``code`` (its source, one line or several) with ``changes``
    applied: an argument it passes gets the new value, one it does not is added after its
    last argument, in the call's own layout. Comments and strings, even ones holding
    parentheses, stay as written. None when ``code`` is not a whole call."""
    call = _find_call(code)
    if call is None:
        return None
    edits: list[tuple[int, int, str]] = []
    added = []
    for name, value in changes.items():
        span = call.keywords.get(name)
        if span is None:
            added.append(f"{name}={_format(value)}")
        else:
            edits.append((span[0], span[1], f"{name}={_format(value)}"))
    if added:
        if call.multiline:  # one argument a line, as the call is written
            found = re.match(r"[ \t]*", call.first_argument_line or "")
            pad = found.group(0) if found and found.group(0) else "    "
            comma = "" if call.last_is_comma or code[call.last_end - 1] == "(" else ","
            text = comma + "".join(f"\n{pad}{a}," for a in added)
        elif code[call.last_end - 1] == "(":
            text = ", ".join(added)
        else:
            text = (" " if call.last_is_comma else ", ") + ", ".join(added)
        edits.append((call.last_end, call.last_end, text))
    result = code
    for start, end, text in sorted(edits, reverse=True):
        result = result[:start] + text + result[end:]
    return result


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


def _override_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _measured_as(config: Mapping[str, Any]) -> list[str]:
    """The wrapper options the run was measured with, so that its re-run is measured the
    same way (a profiler window or a sampler rate changes step times too)."""
    options: list[str] = []
    if config.get("steps"):
        options += ["--steps", str(config["steps"])]
    nproc, nnodes = int(config.get("nproc_per_node") or 1), int(config.get("nnodes") or 1)
    if nproc > 1:
        options += ["--nproc-per-node", str(nproc)]
    if nnodes > 1:  # node 0's address is not recorded: the user fills it in on each node
        options += ["--nnodes", str(nnodes), "--node-rank", "NODE_RANK"]
        options += ["--rdzv-endpoint", "NODE0_HOST:PORT"]
    if (config.get("profiler") or {}).get("enabled") is False:
        options.append("--no-trace")
    sample_hz = config.get("sample_hz")
    if isinstance(sample_hz, int | float) and sample_hz != 10.0:
        options += ["--sample-hz", f"{sample_hz:g}"]
    snapshots = config.get("memory_snapshots") or {}
    if snapshots.get("steps"):
        options += ["--memory-snapshots", str(snapshots["steps"])]
        if snapshots.get("stacks") not in (None, "python"):
            options += ["--memory-snapshot-stacks", str(snapshots["stacks"])]
    if config.get("alert_after_s"):
        options += ["--alert-after-s", f"{config['alert_after_s']:g}"]
    return options


def rerun_command(run: RunData, changes: Mapping[str, Any]) -> str | None:
    """The command that re-runs this script run with the fix: ``pipeline-doctor profile``
    into the same runs folder, linked to this run (``--parent-run-id``, so Compare pairs
    them), measured as it was, with the run's own overrides and the fix's on top:

    ``pipeline-doctor profile --runs-dir DIR --parent-run-id ID --steps 8
    --override dataloader.num_workers=4 train.py ARGS``"""
    script = run.manifest.extra.get("script") or {}
    path = script.get("as_given") or script.get("path")
    if not isinstance(path, str):
        return None
    config = run.config
    overrides = {**(config.get("dataloader") or {}), **changes}
    command = ["pipeline-doctor", "profile"]
    command += ["--runs-dir", str(run.folder.path.resolve().parent)]
    command += ["--parent-run-id", run.manifest.run_id, *_measured_as(config)]
    for key, value in overrides.items():
        command += ["--override", f"{OVERRIDE_PREFIX}{key}={_override_text(value)}"]
    args = [str(a) for a in script.get("args") or []]
    return shlex.join([*command, path, *args])


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
