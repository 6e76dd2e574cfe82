"""Which weights a module exports at the end of ``fit``: the best checkpoint's, or the last step's.

:func:`exported_weights` puts the chosen weights into the module for the length of a ``with`` block (an export),
then puts the last step's back, so the trainer's own state is unchanged. The best checkpoint is
``trainer.checkpoint_callback.best_model_path``, the best by the callback's monitored metric; a run without a
monitored checkpoint exports the last step's weights and says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info

__all__ = ["ExportChoice", "exported_weights"]

ExportChoice = Literal["best", "last"]


@contextmanager
def exported_weights(module: Any, which: ExportChoice = "best") -> Iterator[str]:
    """Within the block, ``module`` holds the weights to export; yields where they come from (a path or ``"last"``).

    Args:
        module: a LightningModule attached to a trainer.
        which: ``"best"``: the best checkpoint's weights (the entries the checkpoint holds, e.g. only the LoRA
            weights of a proxy); ``"last"``: the weights as they are.

    Raises:
        ValueError: ``which`` is neither, or the checkpoint holds a weight the module does not have.
    """
    if which not in ("best", "last"):
        raise ValueError(f"export must be 'best' or 'last', got {which!r}")
    trainer = getattr(module, "_trainer", None)
    callback = getattr(trainer, "checkpoint_callback", None) if trainer is not None else None
    monitored = getattr(callback, "monitor", None) is not None
    path = (getattr(callback, "best_model_path", "") or "") if monitored else ""
    if which == "last" or not path:
        if which == "best":
            rank_zero_info(
                f"{type(module).__name__}: no checkpoint chosen by a monitored metric; exporting the last step's "
                "weights"
            )
        yield "last"
        return
    saved: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    current = module.state_dict()  # tensors that share storage with the module's parameters and buffers
    unknown = sorted(set(saved) - set(current))
    if unknown:
        raise ValueError(f"{path} holds weights the module lacks, e.g. {unknown[:3]}")
    backup = {k: current[k].detach().clone() for k in saved}
    with torch.no_grad():
        for k, v in saved.items():
            current[k].copy_(v)
    try:
        yield path
    finally:
        with torch.no_grad():
            for k, v in backup.items():
                current[k].copy_(v)
