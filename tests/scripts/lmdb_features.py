"""A plain training loop over precomputed features kept in LMDB, read one key per sample.

Written for the tests of ``pipeline-doctor profile`` in the style of the LMDB datasets
public training code uses (open the environment lazily in the process that reads, one
``txn.get`` in ``__getitem__``); nothing in it knows the instruments. It builds its own
store in a temporary folder first. ``--batched`` reads each batch with one transaction and
one ``getmulti`` in ``__getitems__`` instead, which DataLoader calls with the batch's
indices when a dataset has it.

Arguments: --steps N --batch-size B --num-workers W --keys K --dim D [--batched]
"""

import argparse
import tempfile

import lmdb
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


def key_of(index):
    return int(index).to_bytes(8, "big")


def build_store(path, keys, dim):
    rng = np.random.default_rng(0)
    features = rng.standard_normal((keys, dim), dtype=np.float32)
    env = lmdb.open(path, map_size=64 * 2**20)
    with env.begin(write=True) as txn:
        for index in range(keys):
            txn.put(key_of(index), features[index].tobytes())
    env.close()


class LmdbFeatures(Dataset):
    def __init__(self, path, keys):
        self.path = path
        self.keys = keys
        self.env = None  # opened in the process that reads: an environment must not cross a fork

    def _open(self):
        if self.env is None:
            self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False)
        return self.env

    def __len__(self):
        return self.keys

    def __getitem__(self, index):
        with self._open().begin() as txn:
            return txn.get(key_of(index))  # the row's bytes: collate_rows decodes the batch


class BatchedLmdbFeatures(LmdbFeatures):
    def __getitems__(self, indices):
        keys = [key_of(i) for i in indices]
        with self._open().begin() as txn:
            found = dict(txn.cursor().getmulti(sorted(keys)))
        return [found[k] for k in keys]


def collate_rows(rows):
    """A batch of float32 rows from their bytes: one decode a batch, not one a sample."""
    return torch.from_numpy(np.frombuffer(b"".join(rows), dtype=np.float32).reshape(len(rows), -1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--keys", type=int, default=20000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batched", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        build_store(tmp, args.keys, args.dim)
        kind = BatchedLmdbFeatures if args.batched else LmdbFeatures
        loader = DataLoader(
            kind(tmp, args.keys),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.num_workers,
            collate_fn=collate_rows,
            drop_last=True,  # every batch holds batch-size keys
        )
        model = torch.nn.Linear(args.dim, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        step = 0
        while step < args.steps:  # epoch after epoch
            for x in loader:
                y = x[:, :1] * 0.5
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                if step == args.steps:
                    break
        print(f"trained {step} steps, last loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
