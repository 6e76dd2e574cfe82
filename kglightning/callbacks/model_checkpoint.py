"""Lightning's ``ModelCheckpoint``, except that a dry run (``fast_dev_run``) writes and deletes nothing.

Lightning skips its periodic saves under ``fast_dev_run``, but its ``on_train_end`` (lightning 2.6) still writes
``last.ckpt`` when ``save_last`` is set. With a fixed file name (``enable_version_counter: false``, as in the shipped
configs) a smoke test such as ``fit --config configs/detector.yaml --trainer.fast_dev_run true`` then replaced a real
resume point (and the calibration state its callbacks keep) with a one-step checkpoint.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint as _LightningModelCheckpoint


class ModelCheckpoint(_LightningModelCheckpoint):
    """:class:`lightning.pytorch.callbacks.ModelCheckpoint` that never touches the disk during a dry run.

    Every hook that may save, link or delete a checkpoint does nothing while :meth:`dry_run` is true (the trainer
    runs with ``fast_dev_run``), so the files of an earlier real run (``best.ckpt``, ``last.ckpt``) stay byte for
    byte as they were. Outside a dry run it behaves exactly as Lightning's class. Its ``state_key`` (and so its
    entry in a checkpoint's ``callbacks``) is the same as Lightning's, so runs saved with either resume with either.
    It adds no ``__init__``: it takes Lightning's arguments (``dirpath``, ``filename``, ``monitor``, ``mode``,
    ``save_last``, ``enable_version_counter``, ...) unchanged.

    Example:
        >>> import lightning as L
        >>> ModelCheckpoint.dry_run(L.Trainer(fast_dev_run=True, logger=False, enable_progress_bar=False))
        True
    """

    @staticmethod
    def dry_run(trainer: L.Trainer) -> bool:
        """Whether ``trainer`` is a smoke test whose checkpoints must not be written (``fast_dev_run``)."""
        return bool(trainer.fast_dev_run)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.dry_run(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.dry_run(trainer):
            super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.dry_run(trainer):
            super().on_validation_end(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.dry_run(trainer):
            super().on_train_end(trainer, pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not self.dry_run(trainer):
            super().on_exception(trainer, pl_module, exception)
