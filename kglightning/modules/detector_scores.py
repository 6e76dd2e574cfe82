"""The detector's scoring helpers: the epoch score buffer, answer keys, F1 thresholds, the loss, Random's draws."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F
from torchmetrics import Metric
from torchmetrics.functional.classification import binary_average_precision, binary_precision_recall_curve
from torchmetrics.utilities import dim_zero_cat

from kglightning.datamodules.detection_graphs import answer_owner
from kglightning.metrics.functional import unique_by_key

__all__ = [
    "ScoreBuffer",
    "answer_keys",
    "best_f1_threshold",
    "bootstrap_f1_threshold",
    "detection_loss",
    "item_uniform",
]


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


def best_f1_threshold(probs: Tensor, target: Tensor) -> tuple[float, float]:
    """The threshold ``t`` (predict hallucinated when ``p >= t``) with the highest F1, and that F1."""
    precision, recall, thresholds = binary_precision_recall_curve(probs, target)
    f1 = 2 * precision[:-1] * recall[:-1] / (precision[:-1] + recall[:-1]).clamp_min(1e-12)
    best = int(torch.argmax(f1))
    return float(thresholds[best]), float(f1[best])


def best_offset(
    grounded_flags: Tensor, grounded_target: Tensor, loose_logits: Tensor, loose_target: Tensor, threshold: float
) -> float:
    """The logit offset for the ungrounded answers' scores that maximises F1 over every answer.

    The grounded answers' flags are fixed (their threshold is tuned on them alone). An ungrounded answer is flagged
    when ``logit + offset >= logit(threshold)``; the cut ``c`` on the raw logits is searched over the values seen
    (and "flag none"), and the offset is ``logit(threshold) - c``. Ties keep the highest cut (fewest flags).

    Example:
        >>> flags, target = torch.tensor([1, 0, 0]), torch.tensor([1, 0, 1])
        >>> loose, loose_target = torch.tensor([-3.0, -1.0, 2.0]), torch.tensor([1, 1, 0])
        >>> round(best_offset(flags, target, loose, loose_target, threshold=0.5), 4)  # flag both -3 and -1: cut -3
        3.0
    """
    clamped = min(max(float(threshold), 1e-6), 1 - 1e-6)
    t = math.log(clamped / (1 - clamped))
    if loose_logits.numel() == 0:
        return 0.0
    g_flags, g_target = grounded_flags.bool().cpu(), grounded_target.bool().cpu()
    tp_g = float((g_flags & g_target).sum())
    fp_g = float((g_flags & ~g_target).sum())
    fn_g = float((~g_flags & g_target).sum())
    logits, target = loose_logits.detach().float().cpu(), loose_target.bool().cpu()
    cuts = torch.cat([torch.unique(logits), logits.max().reshape(1) + 1.0])  # the last: flag none
    flagged = logits[None, :] >= cuts[:, None]
    tp = tp_g + (flagged & target).sum(1).float()
    fp = fp_g + (flagged & ~target).sum(1).float()
    fn = fn_g + (~flagged & target).sum(1).float()
    f1 = 2 * tp / (2 * tp + fp + fn).clamp_min(1e-12)
    best = int(len(f1) - 1 - torch.argmax(f1.flip(0)))  # the highest cut among the best
    return t - float(cuts[best])


def _cut_counts(scores: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(cuts, tp, fp)``: each distinct score as a cut (flag ``score >= cut``), in descending order after a first
    "flag none" cut of ``+inf``, with the true and false positives each cut gives."""
    scores, target = scores.detach().double().cpu(), target.detach().bool().cpu()
    cuts = torch.unique(scores).flip(0)
    order = torch.argsort(scores, descending=True)
    s, t = scores[order], target[order]
    # the last position of each distinct score in the descending order: every answer with that score is flagged
    last = torch.searchsorted(-s, -cuts, right=True) - 1
    tp, fp = torch.cumsum(t.long(), 0)[last], torch.cumsum((~t).long(), 0)[last]
    zero = torch.zeros(1, dtype=torch.long)
    return (
        torch.cat([torch.tensor([math.inf], dtype=torch.float64), cuts]),
        torch.cat([zero, tp]),
        torch.cat([zero, fp]),
    )


