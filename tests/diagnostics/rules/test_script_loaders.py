"""Findings about a script run's DataLoader: its line, its arguments, the call rewritten.

Inputs are built by hand (a DataLoaderRecord as probe/loaders.py writes one); the expected
texts are written out, not produced by the code under test.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from diagnostics.rules import examples as ex
from diagnostics.rules.engine import run_rules
from diagnostics.rules.missing_pin_memory import MissingPinMemory
from diagnostics.rules.script_loaders import rerun_command, rewrite_call, training_loader
from diagnostics.rules.too_few_workers import TooFewWorkers
from diagnostics.rules.worker_restarts import WorkerRestarts
from diagnostics.runs import DataLoaderRecord
from diagnostics.thresholds import Thresholds

CALL = "DataLoader(ds, batch_size=64, num_workers=0, pin_memory=False)"


def _loader(**fields):
    base = {
        "index": 0, "file": "/home/me/train.py", "line": 37, "site": "train.py:37",
        "code": f"loader = {CALL}", "dataset_class": "Tokens", "batch_size": 64,
        "num_workers": 0, "pin_memory": False, "persistent_workers": False,
        "prefetch_factor": None, "batches": 20, "wait_ms": 800.0, "wait_cpu_ms": 780.0,
    }  # fmt: skip
    record = DataLoaderRecord.from_dict({**base, **fields})
    assert record is not None
    return record


def _script(inputs, *loaders):
    run = inputs.run
    manifest = replace(
        run.manifest,
        extra={"kind": "script", "script": {"as_given": "train.py", "args": ["--lr", "1e-3"]}},
    )
    return replace(inputs, run=replace(run, manifest=manifest, dataloaders=loaders))


@pytest.mark.parametrize(
    ("code", "changes", "expected"),
    [
        (
            f"loader = {CALL}",
            {"num_workers": 4, "persistent_workers": True},
            "loader = DataLoader(ds, batch_size=64, num_workers=4, pin_memory=False, "
            "persistent_workers=True)",
        ),
        ("dl = DataLoader(ds)", {"pin_memory": True}, "dl = DataLoader(ds, pin_memory=True)"),
        (
            "dl = DataLoader(ds, num_workers=cfg.get('w', 0), shuffle=True)",
            {"num_workers": 2},
            "dl = DataLoader(ds, num_workers=2, shuffle=True)",
        ),
        (
            "loader = DataLoader(\n    ds,\n    batch_size=8,\n)",
            {"num_workers": 3},
            "loader = DataLoader(\n    ds,\n    batch_size=8,\n    num_workers=3,\n)",
        ),
        ("loader = DataLoader(", {"num_workers": 3}, None),  # not the whole call
        # before: the fix went in at the last ")" of the line, inside the comment
        (
            "dl = DataLoader(ds, batch_size=8)  # see (docs)",
            {"num_workers": 4, "persistent_workers": True},
            "dl = DataLoader(ds, batch_size=8, num_workers=4, persistent_workers=True)"
            "  # see (docs)",
        ),
        (
            'dl = DataLoader(ds, collate_fn=pick(")"), num_workers=0)  # n=0 (slow)',
            {"num_workers": 2},
            'dl = DataLoader(ds, collate_fn=pick(")"), num_workers=2)  # n=0 (slow)',
        ),
        (
            "loader = DataLoader(\n    ds,  # tokens (packed)\n    batch_size=8\n)  # (train)",
            {"pin_memory": True},
            "loader = DataLoader(\n    ds,  # tokens (packed)\n    batch_size=8,\n"
            "    pin_memory=True,\n)  # (train)",
        ),
        (
            "for batch in DataLoader(ds, num_workers=0):",
            {"num_workers": 4},
            "for batch in DataLoader(ds, num_workers=4):",
        ),
        ("dl = DataLoader()", {"num_workers": 1}, "dl = DataLoader(num_workers=1)"),
    ],
)
def test_rewrite_call(code, changes, expected):
    assert rewrite_call(code, changes) == expected


def test_a_record_with_a_field_of_the_wrong_type_is_not_read():
    assert DataLoaderRecord.from_dict({"index": 0, "num_workers": "0"}) is None
    assert DataLoaderRecord.from_dict({"index": True}) is None


def test_the_loader_waited_on_longest_is_the_one_in_question():
    inputs = _script(ex.cpu_run(3), _loader(index=0, wait_ms=5.0), _loader(index=1, wait_ms=90.0))
    assert training_loader(inputs.run).index == 1


def test_too_few_workers_on_a_script_names_the_line_and_patches_in_override_keys():
    # 40 ms of a 50 ms step waiting; 780 of 800 ms of the wait was the thread's own CPU
    inputs = _script(ex.cpu_run(20, step_time_ms=50.0, data_wait_ms=40.0), _loader())
    (finding,) = TooFewWorkers().check(inputs, Thresholds())
    assert finding.recommendation.startswith(
        "train.py:37 builds DataLoader(batch_size=64, num_workers=0, pin_memory=False). "
    )
    workers = finding.evidence["recommended_num_workers"]
    assert finding.fix.config_patch == {"dataloader.num_workers": workers}
    assert finding.fix.code == (
        f"# train.py:37, as written:\nloader = {CALL}\n\n"
        f"# {workers} worker processes load batches meanwhile:\n"
        f"loader = DataLoader(ds, batch_size=64, num_workers={workers}, pin_memory=False, "
        "persistent_workers=True)\n"
    )
    # into the same runs folder, linked to this run, so that Compare pairs them
    assert finding.evidence["rerun_command"] == (
        f"pipeline-doctor profile --runs-dir {Path.cwd()} --parent-run-id example-run "
        f"--override dataloader.num_workers={workers} train.py --lr 1e-3"
    )
    # the engine keeps a patch in override keys for a script run
    outcome = run_rules(inputs)
    (kept,) = [f for f in outcome.findings if f.rule == "too-few-workers"]
    assert kept.fix.config_patch == {"dataloader.num_workers": workers}


def test_an_io_bound_loader_may_get_more_workers_than_the_cores_allow_cpu_bound():
    # 8 cores, one kept for the main process: a CPU-bound load (all 800 ms of the wait the
    # thread's CPU) caps the workers at 7 spare cores; a load that is 95 % sleep (40 of 800
    # ms) lets 7 / 0.05 = 140 sleepers share them, capped at 2 x 8 = 16
    busy = _script(
        ex.cpu_run(20, step_time_ms=100.0, data_wait_ms=96.0), _loader(wait_cpu_ms=800.0)
    )
    idle = _script(ex.cpu_run(20, step_time_ms=100.0, data_wait_ms=96.0), _loader(wait_cpu_ms=40.0))
    (cpu_bound,) = TooFewWorkers().check(busy, Thresholds())
    (io_bound,) = TooFewWorkers().check(idle, Thresholds())
    assert cpu_bound.evidence["worker_cap"] == 7
    assert io_bound.evidence["worker_cap"] == 16  # 2 x 8 cores, SageMaker's ceiling
    assert (
        io_bound.evidence["recommended_num_workers"] > cpu_bound.evidence["recommended_num_workers"]
    )


def test_missing_pin_memory_on_a_cuda_script_names_the_call_and_patches_pin_memory():
    cuda = ex.inputs(
        run=ex.run(ex.series(5, h2d_ms=4.0, step_time_ms=20.0), environment=ex.CUDA_ENV)
    )
    (finding,) = MissingPinMemory().check(_script(cuda, _loader()), Thresholds())
    assert finding.recommendation.startswith("train.py:37 builds DataLoader(batch_size=64, ")
    assert finding.fix.config_patch == {"dataloader.pin_memory": True}
    assert "pin_memory=True" in finding.fix.code and "pin_memory=False" in finding.fix.code
    assert finding.evidence["rerun_command"] == (
        f"pipeline-doctor profile --runs-dir {Path.cwd()} --parent-run-id example-run "
        "--override dataloader.pin_memory=true train.py --lr 1e-3"
    )


def _measured(config):
    inputs = _script(ex.cpu_run(20, config, step_time_ms=50.0, data_wait_ms=40.0), _loader())
    return rerun_command(inputs.run, {"num_workers": 3})


def test_the_rerun_is_measured_as_the_run_was_and_keeps_its_own_overrides():
    config = {
        "steps": 30, "nproc_per_node": 2, "nnodes": 1, "profiler": {"enabled": False},
        "sample_hz": 4.0, "memory_snapshots": {"steps": 2, "stacks": "all"},
        "alert_after_s": 600.0, "dataloader": {"pin_memory": True, "num_workers": 1},
    }  # fmt: skip
    assert _measured(config) == (
        f"pipeline-doctor profile --runs-dir {Path.cwd()} --parent-run-id example-run "
        "--steps 30 --nproc-per-node 2 --no-trace --sample-hz 4 --memory-snapshots 2 "
        "--memory-snapshot-stacks all --alert-after-s 600 "
        "--override dataloader.pin_memory=true --override dataloader.num_workers=3 "
        "train.py --lr 1e-3"
    )


def test_the_rerun_of_a_run_with_the_wrappers_defaults_adds_no_option():
    config = {
        "steps": None, "nproc_per_node": 1, "nnodes": 1, "profiler": {"enabled": True},
        "sample_hz": 10.0, "memory_snapshots": {"steps": 0, "stacks": "python"},
        "alert_after_s": None, "dataloader": {},
    }  # fmt: skip
    assert _measured(config) == (
        f"pipeline-doctor profile --runs-dir {Path.cwd()} --parent-run-id example-run "
        "--override dataloader.num_workers=3 train.py --lr 1e-3"
    )


def test_a_pinned_script_loader_gets_no_pin_memory_finding_from_the_run():
    cuda = ex.inputs(
        run=ex.run(ex.series(5, h2d_ms=4.0, step_time_ms=20.0), environment=ex.CUDA_ENV)
    )
    assert MissingPinMemory().check(_script(cuda, _loader(pin_memory=True)), Thresholds()) == []


def test_worker_restarts_stays_silent_on_a_script_run_and_says_why():
    inputs = _script(ex.cpu_run(20, epoch=0, data_wait_ms=1.0), _loader(num_workers=2))
    assert WorkerRestarts().skip_reason(inputs).startswith("a script run:")


def test_no_rerun_command_without_a_recorded_script():
    inputs = _script(ex.cpu_run(20, step_time_ms=50.0, data_wait_ms=40.0), _loader())
    run = replace(inputs.run, manifest=replace(inputs.run.manifest, extra={"kind": "script"}))
    assert rerun_command(run, {"num_workers": 2}) is None


def test_a_trainer_key_patch_is_dropped_on_a_script_run_and_kept_on_a_trainer_run():
    from diagnostics.rules.base import Finding, Fix, Severity
    from diagnostics.rules.engine import _without_trainer_patch

    finding = Finding("r", Severity.LOW, "t", {}, "x", Fix("code", {"train.grad_clip": 1.0}))
    assert _without_trainer_patch(finding).fix.config_patch is None
    override = replace(finding, fix=Fix("code", {"dataloader.pin_memory": True}))
    assert _without_trainer_patch(override).fix.config_patch == {"dataloader.pin_memory": True}


# HF's Trainer builds its loader in transformers' Trainer._get_dataloader from its
# TrainingArguments; the probe records it at the script's trainer.train() line, as in
# transformers' examples/pytorch/language-modeling/run_clm.py (line 654 of the vendored copy)
HF_CALL = "train_result = trainer.train(resume_from_checkpoint=checkpoint)"


def _hf_loader(**fields):
    hf = {
        "file": "/home/me/run_clm.py", "line": 654, "site": "run_clm.py:654", "code": HF_CALL,
        "dataset_class": "Dataset", "batch_size": None, "pin_memory": True,
        "built_by": "transformers",
    }  # fmt: skip
    return _loader(**{**hf, **fields})


def test_a_record_without_built_by_reads_as_the_scripts_own_call():
    assert _loader().built_by is None  # dataloaders.jsonl written before the field
    assert _hf_loader().built_by == "transformers"


def test_too_few_workers_on_an_hf_trainer_run_fixes_training_arguments_not_transformers():
    inputs = _script(ex.cpu_run(20, step_time_ms=50.0, data_wait_ms=40.0), _hf_loader())
    (finding,) = TooFewWorkers().check(inputs, Thresholds())
    assert finding.recommendation.startswith(
        "run_clm.py:654 trains with the HF Trainer, which builds the DataLoader from its "
        "TrainingArguments (dataloader_num_workers=0, dataloader_pin_memory=True). "
    )
    workers = finding.evidence["recommended_num_workers"]
    assert finding.recommendation.endswith(
        f"Set dataloader_num_workers={workers} with dataloader_persistent_workers=True."
    )
    assert finding.fix.code == (
        "# run_clm.py:654 trains with the HF Trainer, which builds the DataLoader from its "
        f"TrainingArguments: {workers} worker processes load batches meanwhile:\n"
        f"training_args = TrainingArguments(..., dataloader_num_workers={workers}, "
        "dataloader_persistent_workers=True)\n\n"
        "# or, for a script that reads them with HfArgumentParser, on its command line:\n"
        f"#   --dataloader_num_workers {workers} --dataloader_persistent_workers True\n"
    )
    assert "DataLoader(" not in finding.fix.code  # no call of transformers' to rewrite
    # the wrapper's override reaches the Trainer's loader too: the patch and re-run stay
    assert finding.fix.config_patch == {"dataloader.num_workers": workers}
    assert finding.evidence["rerun_command"] == (
        f"pipeline-doctor profile --runs-dir {Path.cwd()} --parent-run-id example-run "
        f"--override dataloader.num_workers={workers} train.py --lr 1e-3"
    )
    assert finding.evidence["dataloader"]["built_by"] == "transformers"


def test_missing_pin_memory_on_an_hf_trainer_run_sets_dataloader_pin_memory():
    cuda = ex.inputs(
        run=ex.run(ex.series(5, h2d_ms=4.0, step_time_ms=20.0), environment=ex.CUDA_ENV)
    )
    loader = _hf_loader(pin_memory=False)
    (finding,) = MissingPinMemory().check(_script(cuda, loader), Thresholds())
    assert finding.recommendation.startswith(
        "run_clm.py:654 trains with the HF Trainer, which builds the DataLoader from its "
        "TrainingArguments (dataloader_num_workers=0, dataloader_pin_memory=False). "
    )
    assert "training_args = TrainingArguments(..., dataloader_pin_memory=True)\n" in (
        finding.fix.code
    )
    assert "#   --dataloader_pin_memory True\n" in finding.fix.code
    assert finding.fix.config_patch == {"dataloader.pin_memory": True}
