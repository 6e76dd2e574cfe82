"""Answer metrics for KGQA: RoG-compatible scores and a strict set-based variant.

The ``rog_*`` semantics reproduce ``src/qa_prediction/evaluate_results.py`` of RoG (RManLuo/reasoning-on-graphs),
with the ``eval_hit1`` of its GNN-RAG fork, so that numbers are comparable with published tables. Quirks that are
reproduced on purpose:

* :func:`normalize` removes ASCII punctuation *without* inserting a space (``"Barack-Obama"`` becomes
  ``"barackobama"``), then drops the words ``a``/``an``/``the``. RoG's ``<pad>`` regex runs after punctuation removal,
  when ``<`` and ``>`` are already gone, so it never fires: ``"<pad>"`` survives as the word ``"pad"``.
* :func:`match` is a *substring* test on normalized strings: gold ``"Paris"`` matches ``"Paris, Texas"``, and a gold
  that normalizes to ``""`` (say ``"The"``) matches anything.
* Hit, accuracy and the matched count of F1 test each gold against the *joined* prediction string
  ``" ".join(prediction)``, so a gold may match across two predictions (``["New", "York"]`` hits ``"New York"``) and
  one prediction may match several golds. Precision is ``matched / len(prediction)`` and can exceed 1; accuracy
  always equals recall.
* A string prediction is split on ``"\\n"`` as is (no strip, no de-duplication, ``topk`` ignored), so a trailing
  newline adds an empty prediction that counts in the precision denominator (GNN-RAG's fork strips the string first;
  RoG does not, and neither does this module). A list prediction is de-duplicated and sorted by count
  (:func:`extract_topk_prediction`) first, which also decides ``prediction[0]`` for Hits@1.
* Golds are normalized too, so a gold that is only an article or punctuation (``"A"``, ``"The"``, ``"-"``) becomes
  ``""`` and is matched by every prediction.

Edge cases on which RoG crashes are decided as follows: an empty gold list raises :class:`ValueError` here (the
batch helpers and Metric classes skip such questions and count them); an empty prediction list scores 0 for Hits@1,
F1, precision and recall, while accuracy and hit test the golds against ``""`` as RoG does.
"""

from __future__ import annotations

import functools
import re
import string
import unicodedata
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor

_PUNCT_TABLE = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")

#: keys of :func:`rog_answer_scores`, then of :func:`strict_answer_scores` (prefixed ``strict_`` except ``em``)
ROG_KEYS = ("acc", "hit", "hit1", "f1", "precision", "recall")
STRICT_KEYS = ("strict_f1", "strict_precision", "strict_recall", "em")
ALL_KEYS = ROG_KEYS + STRICT_KEYS


def normalize(s: str) -> str:
    """Normalize an answer string the way RoG does.

    Steps, in order: lowercase; delete every ASCII punctuation character (no space is put in its place); replace the
    whole words ``a``, ``an``, ``the`` by a space; collapse whitespace and strip. RoG's extra ``<pad>`` removal runs
    after the punctuation is gone and never matches, so ``"<pad>"`` is kept as ``"pad"`` (reproduced here).

    Example:
        >>> normalize("The  Barack-Obama's <pad>")
        'barackobamas pad'
        >>> normalize("U.S. Theatre")
        'us theatre'
    """
    s = s.lower().translate(_PUNCT_TABLE)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


ABSTENTIONS = frozenset({"unknown", "none", "n/a", "na", "no answer", "i don't know", "i do not know", "not sure"})
"""Answers that mean "no answer" (after :func:`answer_key`, or lowercased), besides an empty or blank answer."""


@functools.lru_cache(maxsize=1 << 17)  # the same node names recur across a split's graphs: computed once each
def answer_key(s: str) -> str:
    """The key by which the detector's labels and grounding compare an answer with a gold answer or a node name:
    Unicode NFKC first (``"Zu\\u0308rich"`` is ``"Zürich"``), then :func:`normalize`; a non-empty answer that RoG's
    normalisation empties (``"A"``, ``"The The."``, ``"-"``) keeps its NFKC, case-folded text instead, without its
    punctuation (unless it is only punctuation), so that it is still an answer and matches only its own spellings.
    Only a blank string has the key ``""``.

    :func:`normalize` and :func:`match` (what ``kglightning evaluate`` scores with) stay RoG's own.

    Example:
        >>> answer_key("The  Barack-Obama's"), answer_key("Zu\u0308rich") == answer_key("Zürich")
        ('barackobamas', True)
        >>> answer_key("The The"), answer_key("The The."), answer_key("A"), answer_key("-"), answer_key("  ")
        ('the the', 'the the', 'a', '-', '')
    """
    s = unicodedata.normalize("NFKC", s)
    if key := normalize(s):
        return key
    folded = s.casefold()  # RoG's normalisation without dropping articles, then, for punctuation only, as it is
    return " ".join(folded.translate(_PUNCT_TABLE).split()) or " ".join(folded.split())


