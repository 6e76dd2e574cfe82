"""KG evidence for DoublyCal: constrained relational paths ``z = P_r ∧ C`` and their Bayesian confidence.

* :mod:`~kglightning.evidence.schema`: :class:`Evidence`, the record of one (scored) constrained path.
* :mod:`~kglightning.evidence.confidence`: the Beta-Bernoulli posterior mean (Eq. 4, Jeffreys prior).
* :mod:`~kglightning.evidence.paths`: grounding on integer ids (shared-prefix walks, vectorized constraint scores).
* :mod:`~kglightning.evidence.builder`: :class:`EvidenceBuilder`, mining (training) and grounding/scoring
  (inference) for one record.
* :mod:`~kglightning.evidence.verbalize`: the grounded path instances of an evidence, written for the reasoner.
* :mod:`~kglightning.evidence.rewards`: :class:`EvidenceReward`, the RL stage's calibration-aware reward.
* :mod:`~kglightning.evidence.answer_signals`: what an LLM's output says of each answer for free (votes, first
  rank, cited paths and whether they are in the graph), read by the hallucination detector and its baselines.
"""

from kglightning.evidence.builder import CVT_PATTERN, EvidenceBuilder
from kglightning.evidence.confidence import (
    JEFFREYS_ALPHA,
    JEFFREYS_BETA,
    beta_bernoulli_confidence,
    beta_bernoulli_confidences,
    set_confidence,
)
from kglightning.evidence.paths import ConstraintScores, PathGrounder, score_constraints
from kglightning.evidence.rewards import EvidenceReward
from kglightning.evidence.schema import Evidence
from kglightning.evidence.verbalize import path_instances, verbalize_instance

__all__ = [
    "CVT_PATTERN",
    "JEFFREYS_ALPHA",
    "JEFFREYS_BETA",
    "ConstraintScores",
    "Evidence",
    "EvidenceBuilder",
    "EvidenceReward",
    "PathGrounder",
    "beta_bernoulli_confidence",
    "beta_bernoulli_confidences",
    "score_constraints",
    "path_instances",
    "set_confidence",
    "verbalize_instance",
]