def best_joint_thresholds(
    probs: Tensor, target: Tensor, loose_logits: Tensor, loose_target: Tensor
) -> tuple[float, float]:
    """The grounded answers' threshold and the ungrounded answers' logit offset that maximise F1 over every answer.

    Every pair of cuts (a grounded probability, an ungrounded logit) is tried at once: F1 is ``2T / (T + F + P)``
    with ``T`` and ``F`` the true and false positives the two cuts flag and ``P`` every hallucinated answer. The
    offset moves the ungrounded cut onto the threshold's logit. Ties keep the fewest flags.

    Example:
        >>> probs, target = torch.tensor([0.9, 0.6, 0.2]), torch.tensor([1, 0, 0])
        >>> thr, off = best_joint_thresholds(probs, target, torch.tensor([2.0, -1.0]), torch.tensor([1, 0]))
        >>> round(thr, 4), torch.sigmoid(torch.tensor([2.0, -1.0]) + off).ge(thr).tolist()  # flag 0.9 and 2.0
        (0.9, [True, False])
    """
    cg, tpg, fpg = _cut_counts(probs, target)
    cu, tpu, fpu = _cut_counts(loose_logits, loose_target)
    positives = int(target.bool().sum()) + int(loose_target.bool().sum())
    tp = tpg[:, None] + tpu[None, :]
    fp = fpg[:, None] + fpu[None, :]
    f1 = (2 * tp).double() / (tp + fp + positives).clamp_min(1).double()
    best = int(torch.argmax(f1.flatten()))  # the first maximum: fewest grounded flags, then fewest ungrounded
    i, j = divmod(best, f1.shape[1])
    # "flag no grounded answer": just under 1, so that a shifted ungrounded score can still reach the threshold
    thr = min(float(cg[i]), 1 - 1e-6) if i > 0 else 1 - 1e-6
    # the ungrounded cut halfway below its value, so that no validation logit sits on the boundary
    values = cu[1:]
    if j == 0:
        cut = float(values[0]) + 1.0 if values.numel() else 0.0
    else:
        lower = float(values[j]) if j < values.numel() else float(values[j - 1]) - 1.0
        cut = (float(values[j - 1]) + lower) / 2
    clamped = min(max(thr, 1e-6), 1 - 1e-6)
    return thr, math.log(clamped / (1 - clamped)) - cut


def best_ap_offset(
    probs: Tensor, target: Tensor, loose_logits: Tensor, loose_target: Tensor, span: float = 12.0, steps: int = 241
) -> float:
    """The logit offset for the ungrounded answers that maximises the average precision over every answer.

    The offset decides how the two populations interleave in one ranking; it is searched on a grid of ``steps``
    values over ``[-span, span]``, then once more on a grid ten times finer around the best. Ties keep the offset
    nearest 0.

    Example:
        >>> probs, target = torch.tensor([0.9, 0.2]), torch.tensor([1, 0])
        >>> off = best_ap_offset(probs, target, torch.tensor([-4.0]), torch.tensor([1]))
        >>> torch.sigmoid(torch.tensor(-4.0 + off)).item() > 0.2  # the hallucinated ungrounded answer above the faithful
        True
    """
    if loose_logits.numel() == 0:
        return 0.0
    g = torch.logit(probs.detach().double().cpu().clamp(1e-12, 1 - 1e-12))
    u = loose_logits.detach().double().cpu()
    y = torch.cat([target, loose_target]).long().cpu()

    def best_of(offsets: Tensor) -> float:
        aps = torch.stack([binary_average_precision(torch.cat([g, u + o]), y) for o in offsets])
        top = aps.max()
        ties = offsets[torch.isclose(aps, top, rtol=0, atol=1e-12)]
        return float(ties[ties.abs().argmin()])

    coarse = best_of(torch.linspace(-span, span, steps, dtype=torch.float64))
    step = 2 * span / (steps - 1)
    return best_of(torch.linspace(coarse - step, coarse + step, 21, dtype=torch.float64))


def bootstrap_f1_threshold(probs: Tensor, target: Tensor, resamples: int, seed: int = 0) -> float:
    """The median of the best-F1 thresholds of ``resamples`` bootstrap resamples of ``(probs, target)``.

    On a small validation set the best-F1 threshold jumps with every answer node that moves; the median over seeded
    bootstrap resamples (drawn with replacement, same size; resamples without a positive are skipped) moves much
    less. Falls back to :func:`best_f1_threshold` when no resample has a positive.

    Example:
        >>> probs, target = torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])
        >>> bootstrap_f1_threshold(probs, target, 50) == bootstrap_f1_threshold(probs, target, 50)  # seeded
        True
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    gen = torch.Generator().manual_seed(seed)
    probs, target = probs.detach().float().cpu(), target.detach().long().cpu()
    picks = torch.randint(len(probs), (resamples, len(probs)), generator=gen, device="cpu")
    found = [best_f1_threshold(probs[idx], target[idx])[0] for idx in picks if bool(target[idx].any())]
    if not found:
        return best_f1_threshold(probs, target)[0]
    return float(torch.tensor(found, device="cpu").median())


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
