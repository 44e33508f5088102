"""A training loop that forks a copy of itself midway (os.fork), and the copy trains on.

Steps 1-3 in the script's own process, then a fork: the copy trains 12 steps of its own
(more than the 10 a CPU session buffers before writing) and leaves with ``sys.exit(5)``;
the script's own process waits for it and trains steps 4-6. For the wrapper's bad-input
tests: the copy's steps must not reach the run's records.
"""

import os
import sys

import torch


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, optimizer, 3)
    pid = os.fork()
    if pid == 0:
        train(model, optimizer, 12)
        print("the forked copy trained 12 steps", flush=True)
        sys.exit(5)
    _, status = os.waitpid(pid, 0)
    print(f"the copy exited with {os.waitstatus_to_exitcode(status)}", flush=True)
    train(model, optimizer, 3)
    print("the script's own process trained 6 steps", flush=True)


if __name__ == "__main__":
    main()
