"""ModelCheckpoint: a dry run (``fast_dev_run``) never writes, so it cannot replace a real ``last.ckpt``."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from kglightning.callbacks import ModelCheckpoint


class _Model(BoringModel):
    """BoringModel that logs the monitored ``val/loss`` (the shipped configs monitor a ``val/...`` metric)."""

    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.log("val/loss", loss)
        return loss


def _trainer(tmp_path, checkpoint: ModelCheckpoint, **kwargs) -> L.Trainer:
    return L.Trainer(
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        accelerator="cpu",
        callbacks=[checkpoint],
        limit_train_batches=2,
        limit_val_batches=2,
        **kwargs,
    )


def _checkpoint(tmp_path, save_last: bool | str = True) -> ModelCheckpoint:
    return ModelCheckpoint(
        dirpath=tmp_path / "ckpt",
        filename="best",
        monitor="val/loss",
        save_last=save_last,
        enable_version_counter=False,
    )


@pytest.mark.parametrize("save_last", [True, "link"])
def test_fast_dev_run_leaves_existing_checkpoints_untouched(tmp_path, save_last):
    _trainer(tmp_path, _checkpoint(tmp_path, save_last), max_epochs=2).fit(_Model())
    files = sorted((tmp_path / "ckpt").iterdir())
    assert [f.name for f in files] == ["best.ckpt", "last.ckpt"]
    before = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in files}
    assert torch.load(tmp_path / "ckpt/last.ckpt", weights_only=False)["global_step"] == 4

    _trainer(tmp_path, _checkpoint(tmp_path, save_last), fast_dev_run=True).fit(_Model())
    after = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in sorted((tmp_path / "ckpt").iterdir())}
    assert after == before


def test_fast_dev_run_into_an_empty_folder_writes_nothing(tmp_path):
    _trainer(tmp_path, _checkpoint(tmp_path), fast_dev_run=True).fit(_Model())
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


def test_a_real_run_saves_like_lightnings_checkpoint(tmp_path):
    checkpoint = _checkpoint(tmp_path)
    assert isinstance(checkpoint, LightningModelCheckpoint)
    assert checkpoint.state_key == LightningModelCheckpoint(**_kwargs(tmp_path)).state_key  # old checkpoints resume
    _trainer(tmp_path, checkpoint, max_epochs=1).fit(_Model())
    assert checkpoint.best_model_path.endswith("best.ckpt") and checkpoint.last_model_path.endswith("last.ckpt")
    assert torch.load(checkpoint.last_model_path, weights_only=False)["global_step"] == 2


def _kwargs(tmp_path) -> dict:
    return dict(dirpath=tmp_path / "ckpt", filename="best", monitor="val/loss", save_last=True)
