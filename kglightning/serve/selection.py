"""The selection a server can keep request by request: the ``question`` rule, whose cut is fixed once calibrated.

:class:`ServedSelection` calibrates :class:`~kglightning.conformal.AnswerSelector` (``rule="question"``) once, when
the server starts, on a labelled scored file of a calibration split (what ``predict`` writes for the validation
split, e.g. ``hallucination_predictions_validation.jsonl``), per grounding kind when asked (Mondrian). Each request's
answers are then kept when their score is under their group's cut. With the calibration and the served questions
exchangeable, the probability that a served question keeps a hallucinated answer is at most ``alpha`` (with groups:
within each group), for every request: the cut does not depend on the other requests. ``top`` and ``fdr`` choose their cut with Benjamini-Hochberg
over a batch of test questions, so they are not served per request.

Example:
    >>> import json, tempfile
    >>> path = tempfile.mkdtemp() + "/cal.jsonl"
    >>> with open(path, "w") as f:
    ...     for i in range(40):  # question i: a right answer scored i - 40, a wrong one scored i
    ...         row = {"id": f"q{i}", "prediction": ["a", "b"], "hallucination_logit": [i - 40.0, float(i)],
    ...                "hallucinated": [False, True], "grounding": ["exact", "exact"]}
    ...         print(json.dumps(row), file=f)
    >>> selection = ServedSelection(path, alpha=0.1, group_by="none")
    >>> selection.cuts  # the 4th smallest of the 40 wrong answers' scores: floor(41 * 0.1) = 4
    {'all': 3.0}
    >>> selection.keeps(2.5, "exact"), selection.keeps(3.0, "exact")
    (True, False)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from kglightning.conformal.scored import ALL
from kglightning.conformal.selection import AnswerSelector
from kglightning.conformal.selection_io import labelled_part, read_scored
from kglightning.fileio import file_digest

__all__ = ["ServedSelection"]


class ServedSelection:
    """The ``question`` rule calibrated once and applied to each request.

    Args:
        calibration: a labelled scored predictions jsonl (``hallucinated`` per answer, or gold answers).
        alpha: the tolerated probability that a question keeps a hallucinated answer.
        group_by: ``"none"`` (one cut: the promise holds per question) or ``"grounding"`` (a cut per grounding kind:
            ``exact``, ``near_miss``, ``ungrounded``; the promise holds within each kind, so a question with answers
            of ``k`` kinds may keep a hallucinated one with probability up to ``k * alpha``).
        score: the per-answer score column (higher = more likely hallucinated); the detector's logits by default, as
            the responses give them.
        digest: what the responses name the calibration by (default: the file's sha256).
    """

    def __init__(
        self,
        calibration: str | Path,
        alpha: float = 0.1,
        group_by: Literal["grounding", "none"] = "none",
        score: str = "hallucination_logit",
        digest: str | None = None,
    ) -> None:
        if group_by not in ("grounding", "none"):
            raise ValueError(f"group_by must be 'grounding' or 'none', got {group_by!r}")
        source = str(calibration)
        scored = read_scored(calibration, score, "hallucination", "grounding" if group_by == "grounding" else None)
        answers = labelled_part(scored, source)
        fitted = AnswerSelector(rule="question", alpha=alpha).select(answers, answers, check_lengths=False)
        self.alpha, self.group_by, self.score = alpha, group_by, score
        #: each calibrated group's cut (an answer is kept when its score is under it); ``None``: too few calibration
        #: questions for the rule at ``alpha``, and the group keeps nothing
        self.cuts: dict[str, float | None] = {
            g: None if info.too_small or info.cut is None else float(info.cut) for g, info in fitted.groups.items()
        }
        self.questions = {g: info.n_calibration for g, info in fitted.groups.items()}
        self.digest = digest if digest is not None else file_digest(calibration)

    def keeps(self, score: float, grounding: str) -> bool:
        """Whether an answer with this ``score`` and grounding kind is kept (a group the calibration did not have, or
        had too few questions of, keeps nothing)."""
        cut = self.cuts.get(grounding if self.group_by == "grounding" else ALL)
        return cut is not None and score < cut

    def describe(self) -> dict[str, Any]:
        """What a response says of the selection it applied."""
        return {
            "rule": "question",
            "alpha": self.alpha,
            "group_by": self.group_by,
            "score": self.score,
            "cuts": {g: c if c is None or math.isfinite(c) else str(c) for g, c in self.cuts.items()},
            "calibration_questions": dict(self.questions),
            "calibration": self.digest,
        }
