"""A plain training loop whose dataset sleeps in __getitem__: the loader is the bottleneck.

Written for the tests of ``pipeline-doctor profile``: nothing in it knows the instruments.
Arguments: --steps N --batch-size B --num-workers W --sleep-ms S --hidden H
[--exit-code C] [--fail] [--linger-s S] [--cleanup-s S]
"""

import argparse
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SleepyDataset(Dataset):
    def __init__(self, size: int, sleep_ms: float):
        self.size = size
        self.sleep_s = sleep_ms / 1000

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        time.sleep(self.sleep_s)
        x = torch.full((8,), float(index % 7))
        return x, x.mean().unsqueeze(0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--sleep-ms", type=float, default=5.0)
    parser.add_argument("--exit-code", type=int, default=None)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--linger-s", type=float, default=0.0)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--quiet", action="store_true", help="no line per step")
    parser.add_argument(
        "--cleanup-s", type=float, default=0.0, help="seconds spent on the way out, however it ends"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 1),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    dataset = SleepyDataset(args.steps * args.batch_size, args.sleep_ms)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, num_workers=args.num_workers, pin_memory=False
    )
    try:
        for step, (x, y) in enumerate(loader, 1):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            # the gradient norm as a test's oracle: summed by hand, not torch's norm helper
            grad_norm = sum(float((p.grad**2).sum()) for p in model.parameters()) ** 0.5
            optimizer.step()
            if not args.quiet:
                print(f"step {step} loss {loss.item():.6g} grad_norm {grad_norm:.6g}", flush=True)
            if args.fail and step == 3:
                raise ValueError("boom at step 3")
            time.sleep(args.linger_s)
    finally:
        time.sleep(args.cleanup_s)  # as a checkpoint saved on the way out would take
    if args.exit_code is not None:
        sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
