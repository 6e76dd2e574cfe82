"""UAG (uncertainty-aware graph reasoning): conformal KG traversal with Learn-Then-Test error control.

* :mod:`.scores`: the non-conformity scores of Eqs. 4-6 for every relation path of a question.
* :mod:`.traversal`: the deterministic breadth-first search of Algorithm 1 at given thresholds.
* :mod:`.grid`: the same sets for a whole grid of thresholds at once (what calibration needs).
* :mod:`.controller`: per-component split-conformal thresholds, chosen jointly by Learn-Then-Test.
* :mod:`.baselines`: Top-K and plain split CP on the same candidate pool.
"""

from kglightning.conformal.uag.baselines import SplitCP, TopK, candidate_scores, covers, evaluate_members
from kglightning.conformal.uag.controller import (
    UAGCalibration,
    UAGController,
    alpha_grid,
    component_thresholds,
    paper_alpha_grid,
)
from kglightning.conformal.uag.grid import grid_membership, grid_outcomes, members_at
from kglightning.conformal.uag.scores import QuestionScores, score_question, score_questions
from kglightning.conformal.uag.traversal import TraversalResult, UAGTraversal

__all__ = [
    "QuestionScores",
    "SplitCP",
    "TopK",
    "TraversalResult",
    "UAGCalibration",
    "UAGController",
    "UAGTraversal",
    "alpha_grid",
    "candidate_scores",
    "component_thresholds",
    "covers",
    "evaluate_members",
    "grid_membership",
    "grid_outcomes",
    "members_at",
    "paper_alpha_grid",
    "score_question",
    "score_questions",
]
