"""Step records whose figures are still on the GPU, written once they reach the host.

On CUDA nothing in a training step waits for the device: ``float(loss)``, ``.item()``, a
tensor in a Python ``if`` and ``Event.synchronize()`` each drain the queue, and the device
then idles while the host launches the next step's first kernels (issue 9 measured 5 %
per step on an H200 for the step clock's one sync alone). Instead:

- ``DeviceScalars`` gathers each step's loss, gradient norm, finiteness and AMP scale into
  one small device tensor, and every ``every`` steps copies the block to pinned host memory
  with one non-blocking copy, followed by an event;
- ``PendingSteps`` holds each step's host-side record with its pending times and scalars,
  and writes records in step order as soon as both have run on the device: it asks with
  ``Event.query()``, which never blocks. ``flush()`` waits for everything (checkpoints,
  the end of a phase, a stop), so a record is never lost and never written out of order.

On CPU the times are immediate (``Resolved``), and a batch of steps' losses, gradient
norms and scales is read at once (:func:`read_floats`): a ``float()`` per figure per step
was a measurable part of a tiny step's cost. A profiled script's session goes further and
keeps its CPU steps out of ``PendingSteps`` altogether (probe/session.py).
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

SCALARS = ("loss", "grad_norm", "finite", "amp_scale")
DEFAULT_READ_EVERY = 10  # steps between device -> host reads: records lag by at most this


class _ScalarBlock:
    """Rows ``first .. first+n-1`` of step scalars, in flight to the host."""

    def __init__(self, first: int, rows: list[torch.Tensor]):
        self.first = first
        self.count = len(rows)
        block = torch.stack(rows)  # (n, 4) on the device, one kernel
        self.host = torch.empty(block.shape, dtype=block.dtype, pin_memory=True)
        self.host.copy_(block, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()
        self._values: list[list[float]] | None = None

    def ready(self) -> bool:
        return bool(self.event.query())

    def wait(self) -> None:
        self.event.synchronize()

    def row(self, index: int) -> dict[str, Any]:
        if self._values is None:
            self._values = self.host.tolist()  # on the host already: no device access
        loss, grad_norm, finite, scale = self._values[index - self.first]
        return {
            "loss": loss,
            "grad_norm": grad_norm,
            "finite": bool(finite),
            "amp_scale": None if math.isnan(scale) else scale,
        }


class PendingScalars:
    """A handle on one step's row in a ``DeviceScalars`` block (ready once shipped)."""

    def __init__(self, owner: DeviceScalars, index: int):
        self._owner = owner
        self._index = index

    def release(self) -> None:
        """Called once the row is written: blocks fully written are dropped."""
        self._owner.release_before(self._index + 1)

    def ready(self) -> bool:
        block = self._owner.block_of(self._index)
        return block is not None and block.ready()

    def wait(self) -> None:
        block = self._owner.block_of(self._index)
        if block is None:
            self._owner.ship()
            block = self._owner.block_of(self._index)
        assert block is not None
        block.wait()

    def get(self) -> dict[str, Any]:
        block = self._owner.block_of(self._index)
        assert block is not None, "get() before the step's scalars were shipped"
        return block.row(self._index)


class DeviceScalars:
    """Each CUDA step's loss, grad norm, finiteness and AMP scale, read every ``every`` steps."""

    def __init__(self, device: torch.device, every: int = DEFAULT_READ_EVERY):
        self._device = device
        self._every = max(1, every)
        self._rows: list[torch.Tensor] = []
        self._first = 0  # index of the first row not yet shipped
        self._next = 0
        self._blocks: deque[_ScalarBlock] = deque()
        self._nan = torch.full((), math.nan, device=device)

    def add(
        self,
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        finite: torch.Tensor,
        amp_scale: torch.Tensor | None,
    ) -> PendingScalars:
        """Queues one step's values (device tensors); stacked now, so a later in-place
        change (GradScaler.update() rewrites its scale) does not alter them."""
        scale = self._nan if amp_scale is None else amp_scale
        parts = [loss.detach(), grad_norm.detach(), finite, scale]
        self._rows.append(torch.stack([p.to(torch.float32).reshape(()) for p in parts]))
        handle = PendingScalars(self, self._next)
        self._next += 1
        if len(self._rows) >= self._every:
            self.ship()
        return handle

    def ship(self) -> None:
        """Starts the copy of the rows queued so far (non-blocking)."""
        if self._rows:
            self._blocks.append(_ScalarBlock(self._first, self._rows))
            self._first += len(self._rows)
            self._rows = []

    def block_of(self, index: int) -> _ScalarBlock | None:
        for block in self._blocks:
            if block.first <= index < block.first + block.count:
                return block
        return None

    def release_before(self, index: int) -> None:
        """Drops blocks whose every row has been written."""
        while self._blocks and self._blocks[0].first + self._blocks[0].count <= index:
            self._blocks.popleft()


