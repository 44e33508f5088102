"""Keeps 8 MiB a step (the leak, at the line marked LEAK) and at step ``--oom-at`` asks for
far more than any device holds. On CUDA that is a real ``torch.cuda.OutOfMemoryError``;
on CPU the same error is raised by hand, so the wrapper's handling of it runs anywhere.

    python leak_then_oom.py [--steps N] [--oom-at STEP]
"""

import argparse

import torch

import probe

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--oom-at", type=int, default=0)
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
weight = torch.zeros(256, 256, device=device, requires_grad=True)
kept = []
for step in range(1, args.steps + 1):
    with probe.step():
        loss = (weight @ torch.randn(256, 256, device=device)).square().mean()
        loss.backward()
        with torch.no_grad():
            weight -= 0.1 * weight.grad
            weight.grad = None
        kept.append(torch.empty(8 << 20, dtype=torch.uint8, device=device))  # LEAK
        if step == args.oom_at:
            if device != "cuda":
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (raised by hand on CPU)")
            torch.empty(1 << 50, dtype=torch.uint8, device=device)  # 1 PiB
        probe.record(loss=loss, batch_size=1)
