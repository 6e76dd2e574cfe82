"""UAG's prediction sets for a whole grid of thresholds ``(q1, q2, q3)`` at once, from precomputed scores.

For one question with scores :class:`~kglightning.conformal.uag.scores.QuestionScores`, entity ``a`` is in the set
at ``(q1[i], q2[j], q3[k])`` iff some path ``p`` reaching ``a`` has ``expand[p] <= q1[i]`` and
``path_score[p] <= q2[j]``, and ``evaluator[a] <= q3[k]``. :func:`grid_membership` builds that ``(A, n1, n2, n3)``
boolean tensor; :func:`grid_outcomes` reduces it to the per-configuration loss and set size that Learn-Then-Test
needs. :class:`~kglightning.conformal.uag.traversal.UAGTraversal` gives the same sets one configuration at a time
by actually walking the graph (the tests check that they agree).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from kglightning.conformal.uag.scores import Coverage, QuestionScores


def grid_membership(scores: QuestionScores, q1: Tensor, q2: Tensor, q3: Tensor) -> Tensor:
    """``(A, n1, n2, n3)`` bool: entity ``a`` is in the set of configuration ``(i, j, k)``.

    Example:
        >>> s = QuestionScores("q", ["x", "y"], [("r",), ("r", "s")], torch.tensor([float("-inf"), 0.5]),
        ...     torch.tensor([0.2, 0.1]), torch.tensor([[0, 1], [0, 1]]), torch.tensor([0.2, 0.1]),
        ...     torch.tensor([False, True]), 1)
        >>> m = grid_membership(s, torch.tensor([0.4, 0.6]), torch.tensor([0.15, 0.3]), torch.tensor([1.0]))
        >>> m[:, :, :, 0].int().tolist()  # y needs q1 >= 0.5 (2nd hop) and q2 >= 0.1; x needs q2 >= 0.2
        [[[0, 1], [0, 1]], [[0, 0], [1, 1]]]
    """
    A, device = scores.num_entities, scores.expand.device
    if A == 0:
        return torch.zeros(0, len(q1), len(q2), len(q3), dtype=torch.bool, device=device)
    path_ok = (scores.expand[:, None, None] <= q1[None, :, None]) & (
        scores.path_score[:, None, None] <= q2[None, None, :]
    )
    p_idx, e_idx = scores.incidence.long()
    hits = torch.zeros(A, len(q1), len(q2), dtype=torch.int32, device=device)
    hits.index_add_(0, e_idx, path_ok[p_idx].to(torch.int32))
    return (hits > 0)[..., None] & (scores.evaluator[:, None, None, None] <= q3[None, None, None, :])


def _question_outcome(s: QuestionScores, q1: Tensor, q2: Tensor, q3: Tensor) -> tuple[Tensor, Tensor]:
    """One question's set ``size`` and gold answers held (``gold_in``), each ``(n1 * n2 * n3,)`` long.

    The set at ``(i, j, k)`` is ``reached[a, i, j] & kept[a, k]``; its size is ``reachedᵀ @ kept`` summed over the
    entities, a matrix product, so the ``(A, n1 * n2 * n3)`` membership is never built (it took gigabytes at real
    candidate counts). Counts stay far below 2**24, exact in float32."""
    n1, n2, n3 = len(q1), len(q2), len(q3)
    if s.num_entities == 0:
        zero = torch.zeros(n1 * n2 * n3, dtype=torch.long, device=q1.device)
        return zero, zero
    path_ok = (s.expand[:, None, None] <= q1[None, :, None]) & (s.path_score[:, None, None] <= q2[None, None, :])
    p_idx, e_idx = s.incidence.long()
    hits = torch.zeros(s.num_entities, n1, n2, dtype=torch.int32, device=q1.device)
    hits.index_add_(0, e_idx, path_ok[p_idx].to(torch.int32))
    reached = (hits > 0).reshape(s.num_entities, n1 * n2).to(torch.float32)
    kept = (s.evaluator[:, None] <= q3[None, :]).to(torch.float32)
    size = (reached.T @ kept).reshape(-1).round().long()
    gold_in = (reached[s.gold].T @ kept[s.gold]).reshape(-1).round().long()
    return size, gold_in


def grid_outcomes(
    scores: Sequence[QuestionScores],
    q1: Tensor,
    q2: Tensor,
    q3: Tensor,
    coverage: Coverage = "any",
) -> tuple[Tensor, Tensor]:
    """Per configuration and question: ``covered`` (bool) and set ``size`` (long), each ``(n1 * n2 * n3, n)``.

    Configuration ``(i, j, k)`` is row ``(i * n2 + j) * n3 + k``. With ``coverage="any"`` a set covers when it holds
    a gold answer; with ``"all"`` when it holds every gold answer of the question. A question without gold answers
    is never covered. Memory grows with the largest question, not with the number of questions.
    """
    n1, n2, n3 = len(q1), len(q2), len(q3)
    covered = torch.zeros(n1 * n2 * n3, len(scores), dtype=torch.bool, device=q1.device)
    sizes = torch.zeros(n1 * n2 * n3, len(scores), dtype=torch.long, device=q1.device)
    for n, s in enumerate(scores):
        size, gold_in = _question_outcome(s, q1, q2, q3)
        n_gold = s.n_gold
        if n_gold == 0:
            cov = torch.zeros_like(size, dtype=torch.bool)
        elif coverage == "any":
            cov = gold_in > 0
        else:
            cov = (gold_in == n_gold) & (int(s.gold.sum()) == n_gold)
        sizes[:, n] = size
        covered[:, n] = cov
    return covered, sizes


def members_at(scores: QuestionScores, q1: float, q2: float, q3: float) -> Tensor:
    """``(A,)`` bool: the set at one configuration of thresholds."""
    t = [torch.tensor([q], dtype=torch.float32, device=scores.expand.device) for q in (q1, q2, q3)]
    return grid_membership(scores, *t)[:, 0, 0, 0]
