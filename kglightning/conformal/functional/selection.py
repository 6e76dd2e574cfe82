"""Which answers to keep: conformal selection with a guarantee on the hallucinated share of what is kept.

Every function here takes per-answer *hallucination scores* (higher = more likely hallucinated, e.g. a detector's
probability) and keeps answers with **low** scores. Calibration answers carry a label, ``null = True`` when the answer
is hallucinated. Four guarantees, each under the exchangeability it names:

* :func:`conformal_pvalues` + :func:`benjamini_hochberg` (Jin & Candes 2023, conformal selection): the expected share
  of hallucinated answers among the kept ones (the FDR) is at most ``alpha``, when calibration and test answers are
  i.i.d. (exchangeable) draws. The answers of one question are seldom independent of each other (one question's
  long list is mostly wrong, another's mostly right), and then this guarantee can fail; the other two rules take the
  question as their unit.
* :func:`best_per_question`, then the same two steps on one answer per question (each question's lowest score): the
  expected share of hallucinated answers among the kept ones is at most ``alpha`` when the *questions* are
  exchangeable, since each question is one unit; at most one answer is kept per question.
* :func:`kept_rate_pvalues` + :func:`~kglightning.conformal.functional.fixed_sequence` (Learn-Then-Test, Angelopoulos
  et al. 2021): with probability at least ``1 - delta`` over the calibration draw, the hallucinated share of the
  kept answers, each question weighing one, is at most ``alpha``; questions exchangeable.
* :func:`question_cutoff` (split conformal on one score per question): the probability that a test question keeps any
  hallucinated answer is at most ``alpha``; questions exchangeable (answers of a question may depend on each other).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from kglightning.conformal.functional._checks import as_float_tensor, check_level
from kglightning.conformal.functional.pvalues import betting_pvalue, hoeffding_bentkus_pvalue
from kglightning.conformal.functional.quantile import conformal_quantile


def _scores(x: Tensor | Sequence, name: str) -> Tensor:
    s = as_float_tensor(x, name, dtype=torch.float64).flatten()
    if torch.isinf(s).any():
        raise ValueError(f"{name} must be finite")
    return s


def _labels(null: Tensor | Sequence, n: int, name: str = "cal_null") -> Tensor:
    y = torch.as_tensor(null, device="cpu") if not isinstance(null, Tensor) else null
    if y.dtype != torch.bool:
        if not bool(((y == 0) | (y == 1)).all()):
            raise ValueError(f"{name} must be boolean (True = hallucinated)")
        y = y.bool()
    y = y.flatten()
    if y.numel() != n:
        raise ValueError(f"{name} has {y.numel()} entries for {n} calibration scores")
    return y


def _calibration(
    cal_scores: Tensor | Sequence, cal_null: Tensor | Sequence, cal_question: Tensor | Sequence
) -> tuple[Tensor, Tensor, Tensor]:
    """Validated calibration scores, labels and question ids, on the scores' device; never empty."""
    cs = _scores(cal_scores, "cal_scores")
    null = _labels(cal_null, cs.numel()).to(cs.device)
    q = torch.as_tensor(cal_question, device=cs.device).flatten()
    if q.numel() != cs.numel():
        raise ValueError(f"cal_question has {q.numel()} entries for {cs.numel()} calibration scores")
    if cs.numel() == 0:
        raise ValueError("calibration set is empty")
    return cs, null, q


