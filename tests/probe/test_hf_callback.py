"""PipelineDoctorCallback in a tiny in-process Trainer, no wrapper: what it tells the session.

The session here is a recorder of the calls the callback makes (docs/PROFILE.md names
them); the Trainer is real (transformers 5.24.0, accelerate 1.15.0, CPU). Expected counts
come from the arguments: ``max_steps`` optimizer updates, each of
``gradient_accumulation_steps`` micro-batches.
"""

from __future__ import annotations

import pytest
import torch

# requirements.txt pins transformers: a missing or broken install fails at collection here
# instead of skipping the module
import transformers  # noqa: F401

from probe import session as sessions

MAX_STEPS, ACCUMULATION, BATCH = 3, 2, 2
# transformers' import alone is 10-35 s on this loaded 2-core host
pytestmark = pytest.mark.slow


class RecordingSession:
    """The calls a framework callback makes on probe.session.Session, in order."""

    def __init__(self):
        self.calls: list[str] = []
        self.micro_batch_losses_add_up = False
        self.manifest: dict = {}

    def expect_explicit_steps(self, *, one_fetch_per_step=False):
        self.calls.append(f"explicit_steps(one_fetch_per_step={one_fetch_per_step})")

    def explicit_begin(self):
        self.calls.append("begin")

    def explicit_end(self):
        self.calls.append("end")

    def discard_open_step(self):
        self.calls.append("discard")

    def note(self, text):
        pass

    def update_manifest(self, **fields):
        self.manifest.update(fields)


class TinyRegression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        prediction = self.linear(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(prediction, labels), "logits": prediction}


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        return {"x": torch.full((4,), float(index)), "labels": torch.tensor(float(index))}


@pytest.fixture(scope="module")
def transformers_trainer(tmp_path_factory):
    from transformers import Trainer, TrainingArguments

    output = tmp_path_factory.mktemp("hf-callback")

    def make(arguments=None, **kwargs):
        args = TrainingArguments(
            output_dir=str(output),
            max_steps=MAX_STEPS,
            per_device_train_batch_size=BATCH,
            gradient_accumulation_steps=ACCUMULATION,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
            **(arguments or {}),
        )
        return Trainer(
            model=TinyRegression(), args=args, train_dataset=Rows(), eval_dataset=Rows(), **kwargs
        )

    return make


@pytest.fixture
def recording():
    recorder = RecordingSession()
    sessions.activate(recorder)  # type: ignore[arg-type]
    yield recorder
    sessions.activate(None)


@pytest.fixture
def patched_trainer():
    import transformers.trainer as trainer_module

    from probe.integrations.hf import patch_trainer_module

    original = trainer_module.Trainer.__init__
    undo = patch_trainer_module(trainer_module)
    yield
    undo()
    assert trainer_module.Trainer.__init__ is original


def test_used_directly_it_marks_one_step_per_update_whatever_the_accumulation(
    transformers_trainer, recording
):
    from probe.integrations.hf import PipelineDoctorCallback, attached

    trainer = transformers_trainer(callbacks=[PipelineDoctorCallback()])
    trainer.train()
    assert len(attached(trainer)) == 1
    assert (
        recording.calls
        == ["explicit_steps(one_fetch_per_step=False)"] + ["begin", "end"] * MAX_STEPS
    )
    assert recording.micro_batch_losses_add_up  # HF divides each micro-batch's loss


def test_outside_a_profiled_run_it_does_nothing(transformers_trainer):
    from probe.integrations.hf import PipelineDoctorCallback

    callback = PipelineDoctorCallback()
    transformers_trainer(callbacks=[callback]).train()
    assert (callback.steps_begun, callback.steps_ended) == (0, 0)


def test_the_patched_trainer_attaches_one_callback_and_never_two(
    transformers_trainer, recording, patched_trainer
):
    from probe.integrations.hf import PipelineDoctorCallback, attached

    automatic = transformers_trainer()
    assert len(attached(automatic)) == 1
    passed_in = PipelineDoctorCallback()
    by_hand = transformers_trainer(callbacks=[passed_in])
    assert attached(by_hand) == [passed_in]  # the script's own: none added beside it
    assert recording.manifest["integrations"]["hf_trainer"] == {
        "trainers": 2,
        "callbacks_attached": 1,
    }

    # added again after construction: two on the Trainer, but the steps are marked once
    automatic.add_callback(PipelineDoctorCallback())
    assert len(attached(automatic)) == 2
    automatic.train()
    assert (
        recording.calls
        == ["explicit_steps(one_fetch_per_step=False)"] + ["begin", "end"] * MAX_STEPS
    )


def test_without_a_session_the_patched_trainer_attaches_nothing(
    transformers_trainer, patched_trainer
):
    from probe.integrations.hf import attached

    assert attached(transformers_trainer()) == []


def test_an_evaluation_between_steps_is_dropped_before_the_next_step(
    transformers_trainer, recording
):
    from probe.integrations.hf import PipelineDoctorCallback

    trainer = transformers_trainer(
        callbacks=[PipelineDoctorCallback()], arguments={"eval_strategy": "steps", "eval_steps": 2}
    )
    trainer.train()
    # evaluated after update 2 (eval_steps) and after the last one (HF's DefaultFlowCallback
    # evaluates as max_steps is reached): each evaluation is dropped, no step is lost
    steps = ["begin", "end"]
    assert recording.calls == [
        "explicit_steps(one_fetch_per_step=False)",
        *steps,
        *steps,
        "discard",
        *steps,
        "discard",
    ]
