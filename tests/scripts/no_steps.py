"""Builds a model and never trains it: no optimizer step, no DataLoader batch."""

import torch

model = torch.nn.Linear(4, 2)
print("parameters:", sum(p.numel() for p in model.parameters()))