def conformal_pvalues(
    cal_scores: Tensor | Sequence,
    cal_null: Tensor | Sequence,
    test_scores: Tensor | Sequence,
    generator: torch.Generator | None = None,
    u: Tensor | None = None,
) -> Tensor:
    """Conformal p-values for ``H0_j: test answer j is hallucinated`` (Jin & Candes 2023, the clipped score).

    ``p_j = (#{i null: s_i < s_j} + U_j (1 + #{i null: s_i = s_j})) / (n + 1)`` with ``n`` every calibration answer
    (hallucinated or not: a faithful calibration answer counts in ``n`` only) and ``U_j ~ Uniform(0, 1)`` breaking
    ties at random. A test answer whose score is below most hallucinated calibration scores gets a small p-value.
    Each is super-uniform for a hallucinated test answer exchangeable with the calibration answers, and the
    p-values are PRDS, so Benjamini-Hochberg over them controls the FDR.

    Args:
        cal_scores: ``(n,)`` hallucination scores of the calibration answers.
        cal_null: ``(n,)`` booleans, ``True`` = hallucinated.
        test_scores: ``(m,)`` hallucination scores of the test answers.
        generator: seeds the tie-breaking draws ``U`` (pass one for reproducible selections).
        u: the draws ``U`` themselves, ``(m,)`` in ``[0, 1)``, instead of ``generator`` (e.g. derived from each
            answer's identity, so that the p-values do not depend on the order of the test answers).

    Returns:
        ``(m,)`` float64 p-values in ``(0, 1]``.

    Example:
        >>> cal = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.2, 0.1])
        >>> null = torch.tensor([True, True, True, True, False, False])
        >>> p = conformal_pvalues(cal, null, torch.tensor([0.05, 0.75, 0.95]), torch.Generator().manual_seed(0))
        >>> (p * 7).floor()  # 0, 2 and 4 hallucinated calibration scores lie below each test score
        tensor([0., 2., 4.], dtype=torch.float64)
    """
    cs = _scores(cal_scores, "cal_scores")
    null = _labels(cal_null, cs.numel())
    ts = _scores(test_scores, "test_scores").to(cs.device)
    nulls = torch.sort(cs[null.to(cs.device)]).values
    below = torch.searchsorted(nulls, ts, right=False)
    ties = torch.searchsorted(nulls, ts, right=True) - below
    if u is None:
        u = torch.rand(ts.shape, generator=generator, dtype=torch.float64, device="cpu")
    elif u.shape != ts.shape or not bool(((u >= 0) & (u < 1)).all()):
        raise ValueError(f"u must hold one draw in [0, 1) per test score, shape {tuple(ts.shape)}")
    u = u.to(device=ts.device, dtype=torch.float64)
    return (below + u * (1 + ties)) / (cs.numel() + 1)


def benjamini_hochberg(pvalues: Tensor | Sequence, alpha: float) -> Tensor:
    """Benjamini-Hochberg step-up: reject every ``p_j <= alpha k* / m``, ``k*`` the largest ``k`` with ``p_(k) <= alpha k / m``.

    Args:
        pvalues: ``(m,)`` p-values.
        alpha: FDR level in ``(0, 1)``.

    Returns:
        ``(m,)`` booleans, ``True`` = rejected (here: the answer is kept).

    Example:
        >>> benjamini_hochberg(torch.tensor([0.01, 0.04, 0.03, 0.5]), 0.2)  # cut 0.15: p_(3) = 0.04 <= 0.15
        tensor([ True,  True,  True, False])
        >>> benjamini_hochberg(torch.tensor([0.3, 0.6]), 0.2).any()
        tensor(False)
    """
    check_level(alpha, "alpha")
    p = as_float_tensor(pvalues, "pvalues", dtype=torch.float64).flatten()
    m = p.numel()
    if m == 0:
        return torch.zeros(0, dtype=torch.bool, device=p.device)
    if not bool(((p >= 0) & (p <= 1)).all()):
        raise ValueError("pvalues must lie in [0, 1]")
    ranks = torch.arange(1, m + 1, dtype=torch.float64, device=p.device)
    ok = (torch.sort(p).values <= alpha * ranks / m).nonzero()
    if ok.numel() == 0:
        return torch.zeros(m, dtype=torch.bool, device=p.device)
    k = int(ok.max()) + 1
    return p <= alpha * k / m


