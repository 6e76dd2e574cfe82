"""The detector's decision rule, tuned on validation: a threshold per population and the ungrounded answers' offset.

Answers that name a graph node (*grounded*) are scored by the graph model, the others (*ungrounded*) by the
ungrounded-answer scorer; the two live on different scales. The rule is:

* an ungrounded answer's logit gets ``offset`` before the sigmoid, so that one probability ranks every answer
  (the offset is chosen for the best average precision over every validation answer, :func:`best_ap_offset`);
* a grounded answer is flagged when ``p >= threshold``, an ungrounded one when its shifted ``p >= ungrounded
  threshold``; the two thresholds are chosen together for the best F1 over every validation answer
  (:func:`best_joint_thresholds`), or the grounded one alone first (:func:`tune_decision`'s ``"grounded"`` mode);
* or (``"calibrated"``) each population is Platt-scaled to calibrated probabilities, one threshold, half the best
  F1 over every validation answer, is taken on them (:func:`half_best_f1_threshold`), and each population's
  threshold is where its calibrated probability reaches it.

Every search is exact: it evaluates the flags that the stored float32 threshold gives on the float32 probabilities
(the comparison the test and predict steps make), over every threshold in ``[EDGE, 1 - EDGE]`` (logits within about
±16.6) that flags a different set; ties keep the fewest flags. The offset is chosen on the same float32
probabilities, so that an offset which would saturate them loses the ranking it destroys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torchmetrics.functional.classification import binary_average_precision

__all__ = [
    "EDGE",
    "Decision",
    "best_ap_offset",
    "best_f1_offset",
    "best_f1_threshold",
    "best_joint_thresholds",
    "bootstrap_f1_threshold",
    "clamp_threshold",
    "half_best_f1_threshold",
    "platt",
    "shifted_probs",
    "tune_decision",
]

#: thresholds are kept in ``[EDGE, 1 - EDGE]`` (``2**-24``: logits within about ±16.6, where float32's sigmoid still
#: tells them apart; past that it returns exactly 1.0, and no threshold in (0, 1] separates saturated answers), so a
#: stored threshold is a float32 number strictly between 0 and 1
EDGE = 2.0**-24


def clamp_threshold(threshold: float) -> float:
    """``threshold`` moved into ``[EDGE, 1 - EDGE]``, where float32 probabilities still order as their logits do."""
    return min(max(float(threshold), EDGE), 1 - EDGE)


def _cuts(probs: Tensor) -> Tensor:
    """Every float32 threshold in ``[EDGE, 1 - EDGE]`` that flags (``p >= t``) a different subset of ``probs``, in
    descending order, so that the first one flags the fewest: the clamped values of ``probs`` and ``1 - EDGE``."""
    p = probs.detach().float().cpu()
    lo = torch.tensor(EDGE, dtype=torch.float32, device="cpu")
    hi = torch.tensor(1 - EDGE, dtype=torch.float32, device="cpu")
    return torch.unique(torch.cat([p.clamp(lo, hi), hi[None]])).flip(0)


def _flag_counts(probs: Tensor, target: Tensor, cuts: Tensor) -> tuple[Tensor, Tensor]:
    """``(tp, fp)`` of flagging ``probs >= cut`` for each cut (int64)."""
    p, t = probs.detach().float().cpu(), target.detach().bool().cpu()
    pos, neg = torch.sort(p[t]).values, torch.sort(p[~t]).values
    tp = len(pos) - torch.searchsorted(pos, cuts, right=False)
    fp = len(neg) - torch.searchsorted(neg, cuts, right=False)
    return tp.long(), fp.long()


def _f1(tp: Tensor, fp: Tensor, positives: int) -> Tensor:
    return (2 * tp).double() / (tp + fp + positives).clamp_min(1).double()


def best_f1_threshold(probs: Tensor, target: Tensor) -> tuple[float, float]:
    """The threshold ``t`` in ``[EDGE, 1 - EDGE]`` (flag when ``p >= t``) with the highest F1, and that F1, as the
    stored threshold applies it; ties keep the fewest flags.

    Example:
        >>> t, f1 = best_f1_threshold(torch.tensor([0.9, 0.8, 0.3, 0.1]), torch.tensor([1, 1, 0, 1]))
        >>> round(t, 4), round(f1, 4)  # flagging all four (F1 0.857) beats flagging the top two (F1 0.8)
        (0.1, 0.8571)
        >>> best_f1_threshold(torch.tensor([1.0, 1.0, 0.2]), torch.tensor([1, 1, 0]))  # saturated: 1 - 2**-24
        (0.9999999403953552, 1.0)
    """
    cuts = _cuts(probs)
    tp, fp = _flag_counts(probs, target, cuts)
    f1 = _f1(tp, fp, int(target.bool().sum()))
    best = int(torch.argmax(f1))  # the first maximum: the highest threshold, the fewest flags
    return float(cuts[best]), float(f1[best])


def best_joint_thresholds(
    probs: Tensor, target: Tensor, loose_probs: Tensor, loose_target: Tensor, chunk: int = 1024
) -> tuple[float, float, float]:
    """The grounded and the ungrounded answers' thresholds that maximise F1 over every answer, and that F1.

    Every pair of cuts is tried: F1 is ``2T / (T + F + P)`` with ``T`` and ``F`` the true and false positives the two
    cuts flag and ``P`` every hallucinated answer, ``chunk`` grounded cuts at a time (memory ``chunk x ungrounded
    cuts``). Ties keep the fewest flags in all, then the fewest grounded flags.

    Example:
        >>> probs, target = torch.tensor([0.9, 0.6, 0.2]), torch.tensor([1, 0, 0])
        >>> tg, tu, f1 = best_joint_thresholds(probs, target, torch.tensor([0.7, 0.3]), torch.tensor([1, 0]))
        >>> round(tg, 4), round(tu, 4), f1  # flag 0.9 among the grounded and 0.7 among the ungrounded
        (0.9, 0.7, 1.0)
    """
    g_cuts, u_cuts = _cuts(probs), _cuts(loose_probs)
    tpg, fpg = _flag_counts(probs, target, g_cuts)
    tpu, fpu = _flag_counts(loose_probs, loose_target, u_cuts)
    positives = int(target.bool().sum()) + int(loose_target.bool().sum())
    best: tuple[float, int, int, int] = (-1.0, 0, 0, 0)  # (f1, -flags, i, j)
    for start in range(0, len(g_cuts), chunk):
        tp = tpg[start : start + chunk, None] + tpu[None, :]
        fp = fpg[start : start + chunk, None] + fpu[None, :]
        f1 = _f1(tp, fp, positives)
        top = float(f1.max())
        if top < best[0]:
            continue
        ties = (f1 == top).nonzero()
        flags = (tp + fp)[ties[:, 0], ties[:, 1]]
        k = int(torch.argmin(flags))  # the fewest flags; among those, the first: the fewest grounded ones
        cand = (top, -int(flags[k]), start + int(ties[k, 0]), int(ties[k, 1]))
        if (cand[0], cand[1]) > (best[0], best[1]):
            best = cand
    return float(g_cuts[best[2]]), float(u_cuts[best[3]]), best[0]


def best_f1_offset(
    grounded_flags: Tensor, grounded_target: Tensor, loose_logits: Tensor, loose_target: Tensor, threshold: float
) -> float:
    """The logit offset that maximises F1 over every answer when the ungrounded answers are flagged at a given
    ``threshold`` (``sigmoid(logit + offset) >= threshold``) and the grounded answers' flags are fixed.

    The cut on the raw logits is searched over the values seen and "flag none", and placed halfway to the next lower
    value; the offset moves it onto the threshold's logit. Ties keep the fewest flags. Exact but for float32's
    rounding: two answers whose shifted probabilities differ by less than float32 can tell apart near the threshold
    (about ``1e-7`` at 0.5, ``1e-4`` at 0.9999) may be flagged together.

    Example:
        >>> flags, target = torch.tensor([1, 0, 0]), torch.tensor([1, 0, 1])
        >>> loose, loose_target = torch.tensor([-3.0, -1.0, 2.0]), torch.tensor([1, 1, 0])
        >>> off = best_f1_offset(flags, target, loose, loose_target, threshold=0.5)
        >>> (loose + off).ge(0).tolist()  # higher logits flag first: all three (F1 0.75) beats -1 and 2 (0.57)
        [True, True, True]
    """
    if loose_logits.numel() == 0:
        return 0.0
    g_flags, g_target = grounded_flags.bool().cpu(), grounded_target.bool().cpu()
    raw, t = loose_logits.detach().double().cpu(), loose_target.detach().bool().cpu()
    values = torch.unique(raw).flip(0)  # descending; cut j flags the answers >= values[j - 1] (j = 0: none)
    tp = torch.cat([torch.zeros(1, dtype=torch.long, device="cpu"), (raw[None, :] >= values[:, None])[:, t].sum(1)])
    fp = torch.cat([torch.zeros(1, dtype=torch.long, device="cpu"), (raw[None, :] >= values[:, None])[:, ~t].sum(1)])
    tp, fp = tp + int((g_flags & g_target).sum()), fp + int((g_flags & ~g_target).sum())
    best = int(torch.argmax(_f1(tp, fp, int(g_target.sum()) + int(t.sum()))))  # the first maximum: fewest flags
    if best == 0:
        cut = float(values[0]) + 1.0
    else:
        lower = float(values[best]) if best < values.numel() else float(values[best - 1]) - 2.0
        cut = (float(values[best - 1]) + lower) / 2
    thr = clamp_threshold(threshold)
    return math.log(thr / (1 - thr)) - cut


def best_ap_offset(
    probs: Tensor, target: Tensor, loose_logits: Tensor, loose_target: Tensor, span: float = 12.0, steps: int = 241
) -> float:
    """The logit offset for the ungrounded answers that maximises the average precision over every answer.

    The offset decides how the two populations interleave in one ranking; it is searched on a grid of ``steps``
    values over ``[-span, span]``, then once more on a grid ten times finer around the best. Ties keep the offset
    nearest 0. Without ungrounded or without grounded answers the ranking does not depend on it: 0.

    Example:
        >>> probs, target = torch.tensor([0.9, 0.2]), torch.tensor([1, 0])
        >>> off = best_ap_offset(probs, target, torch.tensor([-4.0]), torch.tensor([1]))
        >>> torch.sigmoid(torch.tensor(-4.0 + off)).item() > 0.2  # the hallucinated ungrounded answer above the faithful
        True
    """
    if loose_logits.numel() == 0 or probs.numel() == 0:
        return 0.0
    g = probs.detach().float().cpu()
    y = torch.cat([target.long().cpu(), loose_target.long().cpu()])

    def best_of(offsets: Tensor) -> float:
        # the average precision of the float32 probabilities the forward pass gives at each offset
        aps = torch.stack(
            [binary_average_precision(torch.cat([g, shifted_probs(loose_logits.cpu(), float(o))]), y) for o in offsets]
        )
        top = aps.max()
        ties = offsets[torch.isclose(aps, top, rtol=0, atol=1e-12)]
        return float(ties[ties.abs().argmin()])

    coarse = best_of(torch.linspace(-span, span, steps, dtype=torch.float64, device="cpu"))
    step = 2 * span / (steps - 1)
    return best_of(torch.linspace(coarse - step, coarse + step, 21, dtype=torch.float64, device="cpu"))


@dataclass(frozen=True)
class Decision:
    """The detector's tuned rule: ungrounded answers' logits get ``offset``; a grounded answer is flagged when its
    probability is ``>= threshold``, an ungrounded one when its shifted probability is ``>= ungrounded_threshold``."""

    threshold: float
    ungrounded_threshold: float
    offset: float


def shifted_probs(loose_logits: Tensor, offset: float) -> Tensor:
    """The ungrounded answers' probabilities after the offset, computed as the detector's forward computes them
    (float32 logits plus a float32 offset, then the sigmoid)."""
    logits = loose_logits.detach().float()
    return torch.sigmoid(logits + torch.tensor(offset, dtype=torch.float32, device=logits.device))


def platt(logits: Tensor, target: Tensor) -> tuple[float, float]:
    """Platt scaling: ``(a, b)`` such that ``sigmoid(a * logit + b)`` fits ``target`` (maximum likelihood), with
    ``a = exp(u) > 0`` so that the map keeps the scores' order, shrunk towards the identity by a penalty
    ``((a - 1)^2 + 0.01 b^2) / n``, so that a small population keeps nearly its own scale and a one-class population
    a finite bias rather than a degenerate fit. (Scores ranked backwards get a slope near 0: their calibrated
    probability is then about their population's rate, whatever the score.)

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> y = (torch.rand(2000, generator=g) < 0.3).long()
        >>> a, b = platt(3.0 * (2.0 * y - 1.0) + torch.randn(2000, generator=g) * 3.0, y)  # over-confident logits
        >>> 0.2 < a < 0.9
        True
    """
    x, y = logits.detach().double().cpu(), target.detach().double().cpu()
    n = max(len(x), 1)
    w = torch.tensor([0.0, 0.0], dtype=torch.float64, device="cpu", requires_grad=True)  # (log a, b)
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=100, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        a = w[0].clamp(max=30.0).exp()
        fit = torch.nn.functional.binary_cross_entropy_with_logits(a * x + w[1], y, reduction="sum")
        loss = (fit + (a - 1) ** 2 + 1e-2 * w[1] ** 2) / n
        loss.backward()
        return loss

    if len(x):
        opt.step(closure)
    u, b = w.detach().tolist()
    return float(math.exp(min(u, 30.0))), float(b)


def half_best_f1_threshold(probs: Tensor, target: Tensor) -> float:
    """Half the best F1 over ``probs``, as a threshold (flag ``p >= t``) in ``[EDGE, 1 - EDGE]``.

    For calibrated probabilities the F1-optimal threshold is half the optimal F1 (Lipton, Elkan and Narayanaswamy,
    2014). The rule depends on the level of the best F1 rather than on where the maximum falls, so on a small
    validation set it moves much less than the best-F1 threshold, which chases the noise of a few answers.

    Example:
        >>> half_best_f1_threshold(torch.tensor([0.9, 0.8, 0.4, 0.3, 0.1]), torch.tensor([1, 1, 1, 0, 0]))
        0.5
    """
    best = best_f1_threshold(probs, target)[1]
    if best == 0:  # no hallucinated answer, or none flaggable: the fewest flags, as the other rules
        return float(torch.tensor(1 - EDGE, dtype=torch.float32, device="cpu"))
    return float(torch.tensor(clamp_threshold(best / 2), dtype=torch.float32, device="cpu"))


def tune_decision(
    logits: Tensor,
    target: Tensor,
    loose_logits: Tensor,
    loose_target: Tensor,
    threshold_for: str,
    current: Decision,
    tune_threshold: bool = True,
    tune_offset: bool = True,
    resamples: int = 0,
    seed: int = 0,
) -> Decision:
    """The detector's decision rule tuned on a validation epoch.

    ``logits``/``target``: the grounded answers' raw logits; ``loose_logits``/``loose_target``: the ungrounded
    answers'. The modes (``threshold_for``):

    * ``"grounded"``: the ungrounded logits get the offset that ranks every answer best (:func:`best_ap_offset`);
      the grounded threshold is the best-F1 one over the grounded answers (or the median over ``resamples`` bootstrap
      resamples), then the ungrounded one the best for F1 over every answer given it;
    * ``"all"``: the same offset; both thresholds together (:func:`best_joint_thresholds`);
    * ``"calibrated"``: the same offset; each population's logits are Platt-scaled (:func:`platt`) to calibrated
      probabilities, one threshold ``t``, half the best F1 over every answer's calibrated probability
      (:func:`half_best_f1_threshold`), is taken on them, and each population's threshold is the probability the
      detector reports where its calibrated probability reaches ``t``. It moves less with a small validation set
      than a searched threshold.

    A population with no answer keeps its threshold (and calibration); a quantity not tuned keeps its value in
    ``current``.

    Example:
        >>> d = tune_decision(torch.tensor([2.2, -0.8]), torch.tensor([1, 0]), torch.tensor([2.0, -3.0]),
        ...     torch.tensor([1, 0]), "all", Decision(0.5, 0.5, 0.0))
        >>> round(d.threshold, 3), d.ungrounded_threshold > torch.sigmoid(torch.tensor(-3.0 + d.offset)).item()
        (0.9, True)
    """
    if threshold_for == "calibrated":
        return _tune_calibrated(logits, target, loose_logits, loose_target, current, tune_threshold, tune_offset)
    probs = torch.sigmoid(logits.detach().float().cpu())
    offset = current.offset
    if not tune_threshold:  # the thresholds as given: the offset that best fits the ungrounded answers to theirs
        if tune_offset and loose_logits.numel():
            flags = probs >= torch.tensor(current.threshold, dtype=torch.float32, device="cpu")
            offset = best_f1_offset(flags, target, loose_logits, loose_target, current.ungrounded_threshold)
        return Decision(current.threshold, current.ungrounded_threshold, offset)
    if tune_offset:
        offset = best_ap_offset(probs, target, loose_logits, loose_target) if loose_logits.numel() else offset
    loose_probs = shifted_probs(loose_logits, offset)
    thr, loose_thr = current.threshold, current.ungrounded_threshold
    if threshold_for != "grounded" and probs.numel() and loose_probs.numel():
        thr, loose_thr, _ = best_joint_thresholds(probs, target, loose_probs, loose_target)
        return Decision(thr, loose_thr, offset)
    if probs.numel():
        thr = clamp_threshold(
            bootstrap_f1_threshold(probs, target, resamples, seed) if resamples else best_f1_threshold(probs, target)[0]
        )
    if loose_probs.numel():
        flags = probs >= torch.tensor(thr, dtype=torch.float32, device="cpu")
        t = target.detach().bool().cpu()
        cuts = _cuts(loose_probs)
        tp, fp = _flag_counts(loose_probs, loose_target, cuts)
        tp, fp = tp + int((flags & t).sum()), fp + int((flags & ~t).sum())
        f1 = _f1(tp, fp, int(t.sum()) + int(loose_target.bool().sum()))
        loose_thr = float(cuts[int(torch.argmax(f1))])  # the first maximum: the fewest flags
    return Decision(thr, loose_thr, offset)


def _tune_calibrated(
    logits: Tensor,
    target: Tensor,
    loose_logits: Tensor,
    loose_target: Tensor,
    current: Decision,
    tune_threshold: bool,
    tune_offset: bool,
) -> Decision:
    probs = torch.sigmoid(logits.detach().float().cpu())
    offset = current.offset
    if tune_offset and loose_logits.numel():
        offset = best_ap_offset(probs, target, loose_logits, loose_target)
    if not tune_threshold or not (logits.numel() or loose_logits.numel()):
        return Decision(current.threshold, current.ungrounded_threshold, offset)
    # each population's Platt scaling, then one threshold over every answer's calibrated probability
    fits = [platt(x, y) if x.numel() else (1.0, 0.0) for x, y in ((logits, target), (loose_logits, loose_target))]
    calibrated = torch.cat([torch.sigmoid(_platt_logits(x, fit)) for fit, x in zip(fits, (logits, loose_logits))])
    t = half_best_f1_threshold(calibrated.float(), torch.cat([target.long().cpu(), loose_target.long().cpu()]))
    # each population's threshold on the probabilities the detector reports (the grounded logits as they are, the
    # ungrounded ones shifted by the offset): where its calibrated probability reaches t, as float32 can store it
    cuts = [(math.log(t / (1 - t)) - b) / a for a, b in fits]
    thr = _representable(probs, torch.sigmoid(_platt_logits(logits, fits[0])) >= t, cuts[0])
    loose_thr = _representable(shifted_probs(loose_logits, offset), torch.sigmoid(_platt_logits(loose_logits, fits[1])) >= t,
                               cuts[1] + offset)  # fmt: skip
    keep = (current.threshold, current.ungrounded_threshold)
    return Decision(thr if logits.numel() else keep[0], loose_thr if loose_logits.numel() else keep[1], offset)


def _platt_logits(logits: Tensor, fit: tuple[float, float]) -> Tensor:
    """``a * logit + b`` in float64 on the CPU."""
    return fit[0] * logits.detach().double().cpu() + fit[1]


def _representable(probs: Tensor, wanted: Tensor, cut_logit: float) -> float:
    """The float32 threshold on ``probs`` (flag ``p >= thr``) that flags ``wanted`` (the answers whose logits reach
    ``cut_logit``): ``sigmoid(cut_logit)`` when it does, else, where float32 saturation or rounding merges answers
    across the cut, the achievable threshold that flags the set nearest to ``wanted`` (fewest flags on ties)."""
    p, wanted = probs.detach().float().cpu(), wanted.cpu()
    thr = float(torch.tensor(clamp_threshold(1 / (1 + math.exp(-max(min(cut_logit, 700.0), -700.0)))),
                             dtype=torch.float32, device="cpu"))  # fmt: skip
    if p.numel() == 0 or torch.equal(p >= thr, wanted):
        return thr
    cuts = _cuts(p)  # descending: fewest flags first
    tp, fp = _flag_counts(p, wanted, cuts)  # flagged and wanted, flagged and not wanted
    wrong = fp + (int(wanted.sum()) - tp)
    return float(cuts[int(torch.argmin(wrong))])


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
