"""The parts of a script step's record that arrive late or need unpacking: CUDA-event
times, device scalars with absent figures, a batch's sample and token counts, a tensor as
a float."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


class CudaTimes:
    """A step's device time from its begin event to its end event, read once both ran."""

    def __init__(self, host: dict[str, Any], begin: Any, optimizer: Any, end: Any):
        self._host, self._begin, self._optimizer, self._end = host, begin, optimizer, end

    def ready(self) -> bool:
        return bool(self._end.query())

    def wait(self) -> None:
        self._end.synchronize()

    def get(self) -> dict[str, Any]:
        times = dict(self._host)
        if self._begin is not None:
            times["step_time_ms"] = self._begin.elapsed_time(self._end)
        if self._optimizer is not None:
            times["optimizer_ms"] = self._optimizer.elapsed_time(self._end)
        return times


def batch_samples(batch: Any) -> int | None:
    """The leading dimension of the first tensor in a batch (tensor, sequence or mapping)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        for item in batch:
            found = batch_samples(item)
            if found is not None:
                return found
    return None


def batch_tokens(batch: Any) -> tuple[int, int] | None:
    """A tokenised batch's (tokens, padded length): a Mapping with a tensor ``input_ids``
    (HF's collators, ``BatchEncoding``). The tokens are the attention mask's sum for a 2-D
    batch whose mask lies on the CPU (padding does not count), else every id: a mask on
    the device is never summed, as reading the sum would wait for the device. None for any
    other batch, after one isinstance check (the per-fetch cost of a plain tensor batch)."""
    if not isinstance(batch, Mapping):
        return None
    try:  # a Mapping of the script's own making: its failure must not silence the data wait
        ids = batch.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() == 0:
            return None
        length = int(ids.shape[-1])
        if ids.dim() == 2:
            mask = batch.get("attention_mask")
            if (
                isinstance(mask, torch.Tensor)
                and mask.shape == ids.shape
                and mask.device.type == "cpu"
            ):
                return int(mask.sum()), length
        return ids.numel(), length
    except Exception:
        return None


class NullsForMissing:
    """A pending device read whose absent figures (no loss seen) come back as null."""

    def __init__(self, handle: Any, no_loss: bool, no_norm: bool):
        self._handle, self._no_loss, self._no_norm = handle, no_loss, no_norm

    def ready(self) -> bool:
        return self._handle.ready()

    def wait(self) -> None:
        self._handle.wait()

    def release(self) -> None:
        self._handle.release()

    def get(self) -> dict[str, Any]:
        values = dict(self._handle.get())
        if self._no_loss:
            values["loss"] = None
        if self._no_norm:
            values["grad_norm"] = None
        return values


def host_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, NormParts):
        value = value.total()
    if isinstance(value, torch.Tensor):
        if value.numel() == 1:
            return float(value.item())  # one call: detach/float/index were four dispatches
        return float(value.detach().float().reshape(-1)[0]) if value.numel() else None
    return float(value)


class NormParts:
    """A gradient norm not yet reduced: ``torch._foreach_norm``'s one norm per tensor.

    The optimizer pre-hook must take the norm before the update, but the reduction of the
    parts to one figure can wait: on CPU :func:`probe.deferred.read_floats` reduces a
    batch of steps' parts in a few ops, not three per step."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[torch.Tensor]):
        self.parts = parts

    def total(self) -> torch.Tensor:
        return torch.linalg.vector_norm(torch.stack(self.parts).float())


def gradient_norm(grads: list[torch.Tensor]) -> NormParts | torch.Tensor:
    """The L2 norm of all ``grads``, on their device, without a sync: one foreach kernel
    where they share a device (8 us on a tiny CPU model, against 18 us with the reduction
    and 33-42 us for get_total_norm, measured here), reduced later; else torch's own
    grouping by device and dtype."""
    device = grads[0].device
    if all(g.device == device and g.layout == torch.strided for g in grads):
        return NormParts(list(torch._foreach_norm(grads)))
    return torch.nn.utils.get_total_norm(grads)


# a step's host-side figures, in the order end_step gathers them
HOST_FIELDS = (
    "step",
    "phase",
    "wall_time",
    "batch_size",
    "rss_bytes",
    "profiled",
    "marks",
    "data_wait_ms",
    "step_time_ms",
    "optimizer_ms",
    "tokens",
    "seq_len",
    # the training thread's wait for a CPU over the step (probe.steps.RunQueueWait): the
    # part of a slow step another process or thread caused (step-time-outliers)
    "cpu_wait_ms",
)
CUDA_MEMORY = ("cuda_allocated_bytes", "cuda_reserved_bytes", "cuda_peak_bytes")
# a step's key-value store reads (probe/key_values.py), once the script reads a store
STORE_FIELDS = ("store_reads", "store_keys", "store_read_ms")


def host_step_record(
    row: tuple[Any, ...],
    loss: float | None,
    norm: float | None,
    scale: float | None,
    store: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A CPU step's written record, straight from end_step's row (the fields and their
    order are :func:`step_record`'s; tests/probe/test_step_tokens.py and test_lmdb_reads.py
    compare the two)."""
    (
        step, phase, wall_time, batch, rss, profiled, marks, data_ms, step_ms, optimizer_ms,
        tokens, seq_len, cpu_wait_ms,
    ) = row  # fmt: skip
    compute_ms = None
    if data_ms is not None:
        compute_ms = max(0.0, step_ms - data_ms - (optimizer_ms or 0.0))
    record = {
        "step": step,
        "epoch": None,
        "phase": phase,
        "wall_time": wall_time,
        "step_time_ms": step_ms,
        "data_wait_ms": data_ms,
        "h2d_ms": None,
        "compute_ms": compute_ms,
        "optimizer_ms": optimizer_ms,
        "cpu_wait_ms": cpu_wait_ms,
        "loss": loss,
        "grad_norm": norm,
        "amp_scale": scale,
        "batch_size": batch,
        "samples_per_s": batch / max(step_ms, 1e-6) * 1e3 if batch else None,
        "tokens": tokens,
        "seq_len": seq_len,
        "rss_bytes": rss,
        "profiled": profiled,
        "marks": marks,
    }
    if store is not None:
        record.update(store)
    return record


def step_record(
    host: dict[str, Any], values: dict[str, Any], *, host_clock: bool
) -> dict[str, Any]:
    """The written step record: the host's figures with the times and scalars read later.
    On a host clock (CPU) the compute is what the step's other parts leave; on a device
    clock it is not told apart."""
    step_ms = host["step_time_ms"]
    data_ms = host.get("data_wait_ms")
    optimizer_ms = host.get("optimizer_ms")
    compute_ms = None
    if host_clock and data_ms is not None:
        compute_ms = max(0.0, step_ms - data_ms - (optimizer_ms or 0.0))
    batch = host.get("batch_size")
    return {
        "step": host["step"],
        "epoch": None,
        "phase": host["phase"],
        "wall_time": host["wall_time"],
        "step_time_ms": step_ms,
        "data_wait_ms": data_ms,
        "h2d_ms": None,  # the copy is inside the user's code: not told apart
        "compute_ms": compute_ms,
        "optimizer_ms": optimizer_ms,
        "cpu_wait_ms": host.get("cpu_wait_ms"),
        "loss": values.get("loss"),
        "grad_norm": values.get("grad_norm"),
        "amp_scale": values.get("amp_scale"),
        "batch_size": batch,
        "samples_per_s": batch / max(step_ms, 1e-6) * 1e3 if batch else None,
        "tokens": host.get("tokens"),
        "seq_len": host.get("seq_len"),
        "rss_bytes": host.get("rss_bytes"),
        "profiled": host.get("profiled"),
        "marks": host.get("marks"),
        **{k: host[k] for k in CUDA_MEMORY if k in host},
        **{k: host[k] for k in STORE_FIELDS if k in host},
    }
