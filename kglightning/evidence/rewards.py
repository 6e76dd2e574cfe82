"""DoublyCal's calibration-aware reward for the evidence proxy's RL stage (DoublyCal §4.2 Eq. 5, App. B.2).

For a generated evidence ``ẑ`` with stated confidence ``ĉ`` and each gold evidence ``z`` of the question:

* match score ``m(ẑ, z) ∈ [0, 1]``: a weighted mean of the Jaccard similarity of the two item sets and the
  normalized Levenshtein similarity of the two item sequences (order-sensitive). The items are the relations in
  order, then the constraint ``r_c=c`` when there is one. The paper says only that ``m`` "combines" the two; the
  equal weighting is this toolkit's choice (``jaccard_weight``);
* ``R_inf = F1(z) · m``, where ``F1(z)`` is the F1 of ``z``'s grounded answers against the gold answers;
* ``R_cal = max(0, 1 − ξ·|ĉ − c|)`` with target ``c = p(A|z) · m`` (``p(A|z)`` is ``z``'s Bayesian confidence);
* ``R = λ·R_inf + (1 − λ)·R_cal``, maximised over the gold evidence, and finally
  ``R' = 3·σ(ξ'·(R − 0.5)) − 1 ∈ (−1, 2)``; an output without a well-formed ``<PATH confidence=...>`` block gets
  ``invalid_reward`` (−3).

:class:`EvidenceReward` has the TRL reward signature ``reward(completions, **kwargs) -> list[float]``: the dataset
column ``gold_evidence`` reaches it as one list of :func:`gold_target` dicts per completion. The defaults are the
paper's (``λ = 0.85``, ``ξ = 2``, ``ξ' = 2``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rapidfuzz.distance import Levenshtein

from kglightning.evidence.format import parse_evidence
from kglightning.evidence.schema import Evidence

__all__ = ["EvidenceReward", "evidence_items", "gold_target", "match_score", "squash"]


def evidence_items(relations: Sequence[str], constraint: Sequence[str] | None = None) -> list[str]:
    """The items compared by :func:`match_score`: the relations in order, then ``"r_c=c"`` for a constraint.

    Example:
        >>> evidence_items(["sibling_of"], ("gender", "Male"))
        ['sibling_of', 'gender=Male']
    """
    items = [str(r) for r in relations]
    if constraint is not None:
        items.append(f"{constraint[0]}={constraint[1]}")
    return items


def match_score(generated: Sequence[str], gold: Sequence[str], jaccard_weight: float = 0.5) -> float:
    """``m(ẑ, z)``: ``w·Jaccard(sets) + (1 − w)·(1 − Levenshtein distance / longer length)`` over item sequences.

    Example:
        >>> match_score(["a", "b"], ["a", "b"])
        1.0
        >>> match_score(["b", "a"], ["a", "b"])  # same set, wrong order: Jaccard 1, Levenshtein 0
        0.5
        >>> match_score(["a"], ["a", "b"])  # Jaccard 1/2, Levenshtein 1 - 1/2
        0.5
        >>> match_score([], ["a"])
        0.0
    """
    if not 0.0 <= jaccard_weight <= 1.0:
        raise ValueError(f"jaccard_weight must be in [0, 1], got {jaccard_weight}")
    if not generated and not gold:
        return 1.0
    a, b = set(generated), set(gold)
    jaccard = len(a & b) / len(a | b)
    order = Levenshtein.normalized_similarity(list(generated), list(gold))
    return jaccard_weight * jaccard + (1.0 - jaccard_weight) * order


def gold_target(evidence: Evidence, num_answers: int) -> dict[str, Any]:
    """One gold evidence as the reward reads it: its items, Bayesian confidence and answer F1.

    Args:
        evidence: a mined evidence with ``confidence``, ``grounded`` and ``hits`` (:class:`EvidenceBuilder`).
        num_answers: the question's number of gold answer entities.

    Example:
        >>> z = Evidence("Snoopy", ("sibling_of",), ("gender", "Male"), confidence=0.75, grounded=1, hits=1)
        >>> gold_target(z, num_answers=2)
        {'items': ['sibling_of', 'gender=Male'], 'confidence': 0.75, 'f1': 0.6666666666666666}
    """
    if evidence.confidence is None or evidence.grounded is None or evidence.hits is None:
        raise ValueError(f"gold evidence needs confidence, grounded and hits (a mined evidence), got {evidence}")
    precision = evidence.hits / evidence.grounded if evidence.grounded else 0.0
    recall = evidence.hits / num_answers if num_answers else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "items": evidence_items(evidence.relations, evidence.constraint),
        "confidence": evidence.confidence,
        "f1": f1,
    }


def squash(reward: float, scale: float = 2.0) -> float:
    """``3·σ(scale·(R − 0.5)) − 1``: maps ``[0, 1]`` smoothly into ``(−1, 2)``.

    Example:
        >>> squash(0.5)
        0.5
        >>> round(squash(1.0), 4), round(squash(0.0), 4)
        (1.1932, -0.1932)
    """
    return 3.0 / (1.0 + math.exp(-scale * (reward - 0.5))) - 1.0


def _text(completion: Any) -> str:
    """A completion as TRL passes it: a string, or (conversational) a list of messages ending with the reply."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content", ""))
    return ""


