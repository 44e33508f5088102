"""The validation pass: loss and accuracy per task on the held-out split.

Run at each epoch boundary of fine-tuning and at the end. The validation set is processed
once (cached by the data module) and batched here without a DataLoader: it is small, and
workers would only add start-up time to a pass that runs between steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Evaluation:
    step: int
    epoch: int
    val_loss: float
    category_accuracy: float
    merchant_type_accuracy: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    val_set: Sequence[dict[str, torch.Tensor]],
    *,
    batch_size: int,
    to_device: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
    autocast_dtype: torch.dtype | None,
    device_type: str,
    step: int,
    epoch: int,
) -> Evaluation:
    """Accuracy per task on ``val_set``; leaves the model in training mode."""
    model.eval()
    correct = [0, 0]
    loss_sum, batches, seen = 0.0, 0, 0
    try:
        for start in range(0, len(val_set), batch_size):
            items = [val_set[i] for i in range(start, min(start + batch_size, len(val_set)))]
            batch = to_device({k: torch.stack([item[k] for item in items]) for k in items[0]})
            with torch.autocast(
                device_type,
                dtype=autocast_dtype or torch.float32,
                enabled=autocast_dtype is not None,
            ):
                out = model(
                    batch["input_ids"],
                    batch["attention_mask"],
                    batch["category"],
                    batch["merchant_type"],
                    batch.get("store_vectors"),
                )
            loss_sum += float(out.loss)
            batches += 1
            seen += len(items)
            correct[0] += int((out.category_logits.argmax(-1) == batch["category"]).sum())
            correct[1] += int((out.merchant_type_logits.argmax(-1) == batch["merchant_type"]).sum())
    finally:
        model.train()
    return Evaluation(
        step=step,
        epoch=epoch,
        val_loss=loss_sum / max(1, batches),
        category_accuracy=correct[0] / max(1, seen),
        merchant_type_accuracy=correct[1] / max(1, seen),
    )
