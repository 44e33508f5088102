"""The parts of a script step's record that arrive late or need unpacking: CUDA-event
times, device scalars with absent figures, a batch's sample count, a tensor as a float."""

from __future__ import annotations

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
    parts to one figure can wait: on CPU :class:`probe.deferred.HostScalars` reduces a
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
