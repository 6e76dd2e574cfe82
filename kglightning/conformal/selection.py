"""Keep an LLM's answers with a guarantee on how many of the kept ones are hallucinated, per group (Mondrian).

:class:`AnswerSelector` takes per-answer hallucination scores (a detector's probabilities, or any score where higher
means more likely wrong) of labelled calibration answers and of test answers, and returns which test answers to
keep under one of four rules (the statistics are in :mod:`kglightning.conformal.functional.selection`):

* ``"fdr"``: conformal p-values and Benjamini-Hochberg; ``E[hallucinated kept / kept] <= alpha`` over every kept
  answer. Needs exchangeable *answers*: it can fail when the answers of a question depend on each other (it does on
  an LLM's answer lists, whose errors cluster by question), so a group whose questions carry several answers is
  flagged (``GroupSelection.clustered``) and warned about.
* ``"top"``: the same on one answer per question, its lowest-scored one; ``E[hallucinated kept / kept] <= alpha``
  with questions exchangeable, at most one answer kept per question (per group). The FDR rule for answer lists.
* ``"kept_rate"``: Learn-Then-Test over score thresholds (betting p-values on one loss per question, fixed
  sequences from a few starting thresholds towards keeping everything, Bonferroni over them); with probability ``>= 1 - delta`` the hallucinated share of the kept
  answers, each question weighing one (spread over its answers), is ``<= alpha``. Questions exchangeable.
* ``"question"``: split conformal on each question's lowest hallucinated score;
  ``P(a question keeps a hallucinated answer) <= alpha``. Questions exchangeable.

With groups (``ScoredAnswers.group``: grounded or not, hop count, the answering LLM ...) each group is calibrated on
its own calibration answers only, so each guarantee holds within each group (Mondrian conformal), with the
exchangeability it needs holding within the group. A group with fewer calibration questions than the rule needs to
keep anything (``min_calibration``; questions for every rule, since answers cluster by question) is flagged ``too_small`` and keeps nothing: a warning, never a guarantee that
the data cannot give.

Every rule needs the calibration and test units drawn alike. The selector checks what it can see: per group, the
calibration and test questions' list lengths are compared by a two-sample Kolmogorov-Smirnov test, and a clear
difference (p below :data:`LENGTH_LEVEL`) is a warning with both sides' summaries. Its random draws come from
``seed`` and a digest of the data (:meth:`AnswerSelector.select`), so that the promise, which averages over them,
holds for each seed over fresh data.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sys
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from kglightning.conformal.functional.ltt import fixed_sequence
from kglightning.conformal.functional.quantile import conformal_min_n
from kglightning.conformal.functional.selection import (
    benjamini_hochberg,
    best_per_question,
    conformal_pvalues,
    kept_rate_pvalues,
    question_cutoff,
)
from kglightning.conformal.functional.two_sample import ks_two_sample, summary
from kglightning.conformal.scored import ScoredAnswers

log = logging.getLogger(__name__)

Rule = Literal["fdr", "top", "kept_rate", "question"]
LENGTH_LEVEL = 0.01  # a length-shift p-value below it is warned about
RULES = ("fdr", "top", "kept_rate", "question")
#: said (logged, printed, written in reports) when rule fdr runs on questions that carry several answers
CLUSTERED_NOTE = (
    "rule 'fdr' assumes the answers exchangeable one by one, and the answers of one question rarely are (they tend "
    "to be right or wrong together): its bound can then fail (an FDR of 0.24 at alpha 0.1 in a simulation with 20 "
    "calibration questions of 10 answers each, right or wrong together). Rule 'top' is the FDR rule with the "
    "question as its unit (one answer kept per question); 'question' and 'kept_rate' also count questions."
)


def _lengths(s: dict[str, float]) -> str:
    return (
        f"{s['n']} questions, {s['mean']:.2f} answers on average (quartiles {s['q25']:g}/{s['median']:g}/"
        f"{s['q75']:g}, range {s['min']:g}-{s['max']:g})"
    )


@dataclass
class GroupSelection:
    """What one group's calibration allowed.

    Attributes:
        group: the group's name.
        n_calibration: calibration questions of the group (for every rule: when answers cluster by question, the
            question is what a "too few" must count, ``fdr`` included).
        min_calibration: the fewest the rule needs to keep anything.
        too_small: ``n_calibration < min_calibration``: nothing of the group is kept.
        cut: the score cut (``"kept_rate"``: kept when ``score <= cut``; ``"question"``: when ``score < cut``); ``None``
            for ``"fdr"`` and ``"top"`` (BH has no fixed cut) and when nothing is kept by ``"kept_rate"``.
        n_test: test answers of the group; ``n_kept``: how many are kept.
        length_pvalue: the two-sample Kolmogorov-Smirnov p-value comparing how many answers the group's calibration
            and test questions have (:func:`~kglightning.conformal.functional.two_sample.ks_two_sample`); below
            :data:`LENGTH_LEVEL` the selector warns that they are not drawn alike. ``None`` when not checked.
        calibration_lengths, test_lengths: summaries of the two sides' list lengths
            (:func:`~kglightning.conformal.functional.two_sample.summary`), or ``None``.
        clustered: ``"fdr"`` only: whether some calibration or test question of the group carries more than one
            answer. ``fdr`` assumes the answers exchangeable one by one, which the answers of one question rarely
            are (they tend to be right or wrong together), and its bound can then fail; the selector warns, and
            ``top`` is the FDR rule for answer lists. ``None`` for the other rules, which take the question as their
            unit.
    """

    group: str
    n_calibration: int
    min_calibration: int
    too_small: bool
    cut: float | None
    n_test: int
    n_kept: int
    length_pvalue: float | None = None
    calibration_lengths: dict[str, float] | None = None
    test_lengths: dict[str, float] | None = None
    clustered: bool | None = None


@dataclass
class Selection:
    """The answers to keep (``keep``, one boolean per test answer) and each group's :class:`GroupSelection`."""

    keep: Tensor
    groups: dict[str, GroupSelection] = field(default_factory=dict)