def gold_keys(answer: Iterable[str]) -> frozenset[str]:
    """The :func:`answer_key`-s of the gold answers that can label an answer: a gold whose key is blank (a blank
    string) is no gold. An empty result means the question has no usable gold answer: its answers are unlabelled.

    Example:
        >>> sorted(gold_keys(["The", "Zu\u0308rich", "  ", "Paris."]))
        ['paris', 'the', 'zürich']
        >>> gold_keys(["", " "])
        frozenset()
    """
    return frozenset(key for a in answer if (key := answer_key(a)))


def key_hallucinated(prediction: Sequence[str], gold: frozenset[str]) -> list[bool]:
    """Per proposed answer: ``True`` (hallucinated) iff its :func:`answer_key` is none of the ``gold`` keys
    (:func:`gold_keys`). The detector's labels compare text this way (equal keys, not RoG's substring
    :func:`match`), so ``"Paris, Texas"`` does not match the gold ``"Paris"``, a gold ``"The"`` matches only an
    answer spelled ``the`` (RoG's normalisation empties it, and an empty gold would match everything), and an NFD
    spelling matches its NFC gold. RoG's :func:`answer_correctness` stays what
    ``kglightning evaluate`` scores with.

    Example:
        >>> gold = gold_keys(["Paris", "The"])
        >>> key_hallucinated(["paris", "Paris, Texas", "Lyon", "THE", "A"], gold)
        [False, True, True, False, True]
    """
    return [answer_key(p) not in gold for p in prediction]


def is_abstention(answer: str) -> bool:
    """Whether ``answer`` means "no answer": blank, or one of :data:`ABSTENTIONS`. An answer that RoG's
    :func:`normalize` empties but that is not blank (``"A"``, ``"The The"``) is an answer.

    >>> is_abstention(" Unknown "), is_abstention("N/A"), is_abstention("Paris"), is_abstention(" "), is_abstention("A")
    (True, True, False, True, False)
    """
    key = answer_key(answer)
    return not key or key in ABSTENTIONS or answer.strip().lower() in ABSTENTIONS


def node_matcher(nodes: Iterable[str], normal_forms: Iterable[str] | None = None) -> Callable[[str], str | None]:
    """How an answer string names one of ``nodes``: the node with that exact name, else the one node whose
    :func:`answer_key` is the answer's (``"paris"`` -> ``"Paris"``, an NFD spelling -> the NFC name); ``None`` for no
    node, or for several. ``normal_forms``, when given, are the nodes' :func:`answer_key`-s in the same order
    (computed once by a caller that matches against the same names many times).

    Example:
        >>> match = node_matcher(["France", "Paris", "The The"])
        >>> match("paris"), match("Paris"), match("Lyon"), match("the"), match("the the")
        ('Paris', 'Paris', None, None, 'The The')
    """
    if normal_forms is None:
        names = {name: answer_key(name) for name in dict.fromkeys(nodes)}
    else:
        names = dict(zip(nodes, normal_forms, strict=True))
    by_norm: dict[str, str | None] = {}
    for name, key in names.items():
        if key:  # a blank name matches nothing by its key
            by_norm[key] = name if key not in by_norm else None  # ambiguous keys match nothing

    def match(answer: str) -> str | None:
        return answer if answer in names else by_norm.get(answer_key(answer))

    return match


def match(s1: str, s2: str) -> bool:
    """RoG's match: ``normalize(s2)`` is a substring of ``normalize(s1)``.

    Example:
        >>> match("Paris, Texas", "paris")
        True
        >>> match("Paris", "Paris, Texas")
        False
        >>> match("anything", "The")  # a gold that normalizes to "" matches everything
        True
    """
    return normalize(s2) in normalize(s1)


