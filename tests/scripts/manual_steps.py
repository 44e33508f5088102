"""A loop the hooks cannot see (no DataLoader, no torch.optim optimizer), marked by hand.

Runs the same with or without ``pipeline-doctor profile``: outside it the two calls do nothing.
"""

import torch

import probe

weight = torch.zeros(3, requires_grad=True)
for step in range(1, 6):
    with probe.step():
        loss = ((weight - step) ** 2).sum()
        loss.backward()
        with torch.no_grad():
            weight -= 0.1 * weight.grad
            weight.grad = None
        probe.record(loss=loss, batch_size=2)
    print(f"manual step {step} loss {loss.item():.6g}", flush=True)
