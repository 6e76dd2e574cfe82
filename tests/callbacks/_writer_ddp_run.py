"""``python _writer_ddp_run.py OUT N DEVICES [padded|two]``: predict N items with JsonlPredictionWriter on DEVICES CPU
processes; ``padded``: with a user's own ``DistributedSampler``, which repeats items to even out the ranks (Lightning's
own predict sampler does not); ``two``: a second, iterable loader of 8 items sharded by rank."""

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


class Shard(torch.utils.data.IterableDataset):
    """Items 100.. of this rank's share (an iterable dataset: Lightning knows no indices for it)."""

    def __init__(self, n: int, rank: int, world: int) -> None:
        self.n, self.rank, self.world = n, rank, world

    def __iter__(self):
        return iter(range(100 + self.rank, 100 + self.n, self.world))


class Echo(L.LightningModule):
    def __init__(self, n: int, padded: bool, two_loaders: bool = False) -> None:
        super().__init__()
        self.n, self.padded, self.two_loaders = n, padded, two_loaders

    def predict_dataloader(self):
        sampler = None
        if self.padded:
            sampler = torch.utils.data.DistributedSampler(
                Items(self.n), self.trainer.world_size, self.trainer.global_rank, shuffle=False
            )
        loader = torch.utils.data.DataLoader(Items(self.n), batch_size=2, sampler=sampler)
        if not self.two_loaders:
            return loader
        shard = Shard(8, self.trainer.global_rank, self.trainer.world_size)
        return [loader, torch.utils.data.DataLoader(shard, batch_size=2)]

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return [{"id": int(i), "square": int(i) ** 2} for i in batch]


if __name__ == "__main__":
    out, n, devices, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), (sys.argv[4:] or [""])[0]
    padded = mode == "padded"
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[JsonlPredictionWriter(out)],
        use_distributed_sampler=not padded,
    )  # fmt: skip
    trainer.predict(Echo(n, padded, two_loaders=mode == "two"), return_predictions=False)
