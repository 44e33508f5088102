"""A Lightning job that passes the profile wrapper's callback itself and accumulates gradients.

Written for the tests of ``pipeline-doctor profile`` (tests/probe/test_lightning.py). Each
training batch prints its loss, and each optimizer step its gradient norm before clipping,
as the script computes them, so the test has figures that do not come from the probe.
Under ``--strategy ddp`` (one CPU process) Lightning re-creates the training DataLoader with
a DistributedSampler; the validation loader is built inside Lightning's own
``val_dataloader`` hook.
Arguments: --epochs E --samples N --batch-size B --accumulate K --strategy S
"""

import argparse

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from probe.integrations.lightning import PipelineDoctorCallback


class Numbers(Dataset):
    def __init__(self, size: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, 32, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True) * 0.1

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        print(f"batch loss {loss.item():.9g}", flush=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def val_dataloader(self):
        return DataLoader(Numbers(16, seed=1), batch_size=8)

    def on_before_optimizer_step(self, optimizer):
        norms = [p.grad.norm() for p in self.parameters() if p.grad is not None]
        print(f"step grad_norm {torch.stack(norms).norm().item():.9g}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=56)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--accumulate", type=int, default=3)
    parser.add_argument("--strategy", default="auto")
    args = parser.parse_args()
    pl.seed_everything(0)
    loader = DataLoader(Numbers(args.samples, seed=0), batch_size=args.batch_size, shuffle=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=args.strategy,
        max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate,
        gradient_clip_val=0.5,
        num_sanity_val_steps=1,
        callbacks=[PipelineDoctorCallback()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), loader)


if __name__ == "__main__":
    main()