def best_per_question(
    scores: Tensor | Sequence,
    question: Tensor | Sequence,
    u: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The index of each question's best answer: its lowest score, ties broken by the lowest draw ``u``.

    The draws must be independent of the ones the p-values use later (a pick that favoured low p-value draws would
    make the tied answers' p-values too small).

    Args:
        scores: ``(n,)`` hallucination scores.
        question: ``(n,)`` integer question ids.
        u: ``(n,)`` tie-break draws; ``None``: drawn uniformly from ``generator``.
        generator: seeds the draws when ``u`` is ``None``.

    Returns:
        ``(n_questions,)`` long indices into ``scores``, one per distinct question id, in increasing id order.

    Example:
        >>> best_per_question(torch.tensor([0.5, 0.2, 0.9, 0.2]), torch.tensor([7, 7, 3, 7]), torch.tensor([0., 0.9, 0., 0.1]))
        tensor([2, 3])
    """
    s = _scores(scores, "scores")
    q = torch.as_tensor(question, device=s.device).flatten()
    if q.numel() != s.numel():
        raise ValueError(f"question has {q.numel()} entries for {s.numel()} scores")
    if u is None:
        u = torch.rand(s.shape, generator=generator, dtype=torch.float64, device="cpu")
    elif u.shape != s.shape or not bool(((u >= 0) & (u < 1)).all()):
        raise ValueError(f"u must hold one draw in [0, 1) per score, shape {tuple(s.shape)}")
    order = torch.argsort(u.to(s.device), stable=True)
    order = order[torch.argsort(s[order], stable=True)]
    order = order[torch.argsort(q[order], stable=True)]  # by question, then score, then draw
    first = torch.ones(order.numel(), dtype=torch.bool, device=s.device)
    first[1:] = q[order][1:] != q[order][:-1]
    return order[first]


def _units_by_content(scores: Tensor, null: Tensor, question: Tensor) -> tuple[Tensor, int]:
    """Each answer's unit index, the units numbered in the order of their questions' content (the sorted
    ``(score, null)`` pairs of their answers) rather than of their ids: the same questions get the same numbers whatever ids
    they carry and whatever order they come in. Questions of equal content are interchangeable (their losses are
    equal), so their relative order does not matter. Returns ``(unit, number of units)``."""
    _, unit = torch.unique(question, return_inverse=True)
    n_q = int(unit.max()) + 1
    contents: list[list[tuple[float, bool]]] = [[] for _ in range(n_q)]
    for u, s, y in zip(unit.tolist(), scores.tolist(), null.tolist()):
        contents[u].append((s, y))
    keys = [tuple(sorted(c)) for c in contents]
    rank = torch.empty(n_q, dtype=torch.long, device="cpu")
    rank[torch.tensor(sorted(range(n_q), key=keys.__getitem__), dtype=torch.long, device="cpu")] = torch.arange(
        n_q, device="cpu"
    )
    return rank.to(unit.device)[unit], n_q


def kept_rate_pvalues(
    cal_scores: Tensor | Sequence,
    cal_null: Tensor | Sequence,
    cal_question: Tensor | Sequence,
    thresholds: Tensor | Sequence,
    alpha: float,
    pvalue: Literal["betting", "hoeffding_bentkus"] = "betting",
    delta: float = 0.1,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Learn-Then-Test p-values for ``H0_t: rate(t) > alpha``, one per threshold ``t`` (answers kept at ``score <= t``).

    ``rate(t) = E[H_q(t) / m_q] / E[N_q(t) / m_q]``: the hallucinated share of the kept answers when each question
    weighs one, spread over its ``m_q`` answers (``N_q(t)`` kept, ``H_q(t)`` of them hallucinated). The questions,
    not the answers, are the exchangeable unit, so the answers of one question may depend on each other. With
    ``L_q = alpha + (H_q - alpha N_q) / m_q``, a loss in ``[0, 1]``, ``rate(t) <= alpha`` iff ``E[L_q] <= alpha``,
    and ``p_t`` is a p-value for the mean of the calibration questions' losses: by betting
    (:func:`~kglightning.conformal.functional.betting_pvalue`, the default: the losses stay near ``alpha``, and it
    adapts to their small variance) or Hoeffding-Bentkus. A threshold that keeps few answers has losses near
    ``alpha`` and so little evidence: it is not certified by keeping almost nothing.

    Args:
        cal_scores: ``(n_answers,)`` calibration hallucination scores.
        cal_null: ``(n_answers,)`` booleans, ``True`` = hallucinated.
        cal_question: ``(n_answers,)`` integer question ids.
        thresholds: ``(K,)`` thresholds.
        alpha: the tolerated rate, in ``(0, 1)``.
        pvalue: ``"betting"`` or ``"hoeffding_bentkus"``.
        delta: the level the betting p-value's bets are tuned for (the p-value is valid for any).
        generator: seeds the order in which the betting p-value visits the questions: a seeded permutation of the
            questions sorted by their content (their answers' scores and labels), so that the p-values depend on the
            questions and the seed, not on their ids or on the order they come in.

    Returns:
        ``(pvalues, rate)``: ``(K,)`` float64 p-values and the calibration questions' ``(K,)`` weighted rate
        (``sum_q H_q / m_q`` over ``sum_q N_q / m_q``; 0 where nothing is kept).

    Example:
        >>> s = torch.tensor([0.1, 0.2, 0.9, 0.3, 0.8])
        >>> null = torch.tensor([False, False, True, False, True])
        >>> p, rate = kept_rate_pvalues(s, null, torch.tensor([0, 0, 0, 1, 1]), torch.tensor([0.5, 1.0]), 0.5)
        >>> rate  # at 1.0: (1/3 + 1/2) / (3/3 + 2/2)
        tensor([0.0000, 0.4167], dtype=torch.float64)
    """
    check_level(alpha, "alpha")
    cs, null, q = _calibration(cal_scores, cal_null, cal_question)
    if pvalue not in ("betting", "hoeffding_bentkus"):
        raise ValueError(f"pvalue must be 'betting' or 'hoeffding_bentkus', got {pvalue!r}")
    t = as_float_tensor(thresholds, "thresholds", dtype=torch.float64).flatten().to(cs.device)
    unit, n_q = _units_by_content(cs, null, q)
    # one visiting order for every threshold (and chunk): drawn once, before any loss is seen
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device="cpu")) if generator is not None else 0
    size = torch.zeros(n_q, dtype=torch.float64, device=cs.device).scatter_add_(0, unit, torch.ones_like(cs))
    weight = (1.0 / size)[unit]  # each question weighs one, spread over its answers
    p = torch.empty(t.shape, dtype=torch.float64, device=cs.device)
    rate = torch.empty_like(p)
    step = max(1, (1 << 22) // max(cs.numel(), 1))  # thresholds per chunk, about 4M answer cells each
    for a in range(0, t.numel(), step):
        kept = (cs[None, :] <= t[a : a + step, None]).double() * weight  # (chunk, n_answers)
        idx = unit[None, :].expand_as(kept)
        n_kept = torch.zeros(kept.shape[0], n_q, dtype=torch.float64, device=cs.device).scatter_add_(1, idx, kept)
        n_bad = torch.zeros_like(n_kept).scatter_add_(1, idx, kept * null.double())
        loss = (alpha + n_bad - alpha * n_kept).clamp(0.0, 1.0)  # exact arithmetic keeps it in [0, 1] already
        if pvalue == "betting":
            order = None if generator is None else torch.Generator().manual_seed(seed)
            p[a : a + step] = betting_pvalue(loss, float(alpha), delta, order)
        else:
            p[a : a + step] = hoeffding_bentkus_pvalue(loss, float(alpha))
        rate[a : a + step] = n_bad.sum(1) / n_kept.sum(1).clamp(min=torch.finfo(torch.float64).tiny)
    return p, rate


def question_cutoff(
    cal_scores: Tensor | Sequence, cal_null: Tensor | Sequence, cal_question: Tensor | Sequence, alpha: float
) -> float:
    """A cut ``c`` such that a test question keeps a hallucinated answer (score ``< c``) with probability ``<= alpha``.

    Each calibration question's statistic is the lowest score among its hallucinated answers (``+inf`` when it has
    none); ``c`` is their lower conformal quantile, the ``floor((n + 1) alpha)``-th smallest of the ``n`` statistics
    (``n`` = calibration questions), i.e. ``-conformal_quantile(-m, alpha)``. When ``(n + 1) alpha < 1`` no cut is
    valid and ``c = -inf``: nothing is kept. Keeping ``score < c`` (strictly) makes ties conservative.

    Args:
        cal_scores: ``(n_answers,)`` calibration hallucination scores.
        cal_null: ``(n_answers,)`` booleans, ``True`` = hallucinated.
        cal_question: ``(n_answers,)`` integer question ids; the exchangeable unit is the question.
        alpha: the tolerated probability that a question keeps a hallucinated answer, in ``(0, 1)``.

    Returns:
        The cut ``c`` (a float, possibly ``+-inf``).

    Example:
        >>> s = torch.tensor([0.9, 0.1, 0.8, 0.3, 0.7, 0.6, 0.2, 0.5, 0.4])
        >>> null = torch.tensor([True, False, True, False, True, True, False, True, True])
        >>> question_cutoff(s, null, torch.arange(9), 0.2)  # 9 questions, the 2nd smallest of the 6 null scores
        0.5
        >>> question_cutoff(s, null, torch.arange(9), 0.05)  # 10 * 0.05 < 1: keep nothing
        -inf
    """
    check_level(alpha, "alpha")
    cs, null, q = _calibration(cal_scores, cal_null, cal_question)
    ids, unit = torch.unique(q, return_inverse=True)
    lowest = torch.full((ids.numel(),), math.inf, dtype=torch.float64, device=cs.device)
    lowest = lowest.scatter_reduce(0, unit[null], cs[null], reduce="amin", include_self=True)
    return -float(conformal_quantile(-lowest, alpha))
