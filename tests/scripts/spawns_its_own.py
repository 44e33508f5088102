"""A script that trains in processes it starts itself (torch.multiprocessing.spawn), as
many DDP examples do, and none in its own: for the wrapper's bad-input tests."""

import torch
import torch.multiprocessing as mp


def train_worker(rank: int, steps: int) -> None:
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    print(f"worker {rank} trained {steps} steps", flush=True)


if __name__ == "__main__":
    mp.spawn(train_worker, args=(5,), nprocs=2)
