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
    p_idx, e_idx = scores.incidence
    hits = torch.zeros(A, len(q1), len(q2), dtype=torch.int32, device=device)
    hits.index_add_(0, e_idx, path_ok[p_idx].to(torch.int32))
    return (hits > 0)[..., None] & (scores.evaluator[:, None, None, None] <= q3[None, None, None, :])


def _concat(scores: Sequence[QuestionScores]) -> tuple[Tensor, ...]:
    """The questions' scores as one graph: global entity ids, and each entity's question."""
    device = scores[0].expand.device
    ent_off = torch.tensor([0] + [s.num_entities for s in scores], device=device).cumsum(0)
    path_off = torch.tensor([0] + [len(s.paths) for s in scores], device=device).cumsum(0)
    expand = torch.cat([s.expand for s in scores])
    path_score = torch.cat([s.path_score for s in scores])
    incidence = torch.cat(
        [s.incidence + torch.stack([path_off[n], ent_off[n]])[:, None] for n, s in enumerate(scores)], dim=1
    )
    evaluator = torch.cat([s.evaluator for s in scores])
    gold = torch.cat([s.gold for s in scores])
    owner = torch.repeat_interleave(torch.arange(len(scores), device=device), ent_off[1:] - ent_off[:-1])
    return expand, path_score, incidence, evaluator, gold, owner


def grid_outcomes(
    scores: Sequence[QuestionScores],
    q1: Tensor,
    q2: Tensor,
    q3: Tensor,
    coverage: Coverage = "any",
    chunk_size: int = 256,
) -> tuple[Tensor, Tensor]:
    """Per configuration and question: ``covered`` (bool) and set ``size`` (long), each ``(n1 * n2 * n3, n)``.

    Configuration ``(i, j, k)`` is row ``(i * n2 + j) * n3 + k``. With ``coverage="any"`` a set covers when it holds
    a gold answer; with ``"all"`` when it holds every gold answer of the question. A question without gold answers
    is never covered. Questions are processed ``chunk_size`` at a time, each chunk in one vectorised pass.
    """
    n1, n2, n3 = len(q1), len(q2), len(q3)
    covered = torch.zeros(n1 * n2 * n3, len(scores), dtype=torch.bool, device=q1.device)
    sizes = torch.zeros(n1 * n2 * n3, len(scores), dtype=torch.long, device=q1.device)
    for lo in range(0, len(scores), chunk_size):
        chunk = scores[lo : lo + chunk_size]
        expand, path_score, incidence, evaluator, gold, owner = _concat(chunk)
        path_ok = (expand[:, None, None] <= q1[None, :, None]) & (path_score[:, None, None] <= q2[None, None, :])
        hits = torch.zeros(len(evaluator), n1, n2, dtype=torch.int32, device=evaluator.device)
        hits.index_add_(0, incidence[1], path_ok[incidence[0]].to(torch.int32))
        member = ((hits > 0)[..., None] & (evaluator[:, None, None, None] <= q3)).reshape(len(evaluator), -1)
        size = torch.zeros(len(chunk), member.shape[1], dtype=torch.long, device=member.device)
        size.index_add_(0, owner, member.long())
        gold_in = torch.zeros_like(size).index_add_(0, owner[gold], member[gold].long())
        n_gold = torch.tensor([s.n_gold for s in chunk], device=member.device)
        pooled = torch.tensor([int(s.gold.sum()) for s in chunk], device=member.device)
        if coverage == "any":
            cov = gold_in > 0
        else:
            cov = (gold_in == n_gold[:, None]) & (pooled == n_gold)[:, None]
        cov &= (n_gold > 0)[:, None]
        sizes[:, lo : lo + len(chunk)] = size.T
        covered[:, lo : lo + len(chunk)] = cov.T
    return covered, sizes


def members_at(scores: QuestionScores, q1: float, q2: float, q3: float) -> Tensor:
    """``(A,)`` bool: the set at one configuration of thresholds."""
    t = [torch.tensor([q], dtype=torch.float32, device=scores.expand.device) for q in (q1, q2, q3)]
    return grid_membership(scores, *t)[:, 0, 0, 0]