def calibration_floor(rule: Rule, alpha: float, delta: float, chains: int = 1) -> int:
    """The fewest calibration questions with which ``rule`` can keep anything at all.

    ``"fdr"``, ``"top"`` and ``"question"``: the smallest ``n`` with ``(n + 1) alpha >= 1`` (below it the best
    p-value without luck in the tie-break, ``1 / (n + 1)``, exceeds ``alpha``, and the conformal rank exceeds ``n``),
    in closed form (:func:`~kglightning.conformal.functional.conformal_min_n`), so that a tiny ``alpha`` gives a
    huge floor at once. The selector counts calibration *questions* against it, for every rule.
    ``"kept_rate"``: the smallest ``n`` whose best case can reach the wealth of a chain's test, ``chains / delta``:
    ``n`` questions that keep every answer, none hallucinated (each loss 0), each bet at its cap, ``(1 + alpha / (2
    (1 - alpha))) ** n >= chains / delta``.

    Example:
        >>> calibration_floor("fdr", 0.1, 0.1), calibration_floor("kept_rate", 0.1, 0.1, chains=4)
        (9, 69)
    """
    if rule != "kept_rate":
        return conformal_min_n(alpha)  # closed form: a tiny alpha gives a huge floor at once, not a long count
    growth = math.log1p(0.5 * alpha / (1 - alpha))
    if growth == 0.0:  # alpha so small that one bet cannot grow the wealth in float arithmetic
        return sys.maxsize
    return max(1, math.ceil(math.log(chains / delta) / growth - 1e-9))


