"""Learning-rate schedules whose length a config may leave to the run.

:class:`CosineAnnealingLR` is torch's, with ``T_max`` optional in a config: the CLI sets an unset ``T_max`` to
``trainer.max_epochs`` (:func:`kglightning.cli.default_t_max`) and keeps one that is set. Name torch's own class to
have ``T_max`` required.
"""

from __future__ import annotations

import torch

__all__ = ["CosineAnnealingLR"]


class CosineAnnealingLR(torch.optim.lr_scheduler.CosineAnnealingLR):
    """``torch.optim.lr_scheduler.CosineAnnealingLR`` (stepped per epoch) whose ``T_max`` may come from the run.

    Args:
        optimizer: the wrapped optimizer.
        T_max: epochs from the start to the minimum; ``None`` in a config: ``trainer.max_epochs`` (set by the CLI).
        eta_min: the minimum learning rate.
        last_epoch: the index of the last epoch (``-1``: start).

    Raises:
        ValueError: ``T_max`` is still unset when the schedule is built (outside the CLI, or no ``max_epochs``).
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, T_max: int | None = None, eta_min: float = 0.0, last_epoch: int = -1
    ) -> None:
        if T_max is None:
            raise ValueError("CosineAnnealingLR needs T_max: set it, or run through the CLI with trainer.max_epochs")
        super().__init__(optimizer, T_max=T_max, eta_min=eta_min, last_epoch=last_epoch)
