"""exported_weights: the best checkpoint's weights inside the block, the last step's back after it."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from kglightning.modules.export import exported_weights


class _Linear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("epoch_score", float(self.current_epoch))  # the first epoch is "best" (mode min)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def _fit(tmp_path, monitor: str | None):
    L.seed_everything(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), batch_size=4)
    module = _Linear()
    ckpt = ModelCheckpoint(dirpath=tmp_path, monitor=monitor, mode="min")
    trainer = L.Trainer(max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", callbacks=[ckpt], default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(module, data, data)
    return module, ckpt


def test_best_weights_inside_the_block_and_last_after(tmp_path):
    module, ckpt = _fit(tmp_path, "epoch_score")
    last = module.layer.weight.detach().clone()
    best = torch.load(ckpt.best_model_path, weights_only=False)["state_dict"]["layer.weight"]
    assert "epoch=0" in ckpt.best_model_path and not torch.equal(best, last)
    with exported_weights(module, "best") as source:
        assert source == ckpt.best_model_path and torch.equal(module.layer.weight, best)
    assert torch.equal(module.layer.weight, last)
    with exported_weights(module, "last") as source:
        assert source == "last" and torch.equal(module.layer.weight, last)
    with pytest.raises(ValueError, match="'best' or 'last'"), exported_weights(module, "first"):  # type: ignore[arg-type]
        pass


def test_without_a_monitor_the_last_step_is_exported(tmp_path):
    module, ckpt = _fit(tmp_path, None)
    last = module.layer.weight.detach().clone()
    with exported_weights(module, "best") as source:
        assert source == "last" and torch.equal(module.layer.weight, last)
