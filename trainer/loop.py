"""The training loop: masked-LM pre-training, then multi-task fine-tuning, instrumented.

Stopping: each step first checks for SIGTERM (preemption: checkpoint, status
``preempted``), ``cancel.request`` in the run folder (status ``cancelled``) and the
``train.max_runtime_s`` budget (checkpoint, status ``cancelled`` with the budget as the
reason, so ``resume`` can finish the job). An exception ends the run ``failed`` with the
error as the reason; the records written so far stay.

Non-finite values: a step whose loss or gradient norm is not finite is recorded as is
(NaN/inf in the step record) but its optimiser update is skipped, as GradScaler does, so
one overflow does not poison the weights; the run goes on and its notes say when the
first non-finite step happened and how many there were. It does not crash on NaN.

Exact resume: a checkpoint holds the model, optimiser, GradScaler, the Python, NumPy and
torch (CPU and CUDA) RNG states and the data position (phase, epoch, batches consumed),
all as tensors and plain types (trainer/checkpoint.py: loaded with ``weights_only=True``).
Data order depends only on (seed, phase, epoch), so a resumed run sees the same batches.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from diagnostics.runs import CANCEL_FILE, TOKENIZER_FILE, TRACE_DIR, RunState
from probe.alert import RunAlert
from probe.deferred import DeviceScalars, PendingSteps
from probe.memory_lines import make_memory_lines
from probe.memory_snapshots import SnapshotWindow, make_snapshot_recorder
from probe.profiler import make_profiler
from probe.steps import Resolved, cuda_memory, make_step_clock, rss_bytes
from probe.system import make_sampler
from trainer import checkpoint
from trainer.config import TrainerConfig
from trainer.data import (
    Corpus,
    EpochBatches,
    load_corpus,
    make_train_dataset,
    make_val_dataset,
    num_labels,
    open_embedding_store,
    take_loading_wait_ms,
    take_store_counts,
    used_token_ids,
)
from trainer.distributed import current_context, worker_name
from trainer.evaluate import evaluate
from trainer.model import MultiTaskModel, mask_tokens, parameter_count
from trainer.position import Position
from trainer.run_io import SafeWriter
from trainer.runtime import StopRequests, seed_everything, set_tf32
from trainer.stopping import Stop, StopKind
from trainer.vocab import model_vocab

log = logging.getLogger("trainer")

MEMORY_LINES_PROBE_SAMPLES = 64
# a step record's keys that come before its times and scalars (the rest follow them)
_EARLY_KEYS = ("step", "epoch", "phase", "wall_time", "lr", "batch_size")


@dataclass(frozen=True)
class Outcome:
    status: RunState  # completed | cancelled | preempted (a failure raises instead)
    reason: str | None = None
    steps_done: int = 0


@dataclass(frozen=True)
class StepResult:
    """What a training step leaves for its record: the scalars (on the host already, or a
    pending device read) and the batch's size."""

    scalars: Any  # Resolved | a pending DeviceScalars read (probe.deferred)
    batch_size: int


