"""Training on threads: ``--teacher`` trains a teacher model on a background thread (30
steps) before the main module's own loop trains 30; ``--only-threads`` trains three models,
each on its own thread with its own optimizer (20 steps each), and nothing on the main
thread. For the wrapper's tests: steps are the training thread's."""

import argparse
import threading

import torch


def train(steps: int, seed: int) -> None:
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--teacher", action="store_true")
    parser.add_argument("--only-threads", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.teacher:
        teacher = threading.Thread(target=train, args=(30, 1))
        teacher.start()
        teacher.join()
        train(30, 2)
    if args.only_threads:
        workers = [threading.Thread(target=train, args=(20, i)) for i in range(3)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()


if __name__ == "__main__":
    main()
