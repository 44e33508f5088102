"""The Lightning callback (probe/integrations/lightning.py) under ``pipeline-doctor profile``.

One run of tests/scripts/lightning_accumulate.py, which passes the callback itself, serves
the run-level assertions: 56 samples in batches of 4 are 14 batches an epoch; with
``accumulate_grad_batches=3`` Lightning steps after batches 3, 6, 9, 12 and 14 (an epoch's
end forces the step), so 5 optimizer steps an epoch, the last over 2 batches. The script
prints each batch's loss and each step's gradient norm as it computes them: those are the
expected figures. ``--strategy ddp`` (one CPU process) makes Lightning re-create the
training DataLoader with a DistributedSampler; the override must survive that.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from diagnostics.runs import DATALOADERS_FILE, RunFolder
from tests.conftest import REPO_ROOT
from tests.probe.helpers import SCRIPTS, child_env, line_of, profile, run_folder

SCRIPT = SCRIPTS / "lightning_accumulate.py"
EPOCHS, SAMPLES, BATCH, ACCUMULATE = 2, 56, 4, 3
BATCHES_AN_EPOCH = SAMPLES // BATCH  # 14
# batches in each optimizer step of one epoch: 3, 3, 3, 3, 2
WINDOWS = [min(ACCUMULATE, BATCHES_AN_EPOCH - start) for start in range(0, BATCHES_AN_EPOCH, 3)]
EXPECTED_STEPS = EPOCHS * len(WINDOWS)  # 10
VAL_BATCH = 8


@pytest.fixture(scope="module")
def accumulating_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("lightning") / "runs"
    args = ["--epochs", str(EPOCHS), "--samples", str(SAMPLES), "--batch-size", str(BATCH)]
    args += ["--accumulate", str(ACCUMULATE), "--strategy", "ddp"]
    result = profile(runs, "--override", "dataloader.num_workers=1", str(SCRIPT), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, RunFolder(run_folder(result))


def _printed(stdout: str, what: str) -> list[float]:
    return [float(v) for v in re.findall(rf"^{what} (\S+)$", stdout, re.MULTILINE)]


@pytest.mark.slow
def test_a_step_is_one_optimizer_step_over_its_accumulated_batches(accumulating_run):
    _, run = accumulating_run
    assert (run.status().status, run.status().step) == ("completed", EXPECTED_STEPS)
    steps = run.steps()
    assert steps["step"].to_list() == list(range(1, EXPECTED_STEPS + 1))
    # the samples of each step's batches; validation batches (of 8) are in none
    assert steps["batch_size"].to_list() == [w * BATCH for w in WINDOWS] * EPOCHS
    probe = run.manifest().extra["probe"]
    assert probe["steps_counted_by"] == "explicit"
    # the global optimizer hooks saw the same steps, and did not end any of their own
    assert probe["optimizers"] == [{"class": "SGD", "steps": EXPECTED_STEPS, "thread": "training"}]


@pytest.mark.slow
def test_the_loss_is_the_training_steps_mean_not_lightnings_divided_one(accumulating_run):
    result, run = accumulating_run
    printed = _printed(result.stdout, "batch loss")
    assert len(printed) == EPOCHS * BATCHES_AN_EPOCH
    expected, start = [], 0
    for window in WINDOWS * EPOCHS:
        expected.append(sum(printed[start : start + window]) / window)
        start += window
    assert run.steps()["loss"].to_list() == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_the_gradient_norm_is_the_one_before_clipping(accumulating_run):
    result, run = accumulating_run
    printed = _printed(result.stdout, "step grad_norm")
    assert len(printed) == EXPECTED_STEPS
    assert run.steps()["grad_norm"].to_list() == pytest.approx(printed, rel=1e-5)
    assert max(printed) > 0.5  # the script clips at 0.5: these are the norms before


@pytest.mark.slow
def test_the_scripts_own_callback_is_the_only_one(accumulating_run):
    _, run = accumulating_run
    assert run.manifest().extra["lightning"] == {
        "package": "pytorch_lightning",
        "callbacks": 1,
        "attached": "by the script",
    }


@pytest.mark.slow
def test_loaders_lightning_recreates_keep_the_users_line_and_the_override(accumulating_run):
    _, run = accumulating_run
    train_line = line_of(SCRIPT, "loader = DataLoader(")
    val_line = line_of(SCRIPT, "return DataLoader(")  # inside LightningModule.val_dataloader
    loaders = run.dataloaders()
    # built by the script: train, then val (in Lightning's hook); then Lightning re-creates
    # both with a DistributedSampler: the val loader, then the train loader
    assert [(r.site, r.batch_size) for r in loaders] == [
        (f"lightning_accumulate.py:{train_line}", BATCH),
        (f"lightning_accumulate.py:{val_line}", VAL_BATCH),
        (f"lightning_accumulate.py:{val_line}", VAL_BATCH),
        (f"lightning_accumulate.py:{train_line}", BATCH),
    ]
    assert all(r.num_workers == 1 and r.overridden == {"num_workers": 0} for r in loaders)
    raw = [json.loads(line) for line in (run.path / DATALOADERS_FILE).read_text().splitlines()]
    assert [r.get("rebuilt_from") for r in raw[-4:]] == [None, None, 1, 0]
    # built_by: the framework whose code called DataLoader(...): Lightning's wrapper of
    # DataLoader.__init__ around the val_dataloader() hook; a re-created loader keeps its
    # original's (the train loader is the script's own call)
    assert [r.built_by for r in loaders] == [None, "lightning", "lightning", None]
    # the batches came from the re-created loaders: all training batches from the last
    trained = loaders[3]
    assert (loaders[0].batches, trained.batches) == (0, EPOCHS * BATCHES_AN_EPOCH)
    assert loaders[3].code.startswith("loader = DataLoader(")


@pytest.mark.slow
def test_validation_waits_are_not_counted_in_training_steps(accumulating_run):
    _, run = accumulating_run
    trained = run.dataloaders()[3]
    waits = run.steps()["data_wait_ms"].to_list()
    assert all(w is not None and w > 0 for w in waits)
    # every step's wait is the training loader's; the validation loader waited too (5 batches:
    # 1 sanity + 2 an epoch) but in no step
    assert sum(waits) == pytest.approx(trained.wait_ms, rel=1e-6)
    assert run.dataloaders()[2].batches == 1 + EPOCHS * 2 and run.dataloaders()[2].wait_ms > 0


def test_the_integration_imports_without_importing_lightning():
    code = (
        "import sys; import probe.child, probe.integrations.lightning as m; "
        "print(sorted(n for n in sys.modules if 'lightning' in n and not n.startswith('probe')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_the_callback_does_nothing_outside_a_profiled_run():
    import torch

    from probe import session as sessions
    from probe.integrations.lightning import _StepsFromLightning  # its hooks, no Lightning

    assert sessions.active() is None
    callback = _StepsFromLightning()

    class Trainer:
        callbacks = [callback]
        accumulate_grad_batches = 1

    class Module:
        automatic_optimization = True

    callback.setup(Trainer(), Module(), "fit")
    callback.on_train_batch_start(Trainer(), Module(), None, 0)
    callback.on_train_batch_end(Trainer(), Module(), {"loss": torch.tensor(math.pi)}, None, 0)
    assert callback._losses == []  # nothing kept: there is no session to give it to


def test_a_script_that_exits_on_ctrl_c_was_cancelled_not_failed():
    from probe.child import _exit_outcome

    # what Lightning's Trainer does on KeyboardInterrupt: a graceful shutdown, sys.exit(1)
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            sys.exit(1)
    except SystemExit as exc:
        assert _exit_outcome(exc) == ("cancelled", "interrupted (SIGINT)", 1)
    assert _exit_outcome(SystemExit(1)) == ("failed", "exit code 1", 1)


def test_a_trainer_of_the_unified_package_gets_the_callback_once(tmp_path, monkeypatch):
    """``lightning.pytorch`` does not install here: a stand-in package of that name, with a
    Trainer that keeps its ``callbacks`` as Lightning's does, is imported after the finder."""
    from probe import session as sessions
    from probe.integrations import Integrations
    from probe.integrations import lightning as integration

    package = tmp_path / "lightning" / "pytorch"
    package.mkdir(parents=True)
    (tmp_path / "lightning" / "__init__.py").write_text("")
    (package / "__init__.py").write_text(
        "class Callback:\n    pass\n\n\n"
        "class Trainer:\n"
        "    def __init__(self, callbacks=None):\n"
        "        self.callbacks = list(callbacks or [])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(integration, "_CLASSES", {})
    monkeypatch.setattr(sessions, "_ACTIVE", object())  # a profiled run is going on
    notes: list[str] = []
    integrations = Integrations(notes.append)
    integrations.install()
    try:
        import lightning.pytorch as unified

        (attached,) = unified.Trainer().callbacks
        assert isinstance(attached, unified.Callback) and attached.package == "lightning.pytorch"
        assert attached.automatic
        own = integration.callback_class("lightning.pytorch")()
        assert unified.Trainer(callbacks=[own]).callbacks == [own]  # the script's, alone
    finally:
        integrations.uninstall()
        for name in ("lightning.pytorch", "lightning"):
            sys.modules.pop(name, None)
    assert notes == []
    assert not getattr(unified.Trainer.__init__, "_probe_attaches", False)  # undone
