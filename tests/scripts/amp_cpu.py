"""bf16 autocast and a GradScaler on CPU; step 3's batch holds an inf, so GradScaler skips it.

Prints each step's unscaled loss (the test's oracle) and the scale it ends with.
"""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
for step in range(1, 7):
    x = torch.randn(8, 4)
    if step == 3:
        x[0, 0] = float("inf")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
print(f"final scale {scaler.get_scale():g}", flush=True)