def extract_topk_prediction(prediction: Sequence[str], k: int = -1) -> list[str]:
    """De-duplicate a list prediction and keep the ``k`` most frequent entries (RoG's ``extract_topk_prediction``).

    Entries are compared as raw strings (not normalized) and sorted by count, most frequent first; ties keep their
    first-occurrence order. ``k < 0`` or ``k`` larger than the number of distinct entries keeps all of them; ``k == 0``
    keeps none (as in RoG).

    Example:
        >>> extract_topk_prediction(["b", "a", "a", "c", "b", "a"])
        ['a', 'b', 'c']
        >>> extract_topk_prediction(["b", "a", "a", "c", "b", "a"], k=2)
        ['a', 'b']
    """
    counts: dict[str, int] = {}
    for p in prediction:
        counts[p] = counts.get(p, 0) + 1
    if k < 0 or k > len(counts):
        k = len(counts)
    ranked = sorted(counts.items(), key=lambda kv: kv[1], reverse=True)  # stable: ties keep insertion order
    return [p for p, _ in ranked[:k]]


def prepare_prediction(prediction: str | Sequence[str], topk: int = -1) -> list[str]:
    """Turn a raw prediction into the list RoG scores.

    A string is split on ``"\\n"`` as is (``topk`` ignored, no de-duplication, empty lines kept); a list goes through
    :func:`extract_topk_prediction`.

    Example:
        >>> prepare_prediction("Paris\\nLyon\\n")
        ['Paris', 'Lyon', '']
        >>> prepare_prediction(["Lyon", "Paris", "Paris"], topk=1)
        ['Paris']
    """
    if isinstance(prediction, str):
        return prediction.split("\n")
    return extract_topk_prediction(list(prediction), topk)


def rog_answer_scores(prediction: str | Sequence[str], answer: Sequence[str], topk: int = -1) -> dict[str, float]:
    """RoG's per-question scores: ``acc``, ``hit``, ``hit1``, ``f1``, ``precision``, ``recall`` (fractions).

    Args:
        prediction: proposed answers, as a list or as RoG's newline-joined string (see :func:`prepare_prediction`).
        answer: gold answers; must not be empty (RoG divides by its length).
        topk: keep the ``topk`` most frequent entries of a list prediction; ``-1`` keeps all.

    Example:
        >>> s = rog_answer_scores(["Paris Texas", "Lyon"], ["Paris", "Texas", "Nice"])
        >>> s["hit"], s["hit1"], round(s["acc"], 4), s["precision"], round(s["f1"], 4)
        (1.0, 1.0, 0.6667, 1.0, 0.8)
    """
    if len(answer) == 0:
        raise ValueError("the gold answer list is empty; RoG's metrics are undefined for it")
    pred = prepare_prediction(prediction, topk)
    joined = normalize(" ".join(pred))
    golds = [normalize(a) for a in answer]
    matched = sum(1 for g in golds if g in joined)
    recall = matched / len(answer)
    acc = recall  # RoG's eval_acc on the joined string is the same computation
    hit = 1.0 if matched > 0 else 0.0
    if not pred:
        return {"acc": acc, "hit": hit, "hit1": 0.0, "f1": 0.0, "precision": 0.0, "recall": 0.0}
    first = normalize(pred[0])
    hit1 = 1.0 if any(g in first for g in golds) else 0.0
    precision = matched / len(pred)
    f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    return {"acc": acc, "hit": hit, "hit1": hit1, "f1": f1, "precision": precision, "recall": recall}


