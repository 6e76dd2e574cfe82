"""The detector's scoring helpers: the epoch score buffer, answer keys, the loss, Random's draws (its thresholds:
:mod:`~kglightning.modules.detector_thresholds`)."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from kglightning.datamodules.detection_graphs import answer_owner
from kglightning.metrics.functional import unique_by_key

__all__ = ["ScoreBuffer", "answer_keys", "detection_loss", "item_uniform", "labelled_answers"]


class ScoreBuffer(Metric):
    """Keeps every (probability, label, item key) triple of an epoch; DDP gathers them with ``cat``.

    ``compute`` keeps one entry per item key, in key order (:func:`~kglightning.metrics.functional.unique_by_key`):
    the repeats a distributed sampler pads the last shard with are dropped, so a threshold tuned on the result is
    the same on one process or many. Without keys every entry is kept.

    Example:
        >>> buf = ScoreBuffer()
        >>> buf.update(torch.tensor([0.9, 0.2]), torch.tensor([1, 0]), keys=torch.tensor([5, 2]))
        >>> buf.update(torch.tensor([0.9]), torch.tensor([1]), keys=torch.tensor([5]))  # a padded repeat
        >>> probs, target = buf.compute()
        >>> probs.dtype, [round(p, 6) for p in probs.tolist()], target.tolist()
        (torch.float32, [0.2, 0.9], [0, 1])
    """

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("probs", default=[], dist_reduce_fx="cat")
        self.add_state("target", default=[], dist_reduce_fx="cat")
        self.add_state("keys", default=[], dist_reduce_fx="cat")

    def update(self, probs: Tensor, target: Tensor, keys: Tensor | None = None) -> None:
        self.probs.append(probs.detach().float())
        self.target.append(target.detach().long())
        if keys is not None:
            self.keys.append(keys.detach().long())

    def compute(self) -> tuple[Tensor, Tensor]:
        probs = dim_zero_cat(self.probs)
        target = dim_zero_cat(self.target)
        keys = dim_zero_cat(self.keys) if len(self.keys) else None
        if keys is None:
            return probs, target
        if keys.numel() != probs.numel():
            raise ValueError(
                f"{keys.numel()} item keys for {probs.numel()} scores: give keys with every update or none"
            )
        keep = unique_by_key(keys)
        return probs[keep], target[keep]


def answer_keys(batch: Any) -> Tensor | None:
    """``(A,)`` a key per answer node that names it across processes: ``item_id`` of its graph (the graph's index in
    its split) times ``2**20`` plus its position among the graph's answer nodes; ``None`` without ``item_id``."""
    item = getattr(batch, "item_id", None)
    if item is None:
        return None
    owner = answer_owner(batch)
    counts = torch.bincount(owner, minlength=int(item.numel()))
    start = counts.cumsum(0) - counts
    position = torch.arange(owner.numel(), device=owner.device) - start[owner]
    return item.to(owner.device).long()[owner] * 2**20 + position


def labelled_answers(batch: Any) -> Tensor | None:
    """``(A,)`` whether each answer of a batch has a label: its question has a gold answer (the graph's
    ``labelled``); ``None`` when every answer has one (or the graphs predate the mark). An unlabelled answer's ``y``
    says nothing, so neither the loss nor a metric may read it."""
    labelled = getattr(batch, "labelled", None)
    if labelled is None or bool(labelled.all()):
        return None
    return labelled.to(torch.bool)[answer_owner(batch)]


def detection_loss(logits: Tensor, target: Tensor, pos_weight: float | None = None, gamma: float = 0.0) -> Tensor:
    """Mean (class-weighted, focal) binary cross-entropy of answer-node logits.

    Each term is ``w_y (1 - p_t)^gamma BCE``, with ``p_t`` the probability of the true class and ``w_1 = pos_weight``,
    ``w_0 = 1``; ``gamma = 0`` and ``pos_weight = None`` give plain BCE.

    Example:
        >>> logits, y = torch.tensor([2.0, -1.0]), torch.tensor([1.0, 0.0])
        >>> bool(torch.isclose(detection_loss(logits, y), F.binary_cross_entropy_with_logits(logits, y)))
        True
        >>> round(detection_loss(torch.tensor([0.0]), torch.tensor([1.0]), pos_weight=2.0, gamma=1.0).item(), 4)
        0.6931
    """
    if pos_weight is None and gamma == 0:
        return F.binary_cross_entropy_with_logits(logits, target)  # the fused mean: the paper's loss, bit for bit
    bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    if gamma > 0:
        p_true = torch.exp(-bce)
        bce = (1 - p_true).pow(gamma) * bce
    if pos_weight is not None:
        bce = bce * torch.where(target > 0.5, pos_weight, 1.0)
    return bce.mean()


def item_uniform(seed: int, qid: str, node: str) -> float:
    """A uniform number in ``[0, 1)`` fixed by ``(seed, question id, node)``, whatever process or batch sees it."""
    digest = hashlib.sha1(f"{seed}\x1f{qid}\x1f{node}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
