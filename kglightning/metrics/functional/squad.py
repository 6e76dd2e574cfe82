"""SQuAD-style exact match, token F1 and Hit (SGIC's tables; RoG's Hit), the best over the accepted answers.

Normalisation as in the SQuAD v1.1 evaluation: lower-case, drop punctuation, drop the articles ``a``/``an``/``the``,
collapse whitespace. F1 is over the multiset of normalised tokens.

Example:
    >>> squad_exact_match("The Eiffel Tower!", ["eiffel tower"]), squad_f1("Eiffel", ["Eiffel Tower"])
    (1.0, 0.6666666666666666)
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = ["normalize_squad", "squad_exact_match", "squad_f1", "squad_hit"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_squad(text: str) -> str:
    """SQuAD's answer normalisation.

    >>> normalize_squad("  The  U.S.   Army ")
    'us army'
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_squad(prediction).split(), normalize_squad(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised accepted answer, else 0.0."""
    if not answers:
        raise ValueError("no accepted answer to compare with")
    pred = normalize_squad(prediction)
    return float(any(pred == normalize_squad(a) for a in answers))


def squad_f1(prediction: str, answers: Sequence[str]) -> float:
    """The best token F1 of the prediction against the accepted answers.

    >>> squad_f1("", ["x"]), squad_f1("Paris France", ["Lyon", "Paris"])
    (0.0, 0.6666666666666666)
    """
    if not answers:
        raise ValueError("no accepted answer to compare with")
    return max(_f1(prediction, a) for a in answers)


def squad_hit(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when a normalised accepted answer occurs in the normalised prediction as whole tokens, else 0.0.

    The Hit of RoG-style KGQA evaluation, for verbose answers that contain the right entity.

    >>> squad_hit("It is the Eiffel Tower, in Paris.", ["eiffel tower"]), squad_hit("Parisian", ["Paris"])
    (1.0, 0.0)
    """
    if not answers:
        raise ValueError("no accepted answer to compare with")
    pred = f" {normalize_squad(prediction)} "
    return float(any(normalize_squad(a) and f" {normalize_squad(a)} " in pred for a in answers))
