"""Where training stands: shared by the loop and the checkpoints, which save and restore it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Position:
    """Where training stands after ``step`` optimiser steps."""

    step: int = 0
    phase: str = "pretrain"
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of ``epoch`` already trained on