class AnswerSelector:
    """Chooses the test answers to keep under a guarantee, per group; see the module docstring.

    Args:
        rule: ``"fdr"``, ``"top"``, ``"kept_rate"`` or ``"question"``.
        alpha: the tolerated hallucinated share (fdr, top), rate (kept_rate) or per-question probability (question).
        delta: ``"kept_rate"`` only: the probability that the calibration draw breaks the bound.
        min_calibration: the fewest calibration questions a group needs (default and floor: the least with which the
            rule can keep anything, :func:`calibration_floor`); smaller groups keep nothing and are flagged.
        grid: ``"kept_rate"`` only: how many thresholds to test, at evenly spaced quantiles of the group's test
            scores from ``start`` to 1 (the test scores do not depend on the calibration draw, so the order is
            fixed before it is seen).
        start: ``"kept_rate"`` only: the share of the group's test answers that the strictest threshold keeps (the
            fixed sequence runs from it towards keeping everything and stops at the first threshold it cannot
            certify; thresholds that keep few answers are hard to certify, so a start above 0 can help).
        chains: ``"kept_rate"`` only: fixed sequences started at evenly spaced points of the grid, each run at
            ``delta / chains`` (Bonferroni), so that a strict threshold with too little evidence does not end every
            test (a single chain from ``start`` stops there).
        seed: seeds, together with a digest of the data, the random tie-breaking of the p-values (and of each
            question's best answer for ``"top"``) and the order in which the ``kept_rate`` rule's betting p-values
            visit the calibration questions.
    """

    def __init__(
        self,
        rule: Rule = "top",
        alpha: float = 0.1,
        delta: float = 0.1,
        min_calibration: int | None = None,
        grid: int = 100,
        start: float = 0.1,
        chains: int = 4,
        seed: int = 0,
    ) -> None:
        if rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(map(repr, RULES))}, got {rule!r}")
        for name, v in (("alpha", alpha), ("delta", delta)):
            if not 0.0 < v < 1.0:
                raise ValueError(f"{name} must lie in (0, 1), got {v}")
        if grid < 1:
            raise ValueError(f"grid must be >= 1, got {grid}")
        if not 0.0 <= start <= 1.0:
            raise ValueError(f"start must lie in [0, 1], got {start}")
        if not 1 <= chains <= grid:
            raise ValueError(f"chains must lie in [1, grid], got {chains}")
        self.rule, self.alpha, self.delta, self.grid, self.start, self.seed = rule, alpha, delta, grid, start, seed
        self.chains = chains
        floor = calibration_floor(rule, alpha, delta, chains)
        if min_calibration is not None and min_calibration < floor:
            raise ValueError(f"min_calibration must be >= {floor} for rule {rule!r} at alpha={alpha}, delta={delta}")
        self.min_calibration = floor if min_calibration is None else min_calibration
        self._given_min_calibration = min_calibration

    def with_alpha(self, alpha: float) -> AnswerSelector:
        """The same selector at another ``alpha``; a ``min_calibration`` below the new ``alpha``'s floor is raised to
        it (the floor is the least with which the rule can keep anything)."""
        given = self._given_min_calibration
        if given is not None:
            given = max(given, calibration_floor(self.rule, alpha, self.delta, self.chains))
        return AnswerSelector(self.rule, alpha, self.delta, given, self.grid, self.start, self.chains, self.seed)

    def select(
        self, calibration: ScoredAnswers, test: ScoredAnswers, check_lengths: bool = True, warn_clustered: bool = True
    ) -> Selection:
        """The test answers to keep, calibrated on ``calibration`` (which must carry ``hallucinated``).

        The random draws (tie-breaks, ``top``'s pick among tied answers, the order ``kept_rate`` visits the
        questions in) come from a stream seeded by ``seed`` and by a digest of both sides' content
        (:meth:`ScoredAnswers.fingerprint`; the test answers' labels left out, so that labelled and unlabelled
        copies of one file keep the same answers): one seed thus draws afresh for fresh data, as the guarantee over
        the draws needs, and the same data give the same selection. With ``check_lengths`` each group's calibration
        and test list lengths are compared (:attr:`GroupSelection.length_pvalue`) and a clear difference is
        warned about; a check over random splits of one pool leaves it off. For ``"fdr"``, a group whose questions
        carry several answers is flagged (:attr:`GroupSelection.clustered`) and, with ``warn_clustered``, warned
        about (a sweep over many alphas or splits warns once itself and passes ``False``).
        """
        if calibration.hallucinated is None:
            raise ValueError("calibration answers need hallucinated labels")
        if len(calibration) == 0:
            raise ValueError("calibration set is empty")
        if (calibration.group is None) != (test.group is None):
            which = ("calibration", "test") if test.group is None else ("test", "calibration")
            raise ValueError(
                f"the {which[0]} answers have groups and the {which[1]} answers have none: no group would find its "
                "calibration answers and nothing would be kept; group both or neither"
            )
        keep = torch.zeros(len(test), dtype=torch.bool, device="cpu")
        out = Selection(keep)
        mixed = hashlib.blake2b(str(self.seed).encode(), digest_size=8)
        mixed.update(calibration.fingerprint(labels=True) + test.fingerprint(labels=False))
        stream = int.from_bytes(mixed.digest(), "big") >> 1
        gen = torch.Generator().manual_seed(stream)
        for g in sorted(set(test.groups())):
            cm, tm = calibration.mask(g), test.mask(g)
            cal_s, cal_y, cal_q = calibration.scores[cm], calibration.hallucinated[cm], calibration.question[cm]
            n_cal = int(torch.unique(cal_q).numel())  # the exchangeable unit: questions, for every rule
            too_small = n_cal < self.min_calibration
            cut: float | None = None
            kept = torch.zeros(int(tm.sum()), dtype=torch.bool, device="cpu")
            if not too_small and self.rule == "top":
                kept = self._select_top(calibration, cm, test, tm, gen, stream)
            elif not too_small:
                kept, cut = self._select_group(cal_s, cal_y, cal_q, test.scores[tm], gen, test.draws(stream, tm))
            keep[tm] = kept
            out.groups[g] = GroupSelection(
                g, n_cal, self.min_calibration, too_small, cut, int(tm.sum()), int(kept.sum())
            )
            if check_lengths:
                self._compare_lengths(out.groups[g], cal_q, test.question[tm])
            if self.rule == "fdr":
                self._check_clustered(out.groups[g], cal_q, test.question[tm], warn_clustered)
            if too_small:
                log.warning(
                    "AnswerSelector: group %r has %d calibration questions (%d answers), fewer than the %d that rule "
                    "%r needs at alpha=%g: none of its %d test answers is kept",
                    g, n_cal, int(cm.sum()), self.min_calibration, self.rule, self.alpha, int(tm.sum()),
                )  # fmt: skip
            elif not bool(kept.any()) and bool(tm.any()):
                log.warning(
                    "AnswerSelector: rule %r at alpha=%g keeps none of group %r's %d test answers (the scores cannot "
                    "certify any of them); they are abstentions",
                    self.rule, self.alpha, g, int(tm.sum()),
                )  # fmt: skip
        return out

    def _check_clustered(self, info: GroupSelection, cal_q: Tensor, test_q: Tensor, warn: bool) -> None:
        """``"fdr"``: flag (and warn about) a group whose questions carry more than one answer."""
        cal_len = torch.unique(cal_q, return_counts=True)[1]
        test_len = torch.unique(test_q, return_counts=True)[1]
        most = max(int(cal_len.max()) if cal_len.numel() else 0, int(test_len.max()) if test_len.numel() else 0)
        info.clustered = most > 1
        if info.clustered and warn:
            log.warning(
                "AnswerSelector: group %r: calibration %d answers in %d questions, test %d in %d (up to %d per "
                "question): %s", info.group, int(cal_len.sum()), cal_len.numel(), int(test_len.sum()),
                test_len.numel(), most, CLUSTERED_NOTE,
            )  # fmt: skip

    def _compare_lengths(self, info: GroupSelection, cal_q: Tensor, test_q: Tensor) -> None:
        """Compare how many answers the group's calibration and test questions have; warn when they differ."""
        cal_len = torch.unique(cal_q, return_counts=True)[1]
        test_len = torch.unique(test_q, return_counts=True)[1]
        if not cal_len.numel() or not test_len.numel():
            return
        _, info.length_pvalue = ks_two_sample(cal_len, test_len)
        info.calibration_lengths, info.test_lengths = summary(cal_len), summary(test_len)
        if info.length_pvalue < LENGTH_LEVEL:
            log.warning(
                "AnswerSelector: group %r: the calibration and test questions have answer lists of different lengths "
                "(two-sample Kolmogorov-Smirnov p = %.2g < %g): calibration %s; test %s. Rule %r assumes both drawn "
                "alike (exchangeable), and its bound need not hold when they are not (with longer test lists, "
                "top's best answer of a question is the least of more scores, and more wrong answers pass). "
                "Calibrate on questions answered like the test questions (the same LLM and settings).",
                info.group, info.length_pvalue, LENGTH_LEVEL, _lengths(info.calibration_lengths),
                _lengths(info.test_lengths), self.rule,
            )  # fmt: skip

    def _select_top(
        self, cal: ScoredAnswers, cm: Tensor, test: ScoredAnswers, tm: Tensor, gen: torch.Generator, stream: int
    ) -> Tensor:
        """``"top"``: BH on the p-values of each test question's best answer against each calibration question's."""
        kept = torch.zeros(int(tm.sum()), dtype=torch.bool, device="cpu")
        if not bool(tm.any()):
            return kept
        best_c = best_per_question(cal.scores[cm], cal.question[cm], cal.draws(stream, cm, "best"), gen)
        best_t = best_per_question(test.scores[tm], test.question[tm], test.draws(stream, tm, "best"), gen)
        u = test.draws(stream, tm)
        p = conformal_pvalues(
            cal.scores[cm][best_c], cal.hallucinated[cm][best_c], test.scores[tm][best_t], gen,
            None if u is None else u[best_t],
        )  # fmt: skip
        kept[best_t] = benjamini_hochberg(p, self.alpha)
        return kept

    def _select_group(
        self, cal_s: Tensor, cal_y: Tensor, cal_q: Tensor, test_s: Tensor, gen: torch.Generator, u: Tensor | None
    ) -> tuple[Tensor, float | None]:
        if test_s.numel() == 0:
            return torch.zeros(0, dtype=torch.bool, device="cpu"), None
        if self.rule == "fdr":
            return benjamini_hochberg(conformal_pvalues(cal_s, cal_y, test_s, gen, u), self.alpha), None
        if self.rule == "question":
            cut = question_cutoff(cal_s, cal_y, cal_q, self.alpha)
            return test_s < cut, cut
        levels = torch.linspace(self.start, 1.0, self.grid, dtype=torch.float64, device="cpu")
        thresholds = torch.quantile(test_s, levels)
        level = self.delta / self.chains  # Bonferroni over the chains
        p, _ = kept_rate_pvalues(cal_s, cal_y, cal_q, thresholds, self.alpha, "betting", level, gen)
        valid = torch.zeros(self.grid, dtype=torch.bool, device="cpu")
        for c in range(self.chains):  # chain c tests from its start towards keeping everything
            first = c * self.grid // self.chains
            valid[first:] |= fixed_sequence(p[first:], level)
        if not bool(valid.any()):
            return torch.zeros(test_s.numel(), dtype=torch.bool, device="cpu"), None
        cut = float(thresholds[valid.nonzero().max()])
        return test_s <= cut, cut
