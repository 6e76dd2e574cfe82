"""``python _writer_ddp_run.py OUT N DEVICES [padded]``: predict N items with JsonlPredictionWriter on DEVICES CPU
processes; ``padded``: with a user's own ``DistributedSampler``, which repeats items to even out the ranks (Lightning's
own predict sampler does not)."""

from __future__ import annotations

import sys

import lightning as L
import torch

from kglightning.callbacks import JsonlPredictionWriter


class Items(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Echo(L.LightningModule):
    def __init__(self, n: int, padded: bool) -> None:
        super().__init__()
        self.n, self.padded = n, padded

    def predict_dataloader(self):
        sampler = None
        if self.padded:
            sampler = torch.utils.data.DistributedSampler(
                Items(self.n), self.trainer.world_size, self.trainer.global_rank, shuffle=False
            )
        return torch.utils.data.DataLoader(Items(self.n), batch_size=2, sampler=sampler)

    def predict_step(self, batch, batch_idx):
        return [{"id": int(i), "square": int(i) ** 2} for i in batch]


if __name__ == "__main__":
    out, n, devices, padded = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] == ["padded"]
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[JsonlPredictionWriter(out)],
        use_distributed_sampler=not padded,
    )  # fmt: skip
    trainer.predict(Echo(n, padded), return_predictions=False)
