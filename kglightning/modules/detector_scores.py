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


#: thresholds are kept in ``[EDGE, 1 - EDGE]``: float32's sigmoid cannot tell logits apart past about 16.6 (it
#: returns exactly 1.0), so a threshold nearer 0 or 1 would decide differently from the logits it was tuned on
EDGE = 1e-4


def clamp_threshold(threshold: float) -> float:
    """``threshold`` moved into ``[EDGE, 1 - EDGE]``, where float32 probabilities still order as their logits do."""
    return min(max(float(threshold), EDGE), 1 - EDGE)


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _cut_counts(scores: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(values, tp, fp)``: the distinct scores in descending order, and the true and false positives of flagging
    ``score >= cut`` for each cut: "flag none" first (``tp[0] = fp[0] = 0``), then each distinct score in turn."""
    scores, target = scores.detach().double().cpu(), target.detach().bool().cpu()
    values = torch.unique(scores).flip(0)
    order = torch.argsort(scores, descending=True)
    s, t = scores[order], target[order]
    # the last position of each distinct score in the descending order: every answer with that score is flagged
    last = torch.searchsorted(-s, -values, right=True) - 1
    zero = torch.zeros(1, dtype=torch.long, device="cpu")
    tp, fp = torch.cumsum(t.long(), 0)[last], torch.cumsum((~t).long(), 0)[last]
    return values, torch.cat([zero, tp]), torch.cat([zero, fp])


def _midpoint(values: Tensor, j: int) -> float:
    """The logit cut of cut index ``j`` of :func:`_cut_counts` (0: flag none), halfway between the value it flags
    last and the next lower one, so that no tuned-on logit sits on the boundary."""
    if values.numel() == 0:
        return 0.0
    if j == 0:
        return float(values[0]) + 1.0
    lower = float(values[j]) if j < values.numel() else float(values[j - 1]) - 2.0
    return (float(values[j - 1]) + lower) / 2


def best_offset(
    grounded_flags: Tensor, grounded_target: Tensor, loose_logits: Tensor, loose_target: Tensor, threshold: float
) -> float:
    """The logit offset for the ungrounded answers' scores that maximises F1 over every answer.

    The grounded answers' flags are fixed (their threshold is tuned on them alone). An ungrounded answer is flagged
    when ``logit + offset >= logit(threshold)`` (``threshold`` as :func:`clamp_threshold` keeps it); the cut on the
    raw logits is searched over the values seen and "flag none", placed halfway to the next lower value, and the
    offset moves it onto the threshold's logit. Ties keep the fewest flags.

    Example:
        >>> flags, target = torch.tensor([1, 0, 0]), torch.tensor([1, 0, 1])
        >>> loose, loose_target = torch.tensor([-3.0, -1.0, 2.0]), torch.tensor([1, 1, 0])
        >>> off = best_offset(flags, target, loose, loose_target, threshold=0.5)
        >>> (loose + off).ge(0).tolist()  # higher logits flag first: all three (F1 0.75) beats -1 and 2 (0.57)
        [True, True, True]
    """
    if loose_logits.numel() == 0:
        return 0.0
    g_flags, g_target = grounded_flags.bool().cpu(), grounded_target.bool().cpu()
    values, tp, fp = _cut_counts(loose_logits, loose_target)
    tp = tp + int((g_flags & g_target).sum())
    fp = fp + int((g_flags & ~g_target).sum())
    positives = int(g_target.sum()) + int(loose_target.bool().sum())
    f1 = (2 * tp).double() / (tp + fp + positives).clamp_min(1).double()
    best = int(torch.argmax(f1))  # the first maximum: the fewest flags
    return _logit(clamp_threshold(threshold)) - _midpoint(values, best)


def best_joint_thresholds(
    probs: Tensor, target: Tensor, loose_logits: Tensor, loose_target: Tensor, chunk: int = 1024
) -> tuple[float, float]:
    """The grounded answers' threshold and the ungrounded answers' logit offset that maximise F1 over every answer.

    Every pair of cuts (a grounded probability, an ungrounded logit) is tried: F1 is ``2T / (T + F + P)`` with
    ``T`` and ``F`` the true and false positives the two cuts flag and ``P`` every hallucinated answer, computed
    ``chunk`` grounded cuts at a time (memory ``chunk x ungrounded cuts``). The threshold stays in
    ``[EDGE, 1 - EDGE]`` (:func:`clamp_threshold`; "flag no grounded answer" becomes ``1 - EDGE``), the ungrounded
    cut lies halfway to the next lower logit, and the offset moves it onto the threshold's logit. Ties keep the
    fewest flags.

    Example:
        >>> probs, target = torch.tensor([0.9, 0.6, 0.2]), torch.tensor([1, 0, 0])
        >>> thr, off = best_joint_thresholds(probs, target, torch.tensor([2.0, -1.0]), torch.tensor([1, 0]))
        >>> round(thr, 4), torch.sigmoid(torch.tensor([2.0, -1.0]) + off).ge(thr).tolist()  # flag 0.9 and 2.0
        (0.9, [True, False])
    """
    g_values, tpg, fpg = _cut_counts(probs, target)
    u_values, tpu, fpu = _cut_counts(loose_logits, loose_target)
    positives = int(target.bool().sum()) + int(loose_target.bool().sum())
    best_f1, best_i, best_j = -1.0, 0, 0
    for start in range(0, len(tpg), chunk):
        tp = tpg[start : start + chunk, None] + tpu[None, :]
        fp = fpg[start : start + chunk, None] + fpu[None, :]
        f1 = ((2 * tp).double() / (tp + fp + positives).clamp_min(1).double()).flatten()
        k = int(torch.argmax(f1))  # the chunk's first maximum: fewest grounded, then fewest ungrounded flags
        if float(f1[k]) > best_f1:
            best_f1, (best_i, best_j) = float(f1[k]), divmod(k, len(tpu))
            best_i += start
    thr = clamp_threshold(float(g_values[best_i - 1]) if best_i > 0 else 1.0)
    return thr, _logit(thr) - _midpoint(u_values, best_j)


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


def tune_decision(
    probs: Tensor,
    target: Tensor,
    loose_logits: Tensor,
    loose_target: Tensor,
    threshold_for: str,
    threshold: float,
    offset: float,
    tune_threshold: bool = True,
    tune_offset: bool = True,
    resamples: int = 0,
    seed: int = 0,
) -> tuple[float, float]:
    """The detector's decision rule tuned on a validation epoch: ``(threshold, ungrounded offset)``.

    ``probs``/``target``: the grounded answers; ``loose_logits``/``loose_target``: the ungrounded answers' raw logits.
    ``threshold_for`` is the detector's argument of that name; a quantity not tuned keeps its value as given.
    """
    if threshold_for != "grounded" and tune_threshold and tune_offset and loose_logits.numel():
        if threshold_for == "all":
            return best_joint_thresholds(probs, target, loose_logits, loose_target)
        # "all_ap": the offset for the best ranking, then the best-F1 threshold of that one score
        offset = best_ap_offset(probs, target, loose_logits, loose_target)
        merged = torch.cat([probs, torch.sigmoid(loose_logits.to(probs) + offset)])
        return clamp_threshold(best_f1_threshold(merged, torch.cat([target, loose_target.to(target)]))[0]), offset
    if tune_threshold:
        best = (
            bootstrap_f1_threshold(probs, target, resamples, seed) if resamples else best_f1_threshold(probs, target)[0]
        )
        threshold = clamp_threshold(best)
    if tune_offset and loose_logits.numel():
        offset = best_offset(probs >= threshold, target, loose_logits, loose_target, threshold)
    return threshold, offset


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