@dataclass
class EvidenceReward:
    """DoublyCal's reward (see the module docstring) as a TRL reward function.

    Args:
        weight: ``λ``, the share of the inferential-quality reward.
        tolerance: ``ξ`` of ``R_cal``.
        scale: ``ξ'`` of the final sigmoid.
        jaccard_weight: the Jaccard share of the match score.
        invalid_reward: the reward of an output without a well-formed ``<PATH confidence=...>`` block.

    Only the first well-formed block of a completion is scored (the RL prompt asks for one evidence). The number of
    invalid completions seen is in :attr:`invalid`.

    Example:
        >>> reward = EvidenceReward()
        >>> gold = [{"items": ["sibling_of", "gender=Male"], "confidence": 0.75, "f1": 1.0}]
        >>> good = "<PATH confidence=0.75>sibling_of<CONSTRAINT>gender<SEP>Male</CONSTRAINT></PATH>"
        >>> [round(r, 4) for r in reward([good, "no path here"], gold_evidence=[gold, gold])]
        [1.1932, -3.0]
    """

    weight: float = 0.85
    tolerance: float = 2.0
    scale: float = 2.0
    jaccard_weight: float = 0.5
    invalid_reward: float = -3.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"weight (lambda) must be in [0, 1], got {self.weight}")
        if self.tolerance <= 0 or self.scale <= 0:
            raise ValueError(f"tolerance and scale must be > 0, got {self.tolerance}, {self.scale}")
        self.invalid = 0
        self.__name__ = "evidence_reward"  # TRL names each reward function's logged mean after it

    def raw(self, items: Sequence[str], confidence: float, gold: Sequence[Mapping[str, Any]]) -> float:
        """``max_z R`` before squashing (0 without gold evidence)."""
        best = 0.0
        for z in gold:
            m = match_score(items, z["items"], self.jaccard_weight)
            r_inf = float(z["f1"]) * m
            r_cal = max(0.0, 1.0 - self.tolerance * abs(confidence - float(z["confidence"]) * m))
            best = max(best, self.weight * r_inf + (1.0 - self.weight) * r_cal)
        return best

    def score(self, completion: Any, gold: Sequence[Mapping[str, Any]]) -> float:
        """The final reward of one completion."""
        parsed = parse_evidence(_text(completion), require_confidence=True).evidence
        if not parsed or parsed[0].confidence is None:
            self.invalid += 1
            return self.invalid_reward
        z = parsed[0]
        constraint = None if z.constraint is None else (z.constraint.relation, z.constraint.entity)
        return squash(self.raw(evidence_items(z.relations, constraint), z.confidence, gold), self.scale)

    def __call__(
        self, completions: Sequence[Any], gold_evidence: Sequence[Sequence[Mapping[str, Any]]], **kwargs: Any
    ) -> list[float]:
        if len(gold_evidence) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(gold_evidence)} gold_evidence lists")
        return [self.score(c, g) for c, g in zip(completions, gold_evidence)]
