"""Beta-Bernoulli confidence of KG evidence (DoublyCal Eq. 4).

Grounding an evidence ``z`` in the KG gives a candidate set ``[[z]]``; a candidate drawn uniformly from it is
correct with probability ``p``. With a ``Beta(alpha, beta)`` prior on ``p``, the posterior mean after observing
``hits = |[[z]] ∩ A|`` correct candidates out of ``grounded = |[[z]]|`` is::

    p(A | z) = (alpha + hits) / (alpha + beta + grounded)

The default is the Jeffreys prior ``alpha = beta = 0.5`` used by the paper. An evidence that grounds to nothing
gets the prior mean ``alpha / (alpha + beta)``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

JEFFREYS_ALPHA = 0.5
JEFFREYS_BETA = 0.5


def _check_prior(alpha: float, beta: float) -> None:
    if not (alpha > 0 and beta > 0):
        raise ValueError(f"alpha and beta must be > 0, got alpha={alpha!r}, beta={beta!r}")


def beta_bernoulli_confidence(
    hits: int, grounded: int, alpha: float = JEFFREYS_ALPHA, beta: float = JEFFREYS_BETA
) -> float:
    """Posterior mean ``(alpha + hits) / (alpha + beta + grounded)`` of the evidence's precision.

    Args:
        hits: number of grounded candidates that are gold answers, ``0 <= hits <= grounded``.
        grounded: number of grounded candidates.
        alpha: prior pseudo-count of correct candidates (> 0).
        beta: prior pseudo-count of wrong candidates (> 0).

    Raises:
        ValueError: a non-positive prior, or counts with ``hits > grounded`` or negative counts.

    Example:
        >>> beta_bernoulli_confidence(1, 2), beta_bernoulli_confidence(1, 1), beta_bernoulli_confidence(0, 0)
        (0.5, 0.75, 0.5)
    """
    _check_prior(alpha, beta)
    if not 0 <= hits <= grounded:
        raise ValueError(f"need 0 <= hits <= grounded, got hits={hits}, grounded={grounded}")
    return (alpha + hits) / (alpha + beta + grounded)


def beta_bernoulli_confidences(
    hits: np.ndarray, grounded: np.ndarray, alpha: float = JEFFREYS_ALPHA, beta: float = JEFFREYS_BETA
) -> np.ndarray:
    """Vectorized :func:`beta_bernoulli_confidence` over arrays of counts (no range checks on the counts).

    Args:
        hits: ``(n,)`` correct-candidate counts.
        grounded: ``(n,)`` grounded-candidate counts.
        alpha: prior pseudo-count of correct candidates (> 0).
        beta: prior pseudo-count of wrong candidates (> 0).

    Returns:
        ``(n,)`` float64 confidences.

    Example:
        >>> beta_bernoulli_confidences(np.array([1, 1, 3]), np.array([2, 1, 9])).tolist()
        [0.5, 0.75, 0.35]
    """
    _check_prior(alpha, beta)
    return (alpha + np.asarray(hits, dtype=np.float64)) / (alpha + beta + np.asarray(grounded, dtype=np.float64))


def set_confidence(
    grounded: Iterable[str], answers: Iterable[str], alpha: float = JEFFREYS_ALPHA, beta: float = JEFFREYS_BETA
) -> float:
    """Confidence of a grounded candidate set against a gold answer set (both as names).

    Args:
        grounded: the candidates ``[[z]]`` (duplicates count once).
        answers: the gold answers ``A``.
        alpha: prior pseudo-count of correct candidates (> 0).
        beta: prior pseudo-count of wrong candidates (> 0).

    Example:
        >>> set_confidence({"Spike", "Belle"}, {"Spike"}), set_confidence({"Spike"}, {"Spike"})
        (0.5, 0.75)
    """
    cands = set(grounded)
    return beta_bernoulli_confidence(len(cands & set(answers)), len(cands), alpha, beta)