def strict_answer_scores(prediction: str | Sequence[str], answer: Sequence[str], topk: int = -1) -> dict[str, float]:
    """Set-based scores on normalized exact matches: ``f1``, ``precision``, ``recall``, ``em`` (fractions).

    Predictions and golds are normalized with :func:`normalize` and turned into sets; strings that normalize to ``""``
    are dropped. ``em`` is 1 iff the two sets are equal. When both sets are empty every score is 1; when only one is,
    every score is 0.

    Example:
        >>> strict_answer_scores(["Paris Texas", "Lyon"], ["Paris", "Lyon"])
        {'f1': 0.5, 'precision': 0.5, 'recall': 0.5, 'em': 0.0}
        >>> strict_answer_scores("the Lyon\\nParis\\n", ["paris", "Lyon"])["em"]
        1.0
    """
    if len(answer) == 0:
        raise ValueError("the gold answer list is empty")
    pred = {normalize(p) for p in prepare_prediction(prediction, topk)} - {""}
    gold = {normalize(a) for a in answer} - {""}
    if not pred or not gold:
        v = 1.0 if pred == gold else 0.0
        return {"f1": v, "precision": v, "recall": v, "em": v}
    tp = len(pred & gold)
    precision, recall = tp / len(pred), tp / len(gold)
    f1 = 0.0 if tp == 0 else 2 * precision * recall / (precision + recall)
    return {"f1": f1, "precision": precision, "recall": recall, "em": float(pred == gold)}


def answer_scores(prediction: str | Sequence[str], answer: Sequence[str], topk: int = -1) -> dict[str, float]:
    """RoG and strict scores of one question under the keys of :data:`ALL_KEYS`.

    Example:
        >>> answer_scores(["Paris"], ["Paris"])["strict_f1"]
        1.0
    """
    out = rog_answer_scores(prediction, answer, topk)
    strict = strict_answer_scores(prediction, answer, topk)
    out.update(
        strict_f1=strict["f1"], strict_precision=strict["precision"], strict_recall=strict["recall"], em=strict["em"]
    )
    return out


def answer_score_sums(
    predictions: Sequence[str | Sequence[str]], answers: Sequence[Sequence[str]], topk: int = -1
) -> tuple[Tensor, int, int]:
    """Sum the per-question scores of a batch; the reduction the Metric classes accumulate.

    Returns:
        ``(sums, n_scored, n_skipped)``: ``sums`` is a float64 tensor of shape ``(len(ALL_KEYS),)`` in the order of
        :data:`ALL_KEYS`; questions with an empty gold list are skipped and counted in ``n_skipped``.

    Example:
        >>> sums, n, skipped = answer_score_sums([["Paris"], ["Rome"], ["x"]], [["Paris"], ["Lyon"], []])
        >>> sums[:3].tolist(), n, skipped
        ([1.0, 1.0, 1.0], 2, 1)
    """
    if len(predictions) != len(answers):
        raise ValueError(f"got {len(predictions)} predictions for {len(answers)} answer lists")
    sums = [0.0] * len(ALL_KEYS)
    n = skipped = 0
    for pred, ans in zip(predictions, answers):
        if len(ans) == 0:
            skipped += 1
            continue
        scores = answer_scores(pred, ans, topk)
        sums = [s + scores[k] for s, k in zip(sums, ALL_KEYS)]
        n += 1
    return torch.tensor(sums, dtype=torch.float64, device="cpu"), n, skipped  # from strings: the Metric moves it


def rog_answer_metrics(
    predictions: Sequence[str | Sequence[str]], answers: Sequence[Sequence[str]], topk: int = -1
) -> dict[str, Tensor]:
    """Mean RoG and strict scores over questions with a non-empty gold list (fractions, not percentages).

    Example:
        >>> m = rog_answer_metrics([["Paris"], "Rome\\nLyon"], [["Paris"], ["Lyon", "Nice"]])
        >>> round(m["hit"].item(), 4), round(m["f1"].item(), 4), round(m["em"].item(), 4)
        (1.0, 0.75, 0.5)
    """
    sums, n, _ = answer_score_sums(predictions, answers, topk)
    means = sums / n if n else torch.full_like(sums, float("nan"))
    return dict(zip(ALL_KEYS, means.unbind()))


def answer_correctness(prediction: str | Sequence[str], answer: Sequence[str]) -> list[bool]:
    """Per proposed answer: ``True`` iff it RoG-matches any gold (a normalized gold is a substring of it).

    A string prediction is split on ``"\\n"``; nothing is de-duplicated, so the output aligns with the input list.

    Example:
        >>> answer_correctness(["Paris, Texas", "Lyon", ""], ["Paris", "Nice"])
        [True, False, False]
    """
    pred = prediction.split("\n") if isinstance(prediction, str) else list(prediction)
    golds = [normalize(a) for a in answer]
    out = []
    for p in pred:
        np_ = normalize(p)
        out.append(any(g in np_ for g in golds))
    return out