class Trainer:
    def __init__(
        self,
        config: TrainerConfig,
        writer: SafeWriter,
        *,
        device: str,
        cache_dir: Path | None,
        stop: StopRequests,
    ):
        self.config = config
        self.writer = writer
        self.run_dir = writer.path
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stop = stop
        # set either way, not left to the process: the fp32 scenario needs TF32 off for sure
        self.fp32_matmul = set_tf32(config.train.tf32) if self.cuda else None
        self.instruments = config.instruments.enabled
        self.total_steps = config.train.pretrain_steps + config.train.steps
        self.started = time.monotonic()
        self._process = psutil.Process(os.getpid())

        seed_everything(config.seed)
        self.corpus: Corpus = load_corpus(
            config.data, config.seed, cache_dir, self.run_dir / TOKENIZER_FILE
        )
        store = open_embedding_store(self.corpus, config.data, config.seed, self.run_dir)
        self.train_set = make_train_dataset(self.corpus, config.data, config.seed, store)
        self.vocab = model_vocab(
            self.corpus.tokenizer,
            self.train_set.texts,
            self.train_set._ids,  # before any id map: the tokenizer's own numbering
            prune=config.data.prune_vocab,
            masking=config.train.pretrain_steps > 0,
        )
        if self.vocab.lookup is not None:
            self.train_set.apply_id_map(self.vocab.lookup)
        # a store object of its own: validation reads must not count as a training batch's
        val_store = open_embedding_store(self.corpus, config.data, config.seed, self.run_dir)
        self.val_set = make_val_dataset(self.corpus, config.data, self.vocab.lookup, val_store)
        n_categories, n_types = num_labels()
        self.model = MultiTaskModel(
            config.model,
            vocab_size=self.vocab_rows,
            max_length=config.data.max_length,
            num_categories=n_categories,
            num_merchant_types=n_types,
            pad_id=self.vocab.pad_id,
            store_dim=config.data.embedding_dim if config.data.embedding_store else 0,
        ).to(self.device)
        # fused on CUDA: it takes the skip-this-step flag as a device tensor (found_inf), so a
        # non-finite step is skipped without the host ever reading the loss
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.train.lr,
            weight_decay=config.train.weight_decay,
            fused=True if self.cuda else None,  # None: CPU keeps torch's default path
        )
        amp = config.train.amp if self.cuda else "off"
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
        self.scaler = torch.amp.GradScaler(
            "cuda", enabled=self.cuda and amp == "fp16" and config.train.grad_scaler
        )
        self.position = Position()
        self.total_loss: float | torch.Tensor = 0.0
        self.batch_history: list[Any] = []
        self.nonfinite_steps = 0
        self.first_nonfinite_step: int | None = None
        self.evaluations: list[dict[str, Any]] = []
        self.resume_note: str | None = None  # what a resume had to set aside, if anything
        self.memory_lines = make_memory_lines(self.instruments and config.instruments.memory_lines)
        self._train_step = self.memory_lines.wrap(self._train_step_impl)
        self.clock = make_step_clock(self.device)
        self.scalars = (
            DeviceScalars(self.device, config.runtime.read_every_steps) if self.cuda else None
        )
        self.pending = PendingSteps(self._write_record, self._complete_record, self.scalars)
        self._log_every = max(1, self.total_steps // 10)
        # known causes of extra time the next step record names (StepRecord "marks")
        self._pending_marks: list[str] = []
        self.profiler = make_profiler(
            config.profiler,
            self.run_dir / TRACE_DIR,
            enabled=self.instruments,
            cuda=self.cuda,
            worker_name=worker_name(self.run_dir),
        )
        self.dist = current_context()  # None unless started by torchrun
        if self.dist is not None:
            self.dist.attach(self)
        instruments = config.instruments
        self.snapshots = make_snapshot_recorder(
            SnapshotWindow(
                steps=instruments.memory_snapshot_steps,
                start=instruments.memory_snapshot_start,
                stacks=instruments.memory_snapshot_stacks,
            ),
            self.run_dir,
            # rank 0 only under torchrun: the ranks share memory/ and its names carry no rank
            enabled=self.instruments and (self.dist is None or self.dist.rank == 0),
            cuda=self.cuda,
            note=writer.add_note,
        )
        self.sampler = make_sampler(
            writer.append_sample,
            writer.add_note_if_room,
            enabled=self.instruments,
            sample_hz=config.instruments.sample_hz,
        )

    # --- checkpoints (format and fallback: trainer/checkpoint.py) ---------------------------

    def checkpoint_path(self, step: int) -> Path:
        return checkpoint.checkpoint_path(self.run_dir, step)

    def save_checkpoint(self) -> Path:
        # the step file must reach the checkpoint's step: a resume continues after it
        self.pending.flush()
        return checkpoint.save(self.run_dir, self.position.step, checkpoint.capture(self))

    def load_checkpoint(self, path: Path) -> None:
        """Restores this trainer from one given checkpoint (CheckpointError if unusable)."""
        checkpoint.apply(self, checkpoint.load(path, self.device), path.name)
        log.info("resumed from %s at step %d", path.name, self.position.step)
        self._note_history_restarts()

    def _note_history_restarts(self) -> None:
        if self.config.train.keep_batch_history:
            self.writer.add_note(
                "resumed: the batch history (train.keep_batch_history) restarts empty"
            )

    def restore_latest_checkpoint(self) -> None:
        """Continues from the newest intact checkpoint; unusable newer ones are set aside."""
        restored = checkpoint.load_latest_intact(
            self.run_dir,
            self.device,
            self.writer.add_note,
            fits=lambda state: checkpoint.check_fits(self, state),
        )
        if restored.set_aside:
            where = restored.path.name if restored.path else "the start (no intact checkpoint)"
            self.resume_note = f"resumed from {where}; set aside as unreadable: " + "; ".join(
                restored.set_aside
            )
        if restored.path is None or restored.state is None:
            if restored.set_aside:
                log.warning("no intact checkpoint: the run starts over from step 0")
            return
        checkpoint.apply(self, restored.state, restored.path.name)
        log.info("resumed from %s at step %d", restored.path.name, self.position.step)
        self._note_history_restarts()

    # --- one step ------------------------------------------------------------------------

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        non_blocking = self.config.data.non_blocking and self.cuda
        return {k: v.to(self.device, non_blocking=non_blocking) for k, v in batch.items()}

    def _train_step_impl(self, phase: str, batch: dict[str, torch.Tensor]) -> StepResult:
        """Copy, forward + backward, clip, optimiser step. Returns the step's figures."""
        train = self.config.train
        self.clock.mark("start")
        batch = self._to_device(batch)
        self.clock.mark("copied")
        with torch.autocast(
            self.device.type,
            dtype=self.autocast_dtype or torch.float32,
            enabled=self.autocast_dtype is not None,
        ):
            if phase == "pretrain":
                assert self.vocab.mask_id is not None  # kept whenever pretrain_steps > 0
                inputs, labels = mask_tokens(
                    batch["input_ids"],
                    list(self.vocab.special_ids),
                    self.vocab.mask_id,
                    self.vocab.size,
                )
                loss = self.model.mlm_loss(inputs, batch["attention_mask"], labels)
                hidden = None
            else:
                output = self.model(
                    batch["input_ids"],
                    batch["attention_mask"],
                    batch["category"],
                    batch["merchant_type"],
                    batch.get("store_vectors"),
                )
                loss, hidden = output.loss, output.hidden
        self.scaler.scale(loss).backward()
        if self.dist is not None:
            self.dist.after_backward()  # the all-reduce, when it is not DDP's overlapped one
        self.clock.mark("computed")

        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        grads = [p.grad for p in params]
        grad_norm = torch.nn.utils.get_total_norm(grads)  # before clipping, every step
        if self.cuda:
            return self._finish_step_on_device(loss, grad_norm, params, batch, hidden)
        loss_value = float(loss.detach())
        grad_norm_value = float(grad_norm)
        finite = math.isfinite(loss_value) and math.isfinite(grad_norm_value)
        if train.grad_clip is not None and finite:
            torch.nn.utils.clip_grads_with_norm_(params, train.grad_clip, grad_norm)
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # skips the update itself on inf/NaN gradients
            amp_scale: float | None = float(self.scaler.get_scale())
            self.scaler.update()
        else:
            if finite:
                self.optimizer.step()
            amp_scale = None
        self.optimizer.zero_grad(set_to_none=True)

        if train.accumulate_loss_as_tensor:
            # the leak, as written in the wild: the running total keeps every step's graph
            self.total_loss += loss
        else:
            self.total_loss += loss_value
        if train.keep_batch_history:
            # the second leak: a "debug" list holding every batch and its encoder output
            self.batch_history.append((batch, hidden))
        values = {
            "loss": loss_value,
            "grad_norm": grad_norm_value,
            "amp_scale": amp_scale,
            "finite": finite,
        }
        return StepResult(Resolved(values), int(batch["input_ids"].shape[0]))

    def _finish_step_on_device(
        self,
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        params: list[torch.nn.Parameter],
        batch: dict[str, torch.Tensor],
        hidden: torch.Tensor | None,
    ) -> StepResult:
        """The CUDA end of a step: same decisions as the CPU's, none read on the host.

        Clipping a non-finite norm would turn the gradients into NaN, but such a step's
        update is skipped (fused AdamW's ``found_inf``; GradScaler passes its own), so
        clipping unconditionally changes nothing that is applied.
        """
        train = self.config.train
        assert self.scalars is not None
        finite = torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)
        if train.grad_clip is not None:
            torch.nn.utils.clip_grads_with_norm_(params, train.grad_clip, grad_norm)
        amp_scale = None
        if self.scaler.is_enabled():
            amp_scale = self.scaler._get_scale_async()  # the tensor; get_scale() would sync
            scalars = self.scalars.add(loss, grad_norm, finite, amp_scale)
            self.scaler.step(self.optimizer)  # skips the update itself on inf/NaN gradients
            self.scaler.update()
        else:
            scalars = self.scalars.add(loss, grad_norm, finite, None)
            self.optimizer.found_inf = (~finite).to(torch.float32)  # type: ignore[attr-defined]
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf  # type: ignore[attr-defined]
        self.optimizer.zero_grad(set_to_none=True)

        if train.accumulate_loss_as_tensor:
            self.total_loss += loss  # the leak, as on CPU
        else:
            self.total_loss += loss.detach()  # a device tensor: read at checkpoints only
        if train.keep_batch_history:
            self.batch_history.append((batch, hidden))
        return StepResult(scalars, int(batch["input_ids"].shape[0]))

    # --- evaluation ------------------------------------------------------------------------

    def evaluate(self, epoch: int) -> dict[str, Any]:
        """The validation pass (trainer.evaluate), kept for the run's manifest. It runs
        out of memory on what training left allocated plus its own activations: that error
        is dumped and reported as a step's is, naming the evaluation."""
        try:
            result = evaluate(
                self.model,
                self.val_set,
                batch_size=self.config.train.batch_size,
                to_device=self._to_device,
                autocast_dtype=self.autocast_dtype,
                device_type=self.device.type,
                step=self.position.step,
                epoch=epoch,
            ).to_dict()
        except torch.cuda.OutOfMemoryError as exc:
            raise self.snapshots.out_of_memory(self.position.step, exc, evaluating=True) from exc
        self.evaluations.append(result)
        log.info(
            "eval step %d: loss %.3f, category acc %.3f, merchant type acc %.3f",
            result["step"],
            result["val_loss"],
            result["category_accuracy"],
            result["merchant_type_accuracy"],
        )
        return result

    # --- the loop --------------------------------------------------------------------------

    def _stop_reason(self) -> Stop | None:
        if self.stop.sigterm:
            return Stop(StopKind.PREEMPT, "SIGTERM received: checkpointed for resume")
        if self.stop.sigint:
            return Stop(StopKind.INTERRUPT, "interrupted (SIGINT)")
        if (self.run_dir / CANCEL_FILE).exists():
            return Stop(StopKind.CANCEL, "cancel requested")
        budget = self.config.train.max_runtime_s
        if budget is not None and time.monotonic() - self.started >= budget:
            return Stop(
                StopKind.BUDGET,
                f"train.max_runtime_s budget of {budget:g} s reached after step "
                f"{self.position.step} of {self.total_steps}; resume to finish",
            )
        return None

    def _phases(self) -> list[tuple[str, int, int, int]]:
        """(phase, last global step of the phase, start epoch, start batch) still to run."""
        pretrain_end = self.config.train.pretrain_steps
        pos = self.position
        phases = []
        if pos.step < pretrain_end:
            phases.append(("pretrain", pretrain_end, pos.epoch, pos.batch_in_epoch))
        if pos.phase == "finetune":
            phases.append(("finetune", self.total_steps, pos.epoch, pos.batch_in_epoch))
        else:
            phases.append(("finetune", self.total_steps, 0, 0))
        return [p for p in phases if p[1] > pos.step]

    def _step_marks(self, batch_in_epoch: int) -> str | None:
        """What else the step just run paid for, so an analysis can leave it out of outlier
        and steady-state judgements: the profiler's warm-up and active steps, the first
        step of an epoch (and after an evaluation or a checkpoint or a trace export, which
        run between steps)."""
        marks = list(self._pending_marks)
        self._pending_marks = []
        state = self.profiler.state
        if state in ("warmup", "active"):
            marks.append(f"profiler_{state}")
        marks.extend(self.snapshots.marks(self.position.step))
        if batch_in_epoch == 1:
            marks.append("epoch_start")
        return ",".join(dict.fromkeys(marks)) or None

    def _record(
        self, phase: str, epoch: int, times: Any, out: StepResult, batch_values: dict[str, Any]
    ) -> None:
        """Queues the step's record: what the host knows now, the rest once it arrives.
        ``batch_values``: what the batch brought, its embedding-store reads (none without a
        store) and how long of the data wait it was still loading."""
        record = {
            "step": self.position.step,
            "epoch": epoch,
            "phase": phase,
            "wall_time": time.time(),
            "lr": self.optimizer.param_groups[0]["lr"],
            "batch_size": out.batch_size,
            "rss_bytes": rss_bytes(self._process),
            "profiled": self.profiler.recording,
            "marks": self._step_marks(self.position.batch_in_epoch),
            **cuda_memory(self.device),
            **batch_values,
        }
        self.pending.push(record, times if self.clock.deferred else Resolved(times), out.scalars)

    def _complete_record(
        self, record: dict[str, Any], times: dict[str, float], values: dict[str, Any]
    ) -> dict[str, Any]:
        # the order of the written record's keys is the step file's column order
        return {
            **{k: record[k] for k in ("step", "epoch", "phase", "wall_time")},
            **times,
            "loss": values["loss"],
            "grad_norm": values["grad_norm"],
            "lr": record["lr"],
            "amp_scale": values["amp_scale"],
            "batch_size": record["batch_size"],
            "samples_per_s": record["batch_size"] / max(times["step_time_ms"], 1e-6) * 1e3,
            **{k: v for k, v in record.items() if k not in _EARLY_KEYS},
            "finite": values["finite"],
        }

    def _write_record(self, record: dict[str, Any]) -> None:
        finite = record.pop("finite")
        step = record["step"]
        if not finite:
            self._note_nonfinite(step)
        self.writer.append_step(record)
        if step % self._log_every == 0 or step == self.total_steps:
            log.info(
                "step %d/%d %s loss %.4f grad norm %.3g %.1f ms (data %.1f ms)",
                step,
                self.total_steps,
                record["phase"],
                record["loss"],
                record["grad_norm"],
                record["step_time_ms"],
                record["data_wait_ms"],
            )

    def _note_nonfinite(self, step: int) -> None:
        self.nonfinite_steps += 1
        if self.first_nonfinite_step is None:
            self.first_nonfinite_step = step
            self.writer.add_note(
                f"non-finite loss or gradient norm first at step {step}: such steps are "
                "recorded and their optimiser update skipped; the run continues"
            )
            log.warning("non-finite loss or gradient norm at step %d", step)

    def run(self, resume_from: Path | None = None, *, resume_latest: bool = False) -> Outcome:
        """Trains to the end or a stop; from ``resume_from``, or with ``resume_latest``
        from the run's newest intact checkpoint."""
        if resume_from is not None:
            self.load_checkpoint(resume_from)
        elif resume_latest:
            self.restore_latest_checkpoint()
        self.writer.update_manifest(model_parameters=parameter_count(self.model))
        self.writer.update_environment(
            vocab_usage=self.vocab_usage(),
            # the training split, not data.rows: a tenth is held out for validation, and
            # the last partial batch is still a step
            steps_per_epoch=math.ceil(len(self.train_set) / self.config.train.batch_size),
            # "ieee" = fp32 matmuls on CUDA cores; "tf32" = on Tensor Cores (train.tf32)
            fp32_matmul_precision=self.fp32_matmul,
        )
        self._probe_getitem()
        self.model.train()
        self.sampler.start()
        alert = self._make_alert()
        if alert is not None:
            alert.start()
        try:
            outcome = self._run_phases()
        except BaseException:
            # a failed run keeps every record that reached the device; a CUDA error may
            # make reading them fail too, and must not hide the first error
            with contextlib.suppress(Exception):
                self.pending.flush()
            raise
        finally:
            if alert is not None:
                alert.close()
            self.profiler.stop()
            self.snapshots.stop()
            self.sampler.stop()
        self._finish_notes(outcome)
        return outcome

    def _make_alert(self) -> RunAlert | None:
        """runtime.alert_after_s's timer; rank 0's alone under torchrun: one alert a run.

        Counted from this process's start, not from ``self.started`` (the max_runtime_s
        budget's clock): the torch import and the corpus before it take seconds too, and
        a run stuck there is exactly one a person should hear about.
        """
        threshold = self.config.runtime.alert_after_s
        if threshold is None or (self.dist is not None and self.dist.rank != 0):
            return None
        since_start_s = max(0.0, time.time() - self._process.create_time())
        return RunAlert(
            self.run_dir,
            threshold,
            step=lambda: self.position.step,
            total_steps=lambda: self.total_steps,
            environ=os.environ,
            started=time.monotonic() - since_start_s,
        )

    @property
    def vocab_rows(self) -> int:
        """The model's embedding (and masked-LM decoder) rows: the vocabulary rounded up to
        ``model.pad_vocab_to_multiple_of``."""
        multiple = self.config.model.pad_vocab_to_multiple_of
        return -(-self.vocab.size // multiple) * multiple

    def vocab_usage(self) -> dict[str, Any]:
        """The unused-embedding-rows rule's input: ids the data uses vs the model's rows.

        ``vocab_size`` is the model's embedding rows: the trained tokenizer's vocabulary
        (WordPiece stops growing when the corpus has no more pairs to merge, so a large
        ``data.vocab_size`` does not make the embedding larger than that), or with
        ``data.prune_vocab`` the kept ids, the tokenizer's size then in ``pruned_from``.
        ``used_token_ids`` counts in the model's numbering, after the id map.
        """
        return {
            "used_token_ids": used_token_ids(
                self.corpus,
                self.train_set,
                masking=self.config.train.pretrain_steps > 0,
                vocab=self.vocab,
            ),
            "vocab_size": self.vocab.size,
            # rows past the vocabulary (model.pad_vocab_to_multiple_of): never fed, by design
            "padding_rows": self.vocab_rows - self.vocab.size,
            "tokenizer_vocab_size": self.vocab.original_size,
            "pruned_from": self.vocab.original_size if self.vocab.pruned else None,
            "requested_vocab_size": self.config.data.vocab_size,
            "embedding_dim": self.config.model.hidden_size,
            "embedding_matrices": self.model.vocab_matrices(),
            "source": "training split as tokenised for the model",
        }

    def _probe_getitem(self) -> None:
        """Line memory of ``__getitem__``, measured here in the main process.

        Under DataLoader workers the dataset runs in other processes, where the line
        profiler's records would be lost; a probe of a few samples here shows the same lines.
        """
        if not (self.instruments and self.config.instruments.memory_lines):
            return
        getitem = self.memory_lines.wrap(type(self.train_set).__getitem__)
        for index in range(min(MEMORY_LINES_PROBE_SAMPLES, len(self.train_set))):
            getitem(self.train_set, index)

    def _run_phases(self) -> Outcome:
        cfg = self.config
        for phase, phase_end, start_epoch, start_batch in self._phases():
            batches = EpochBatches(
                self.train_set,
                cfg.data,
                batch_size=cfg.train.batch_size,
                seed=cfg.seed,
                phase=phase,
                pin_memory=cfg.data.pin_memory and self.cuda,
                **(
                    {"rank": self.dist.rank, "world_size": self.dist.world_size}
                    if self.dist
                    else {}
                ),
            ).iterate(start_epoch, start_batch)
            log.info("%s: steps %d..%d", phase, self.position.step + 1, phase_end)
            if phase == "finetune":
                self.profiler.start()
            current_epoch = start_epoch
            while self.position.step < phase_end:
                stop = self._stop_reason()
                if self.dist is not None:  # every rank stops after the same step
                    stop = self.dist.agree_stop(stop)
                if stop is not None:
                    return self._stop(stop)
                self.clock.begin()
                asked_at = time.monotonic()
                epoch, batch_in_epoch, batch = next(batches)
                self.clock.mark("fetched")
                loading_wait_ms = take_loading_wait_ms(batch, asked_at, time.monotonic())
                store_counts = take_store_counts(batch)
                if phase == "finetune" and epoch != current_epoch:
                    with self.clock.set_aside():
                        self.evaluate(current_epoch)
                    self._pending_marks.append("after_evaluation")
                current_epoch = epoch
                step = self.position.step + 1
                self.snapshots.step_begins(step)
                try:
                    out = self._train_step(phase, batch)
                except torch.cuda.OutOfMemoryError as exc:
                    # the allocator's state is dumped before anything frees it
                    raise self.snapshots.out_of_memory(step, exc) from exc
                times = self.clock.finish()
                self.position = Position(self.position.step + 1, phase, epoch, batch_in_epoch)
                batch_values = {**store_counts, "loading_wait_ms": loading_wait_ms}
                self._record(phase, epoch, times, out, batch_values)
                exporting = self.profiler.state == "active"
                self.profiler.step()
                if exporting and self.profiler.state != "active":
                    # the window closed: the trace was written between this step and the next
                    self._pending_marks.append("after_trace_export")
                self.snapshots.step_ended(step)
                if self.position.step % cfg.train.checkpoint_every == 0:
                    self.save_checkpoint()
                    self._pending_marks.append("after_checkpoint")
            self.pending.flush()
            del batches  # shuts this phase's workers down before the next phase starts
        self.evaluate(self.position.epoch)
        if self.position.step % cfg.train.checkpoint_every:
            self.save_checkpoint()
        return Outcome("completed", None, self.position.step)

    def _stop(self, stop: Stop) -> Outcome:
        self.pending.flush()
        log.warning("stopping at step %d: %s", self.position.step, stop.reason)
        if stop.kind is StopKind.BUDGET:
            self.writer.add_note(f"stopped early: {stop.reason}")
        wanted = stop.kind is StopKind.PREEMPT or self.position.step > 0
        if wanted and not self.checkpoint_path(self.position.step).exists():
            self.save_checkpoint()
        return Outcome(stop.status, stop.reason, self.position.step)

    def _finish_notes(self, outcome: Outcome) -> None:
        if self.nonfinite_steps:
            self.writer.add_note(
                f"{self.nonfinite_steps} of {self.position.step} steps had a non-finite loss "
                f"or gradient norm (first at step {self.first_nonfinite_step})"
            )
        rows = self.memory_lines.rows()
        if rows:
            self.writer.write_memory_lines(rows)
        self.writer.update_manifest(evaluations=self.evaluations)
