"""The selections a server applies: the ``question`` rule request by request (its cut is fixed once calibrated), and
every rule of :class:`~kglightning.conformal.AnswerSelector` over a batch of questions sent together.

:class:`ServedSelection` calibrates :class:`~kglightning.conformal.AnswerSelector` (``rule="question"``) once, when
the server starts, on a labelled scored file of a calibration split (what ``predict`` writes for the validation
split, e.g. ``hallucination_predictions_validation.jsonl``), per grounding kind when asked (Mondrian). Each request's
answers are then kept when their score is under their group's cut. With the calibration and the served questions
exchangeable, the probability that a served question keeps a hallucinated answer is at most ``alpha`` (with groups:
within each group), for every request: the cut does not depend on the other requests. ``top`` and ``fdr`` choose
their cut with Benjamini-Hochberg over a batch of test questions, and ``kept_rate`` certifies one over the
calibration for the batch's scores, so these are served on a batch (:meth:`ServedSelection.select_batch`): their
promise is over the questions of one batch (:data:`PROMISES`).

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

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from kglightning.conformal.scored import ALL
from kglightning.conformal.selection import AnswerSelector, Rule
from kglightning.conformal.selection_io import labelled_part, read_scored, scored_rows
from kglightning.fileio import file_digest

__all__ = ["GROUPED", "PROMISES", "ServedSelection", "answer_kinds"]

#: what each rule promises of the answers it keeps, as a response states it (with groups: within each group); every
#: promise needs the served questions drawn like the calibration questions (exchangeable with them)
PROMISES: dict[str, str] = {
    "question": "P(a question keeps a hallucinated answer) <= alpha, for each question",
    "top": "E[hallucinated kept / kept] <= alpha over the questions of the batch, at most one answer kept per question",
    "fdr": "E[hallucinated kept / kept] <= alpha over the answers of the batch, if they are exchangeable one by one "
    "(the answers of one question rarely are: top is the FDR rule for answer lists)",
    "kept_rate": "with probability >= 1 - delta over the calibration, the hallucinated rate of the kept answers over "
    "questions drawn like the calibration's (each question weighing one) <= alpha: a rate in expectation, which one "
    "batch's own share scatters around (more, the smaller the batch)",
}
#: added to a promise when the rule is calibrated per grounding kind
GROUPED = " (within each grounding kind: a question may keep an answer of each kind)"


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
        delta: the ``kept_rate`` rule's (batches only): the probability that the calibration draw breaks its bound.
    """

    def __init__(
        self,
        calibration: str | Path,
        alpha: float = 0.1,
        group_by: Literal["grounding", "none"] = "none",
        score: str = "hallucination_logit",
        digest: str | None = None,
        delta: float = 0.1,
    ) -> None:
        if group_by not in ("grounding", "none"):
            raise ValueError(f"group_by must be 'grounding' or 'none', got {group_by!r}")
        source = str(calibration)
        scored = read_scored(calibration, score, "hallucination", "grounding" if group_by == "grounding" else None)
        answers = labelled_part(scored, source)
        fitted = AnswerSelector(rule="question", alpha=alpha).select(answers, answers, check_lengths=False)
        AnswerSelector(rule="kept_rate", alpha=alpha, delta=delta)  # delta checked when the server starts
        self.alpha, self.group_by, self.score, self.delta = alpha, group_by, score, delta
        self._calibration = answers
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

    def select_batch(
        self, rows: Sequence[dict[str, Any] | None], rule: Rule, ids: Sequence[str] | None = None
    ) -> tuple[list[list[bool]], dict]:
        """Which answers of a batch of scored questions to keep under ``rule``, and what the response says of it.

        ``rows`` are the detector's rows of the batch's questions (``None``: a question with nothing scored, which
        keeps nothing); ``ids``, the questions' distinct ids (default: their positions), key the selector's seeded
        draws as ``select`` keys a file's rows. ``question`` keeps by its fixed cuts, as a single request would;
        ``top``, ``fdr`` and ``kept_rate`` select over the whole batch (:class:`~kglightning.conformal.AnswerSelector`
        with the batch as its test set), so a question's answers may be kept or not depending on its batch.
        """
        if ids is not None and (len(ids) != len(rows) or len(set(ids)) != len(ids)):
            raise ValueError(f"ids must be {len(rows)} distinct names, one per row")
        grouped = self.group_by == "grounding"
        if rule == "question":
            kept = [
                [] if r is None else [self.keeps(s, g) for s, g in zip(r[self.score], answer_kinds(r))] for r in rows
            ]
            return kept, {**self.describe(), "promise": PROMISES["question"] + (GROUPED if grouped else "")}
        items = [
            (i, {"id": ids[i] if ids is not None else i, "prediction": list(r["prediction"]) if r else [], self.score: list(r[self.score]) if r else [],
                 "grounding": answer_kinds(r) if r else []})
            for i, r in enumerate(rows)
        ]  # fmt: skip
        test = scored_rows(items, "<batch>", self.score, "hallucination", "grounding" if grouped else None).answers
        selector = AnswerSelector(rule=rule, alpha=self.alpha, delta=self.delta)
        chosen = selector.select(self._calibration, test, check_lengths=False, warn_clustered=False)
        flat = iter(chosen.keep.tolist())  # the answers of the rows, one row after another
        kept = [list(itertools.islice(flat, len(row["prediction"]))) for _, row in items]
        groups = {g: {"calibration_questions": info.n_calibration, "too_small": info.too_small,
                      "answers": info.n_test, "kept": info.n_kept} for g, info in chosen.groups.items()}  # fmt: skip
        promise = PROMISES[rule] + (GROUPED if grouped else "")
        described = {**self.describe(), "rule": rule, "promise": promise, "groups": groups}
        described.pop("cuts")
        if rule == "kept_rate":
            described["delta"] = self.delta
        return kept, described

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


def answer_kinds(row: dict[str, Any]) -> list[str]:
    """The grounding kind of each answer of a detector row (``exact`` when the row has none)."""
    return list(row.get("grounding") or ["exact"] * len(row["prediction"]))