class PendingSteps:
    """Step records in order, each written by ``sink`` once its figures are on the host.

    ``complete(record, times, scalars)`` turns the host-side record plus the resolved
    times and scalars into the written record; it runs in step order.
    """

    def __init__(
        self,
        sink: Callable[[dict[str, Any]], None],
        complete: Callable[[dict[str, Any], dict[str, float], dict[str, Any]], dict[str, Any]],
        scalars: DeviceScalars | None = None,
    ):
        self._sink = sink
        self._complete = complete
        self._scalars = scalars  # shipped on flush: its last rows may not fill a block
        self._queue: deque[tuple[dict[str, Any], Any, Any]] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def ship_on_flush(self, scalars: DeviceScalars) -> None:
        """The device scalars to ship when flushing (known once the device is)."""
        self._scalars = scalars

    def push(self, record: dict[str, Any], times: Any, scalars: Any) -> None:
        self._queue.append((record, times, scalars))
        self.poll()

    def poll(self) -> int:
        """Writes every record at the head of the queue whose figures have arrived."""
        written = 0
        while self._queue:
            _, times, scalars = self._queue[0]
            if not (times.ready() and scalars.ready()):
                break
            self._write_head()
            written += 1
        return written

    def flush(self) -> int:
        """Waits for and writes every queued record (one device sync at most)."""
        if self._scalars is not None:
            self._scalars.ship()
        written = 0
        while self._queue:
            _, times, scalars = self._queue[0]
            times.wait()
            scalars.wait()
            self._write_head()
            written += 1
        return written

    def _write_head(self) -> None:
        record, times, scalars = self._queue.popleft()
        self._sink(self._complete(record, times.get(), scalars.get()))
        release = getattr(scalars, "release", None)  # a device read's block can go
        if release is not None:
            release()


def read_floats(values: list[Any]) -> list[float | None]:
    """Each value as a float (None stays None); tensors and norm parts read in batches."""
    from probe.step_values import NormParts  # step_values imports nothing of this module

    out: list[float | None] = [None] * len(values)
    tensors: list[tuple[int, torch.Tensor]] = []
    parts: list[tuple[int, list[torch.Tensor]]] = []
    for index, value in enumerate(values):
        if value is None:
            continue
        if isinstance(value, NormParts):
            parts.append((index, value.parts))
        elif isinstance(value, torch.Tensor):
            if value.numel() == 1:
                tensors.append((index, value))
        else:
            out[index] = float(value)
    if parts:
        for (index, _), number in zip(parts, _reduce_norms([p for _, p in parts]), strict=True):
            out[index] = number
    if tensors:
        try:  # 0-dim tensors of one device: one stack, one read (stack promotes dtypes)
            read = torch.stack([t if t.dim() == 0 else t.reshape(()) for _, t in tensors])
            numbers = read.float().tolist()
        except RuntimeError:  # tensors on several devices: one at a time
            numbers = [float(t.item()) for _, t in tensors]
        for (index, _), number in zip(tensors, numbers, strict=True):
            out[index] = number
    return out


def _reduce_norms(rows: list[list[torch.Tensor]]) -> list[float]:
    """Each row's L2 norm of its per-tensor norms; rows of one length in a single op."""
    width = len(rows[0])
    if all(len(row) == width for row in rows):
        with contextlib.suppress(RuntimeError):  # mixed devices: row by row below
            flat = torch.stack([part for row in rows for part in row]).float()
            return torch.linalg.vector_norm(flat.view(len(rows), width), dim=1).tolist()
    return [float(torch.linalg.vector_norm(torch.stack(row).float()).item()) for row in rows]
