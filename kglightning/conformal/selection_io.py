"""Scored answers from a predictions jsonl: one score per answer, its label, its group.

A row is a JSON object with ``id``, ``prediction`` (a list of answers, or RoG's newline-joined string) and a score
column aligned with it (by default ``hallucination_logit``, which ``predict`` with a detector writes beside
``hallucination_prob``). The label of each
answer is the row's ``hallucinated`` list when there is one, else whether its
:func:`~kglightning.metrics.functional.qa.answer_key` (NFKC, then RoG's normalisation, which keeps an answer it
would empty) equals the key of no answer of ``ground_truth`` (or ``answer``): the detector's comparison, so that
``select`` and the detector label an answer alike (RoG's substring match, which ``evaluate`` keeps, would call
every answer right for a gold ``"The"`` and ``"Paris, Texas"`` right for ``"Paris"``); a row with neither is unlabelled (fine for the answers to select, not for
calibration). ``group_by`` names a key whose value is a list aligned with the answers (``grounding``) or one value
for the row (``hops``, a dotted path such as ``extra.type``, the LLM that answered).

Rows that hold less, each by one rule:

* no answer (``prediction: ""`` or ``[]``): the question is kept with no answer (its score column ``[]`` or
  absent); it keeps nothing, and in calibration it is no unit (it has no answer to calibrate on). Counted in
  :attr:`ScoredFile.no_answer_rows`. A blank answer *within* a list is an error.
* an empty gold list (``ground_truth: []``, no ``hallucinated``), one of blank strings only (a blank gold is no
  gold), or ``hallucinated: null`` (what the detector writes for a question without gold answers): no answer of the row can be judged right or wrong, so the row is unlabelled; :func:`labelled_part` leaves it out of a calibration set or a pool (counted
  and logged with its line) instead of refusing the whole file. A row with no label field at all is still an
  error in calibration: that file was not labelled.

Problems raise :class:`~kglightning.data.records.RecordError` naming the file, the line and the field; with
``on_bad_record="skip"`` such rows are left out, logged and counted (:attr:`ScoredFile.skipped`).
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from kglightning.conformal.scored import ALL, ScoredAnswers
from kglightning.conformal.selection import AnswerSelector, Selection
from kglightning.data.records import RecordError
from kglightning.data.sources.json_lines import iter_json_lines
from kglightning.metrics.functional.qa import gold_keys, key_hallucinated

log = logging.getLogger(__name__)

Sense = Literal["hallucination", "confidence"]


@dataclass
class ScoredFile:
    """The answers of a file (:class:`ScoredAnswers`, question ``i`` = the ``i``-th kept row), the kept rows, each
    row's answers, whether every row is labelled (and how many are, and the line of the first that is not), and the
    skipped rows' errors; per row whether it is labelled; the line of the first row with no label field at all, the
    lines of the rows whose gold list is empty (or blank), and how many rows have no answer."""

    answers: ScoredAnswers
    rows: list[dict[str, Any]]
    names: list[list[str]]
    labelled: bool
    skipped: list[RecordError] = field(default_factory=list)
    labelled_rows: int = 0
    first_unlabelled: int | None = None
    row_labelled: list[bool] = field(default_factory=list)
    no_label_field: int | None = None
    no_gold_lines: list[int] = field(default_factory=list)
    no_answer_rows: int = 0
    answer_labels: torch.Tensor | None = None  # every answer's label, False in unlabelled rows


def lookup_key(row: dict[str, Any], key: str) -> Any:
    """The value at ``key`` in ``row``, a dotted key reading nested objects (``extra.type``); ``KeyError`` if absent."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def _finite(v: Any) -> bool:
    """A number that is not a boolean and converts to a finite float (a 400-digit integer does not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def group_value(v: Any) -> bool:
    """Whether ``v`` can name a group: a string, a boolean or a finite number."""
    return isinstance(v, (str, bool)) or (isinstance(v, (int, float)) and _finite(v))


def group_name(v: Any) -> str:
    """A group value as a name; a whole float is named as the integer it equals (hops 2 and 2.0 are one group).

    Example:
        >>> group_name(2.0), group_name(2), group_name(2.5), group_name(True)
        ('2', '2', '2.5', 'True')
    """
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _row(
    row: Any, score: str, sense: Sense, group_by: str | None, err
) -> tuple[list[str], list[float], list[bool] | None, list[str] | None, bool]:
    """The row's answers, scores, labels (``None``: unlabelled), groups, and whether its gold list is empty (or
    holds blank strings only)."""
    if not isinstance(row, dict):
        raise err(f"expected a JSON object, got {type(row).__name__}")
    if "id" not in row or isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)) or row["id"] == "":
        raise err("missing, or not a non-empty string or integer", "id")
    pred = row.get("prediction")
    names = ([] if pred == "" else pred.split("\n")) if isinstance(pred, str) else pred
    if not isinstance(names, list) or not all(isinstance(p, str) for p in names):
        raise err("expected a list of strings or a newline-joined string", "prediction")
    blank = [i for i, p in enumerate(names) if not p.strip()]
    if blank:
        raise err(f"answer {blank[0]} is blank", "prediction")
    values = row.get(score, [] if not names else None)
    values = [] if values is None and not names else values  # a row with no answer needs no scores
    if not isinstance(values, list) or len(values) != len(names):
        got = f"{len(values)} values" if isinstance(values, list) else type(values).__name__
        hint = " (no such column: the score column is chosen with --score / score)" if values is None else ""
        raise err(f"expected a list of {len(names)} numbers (one per answer), got {got}{hint}", score)
    bad = [i for i, v in enumerate(values) if not _finite(v)]
    if bad:
        raise err(f"item {bad[0]} is {values[bad[0]]!r}, expected a finite number", score)
    scores = [float(v) if sense == "hallucination" else 1.0 - float(v) for v in values]
    labels: list[bool] | None = None
    if "hallucinated" in row and row["hallucinated"] is None:  # the detector's "no gold answer to label against"
        no_gold = True
    elif "hallucinated" in row:
        lab = row["hallucinated"]
        if not isinstance(lab, list) or len(lab) != len(names) or not all(v in (0, 1) for v in lab):
            raise err(f"expected a list of {len(names)} booleans (one per answer)", "hallucinated")
        labels = [bool(v) for v in lab]
        no_gold = False
    else:
        gold = row.get("ground_truth", row.get("answer"))
        gold = [gold] if isinstance(gold, str) else gold
        if gold is not None and (not isinstance(gold, list) or not all(isinstance(a, str) for a in gold)):
            raise err("expected a list of strings", "ground_truth")
        keys = gold_keys(gold or [])
        if keys:
            labels = key_hallucinated(names, keys)
        no_gold = gold is not None and not keys
    groups: list[str] | None = None
    if group_by is not None:
        try:
            g = lookup_key(row, group_by)
        except KeyError:
            raise err("missing (named by group_by)", group_by) from None
        if isinstance(g, list):
            if len(g) != len(names) or not all(group_value(x) for x in g):
                raise err(f"expected one value per answer ({len(names)}) or one for the row", group_by)
            groups = [group_name(x) for x in g]
        elif group_value(g):
            groups = [group_name(g)] * len(names)
        else:
            raise err(f"expected a string, finite number or boolean, got {type(g).__name__}", group_by)
        if ALL in groups:
            raise err(f"the group name {ALL!r} is reserved for every answer together", group_by)
    return names, scores, labels, groups, no_gold


def read_scored(
    path: str | os.PathLike,
    score: str = "hallucination_logit",
    sense: Sense = "hallucination",
    group_by: str | None = None,
    on_bad_record: Literal["raise", "skip"] = "raise",
) -> ScoredFile:
    """Read the scored answers of a predictions jsonl (see the module docstring).

    Args:
        path: the jsonl file.
        score: the per-answer score column.
        sense: ``"hallucination"`` (higher = more likely wrong) or ``"confidence"`` (higher = more likely right;
            the score used is ``1 - confidence``).
        group_by: the key (dotted for nested objects) whose value groups the answers, or ``None``.
        on_bad_record: ``"raise"`` or ``"skip"`` (logged and counted).

    Raises:
        FileNotFoundError, RecordError: a missing file; a bad row (``"raise"``), a repeated ``id``, no row left.
    """
    source = str(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"{source}: no such file")
    return scored_rows(iter_json_lines(path, source), source, score, sense, group_by, on_bad_record)


def scored_rows(
    items: Iterable[tuple[int, Any]],
    source: str,
    score: str = "hallucination_logit",
    sense: Sense = "hallucination",
    group_by: str | None = None,
    on_bad_record: Literal["raise", "skip"] = "raise",
) -> ScoredFile:
    """:func:`read_scored` over ``(line, row)`` pairs already in memory (a row may be a :class:`RecordError`)."""
    if sense not in ("hallucination", "confidence"):
        raise ValueError(f"sense must be 'hallucination' or 'confidence', got {sense!r}")
    scores: list[float] = []
    question: list[int] = []
    labels: list[bool] = []
    groups: list[str] = []
    rows, names, skipped, seen, keys = [], [], [], {}, []
    labelled, labelled_rows, first_unlabelled = True, 0, None
    row_labelled, no_label_field, no_gold_lines, no_answer_rows = [], None, [], 0
    for line, raw in items:

        def err(message: str, name: str | None = None, line: int = line) -> RecordError:
            return RecordError(message, source=source, line=line, field=name)

        try:
            if isinstance(raw, RecordError):
                raise raw
            ans, s, y, g, no_gold = _row(raw, score, sense, group_by, err)
            key = str(raw["id"])
            if key in seen:
                raise err(f"duplicate id {raw['id']!r} (first seen at line {seen[key]})", "id")
        except RecordError as e:
            if on_bad_record == "raise":
                raise
            skipped.append(e)
            log.warning("skipping scored row: %s", e)
            continue
        seen[key] = line
        question += [len(rows)] * len(ans)
        rows.append(raw)
        names.append(ans)
        scores += s
        labelled = labelled and y is not None
        labelled_rows += y is not None
        no_gold_lines += [line] if no_gold else []
        no_answer_rows += not ans
        row_labelled.append(y is not None)
        first_unlabelled = line if y is None and first_unlabelled is None else first_unlabelled
        unfit = y is None and not no_gold and no_label_field is None  # no label field at all
        no_label_field = line if unfit else no_label_field
        keys += [f"{key}#{i}" for i in range(len(ans))]
        labels += y if y is not None else [False] * len(ans)
        groups += g if g is not None else []
    if skipped:
        why = Counter(f"field '{e.field}'" if e.field else e.reason for e in skipped)
        log.warning("skipped %d rows of %s: %s", len(skipped), source, ", ".join(f"{n} x {r}" for r, n in why.items()))
    if not rows:
        raise RecordError("no scored rows (the file is empty, or every row was skipped)", source=source)
    label_tensor = torch.tensor(labels, dtype=torch.bool, device="cpu")
    answers = ScoredAnswers(
        torch.tensor(scores, dtype=torch.float64, device="cpu"),
        torch.tensor(question, dtype=torch.long, device="cpu"),
        groups if group_by is not None else None,
        label_tensor if labelled else None,
        keys,
    )
    if no_answer_rows:
        log.info("%s: %d of %d rows have no answer (they keep nothing)", source, no_answer_rows, len(rows))
    return ScoredFile(
        answers, rows, names, labelled, skipped, labelled_rows, first_unlabelled, row_labelled, no_label_field,
        no_gold_lines, no_answer_rows, label_tensor,
    )  # fmt: skip


def labelled_part(scored: ScoredFile, source: str, what: str = "calibration") -> ScoredAnswers:
    """The labelled rows' answers, to calibrate on (or to split, ``what="pool"``).

    A row whose gold list is empty (or blank) is left out (logged, with the count and the first line); a row with no label
    field at all is an error naming its line (the file was not labelled), and so is a file with no labelled row.
    """
    if scored.no_label_field is not None:
        raise RecordError(
            f"every {what} row needs labels ('hallucinated', or gold answers); this one has none",
            source=source, line=scored.no_label_field, field="hallucinated",
        )  # fmt: skip
    if scored.labelled:
        return scored.answers
    if not scored.labelled_rows:
        raise RecordError(f"no {what} row has a gold answer to judge its answers by", source=source)
    log.warning(
        "%s: left %d of %d %s rows out, whose gold answer list is empty or blank (no answer can be judged right or "
        "wrong; "
        "first at line %d); the guarantee is for questions drawn like the labelled ones",
        source, len(scored.no_gold_lines), len(scored.rows), what, scored.no_gold_lines[0],
    )  # fmt: skip
    return _rows_subset(scored, scored.row_labelled)


def _rows_subset(scored: ScoredFile, keep_rows: list[bool]) -> ScoredAnswers:
    """The answers of the rows where ``keep_rows`` is true, with labels (every kept row must have them)."""
    counts = [len(n) for n in scored.names]
    mask = torch.tensor([k for k, c in zip(keep_rows, counts) for _ in range(c)], dtype=torch.bool, device="cpu")
    a, picked = scored.answers, mask.tolist()
    return ScoredAnswers(
        a.scores[mask],
        a.question[mask],
        [g for g, m in zip(a.group, picked) if m] if a.group is not None else None,
        scored.answer_labels[mask],  # type: ignore[index]
        [k for k, m in zip(a.keys, picked) if m] if a.keys is not None else None,
    )


def json_number(x: Any) -> Any:
    """``x`` as strict JSON allows: a non-finite float becomes ``"inf"``, ``"-inf"`` or ``None`` (NaN), recursively
    through dicts and lists."""
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: json_number(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_number(v) for v in x]
    return x


def selected_rows(
    rows: list[dict[str, Any]], names: list[list[str]], answers: ScoredAnswers, selection: Selection,
    selector: AnswerSelector,
) -> list[dict[str, Any]]:  # fmt: skip
    """Each row with what the selection did to its answers: ``kept`` (in their order), ``kept_scores``, ``kept_paths``
    (when the row has ``cited_paths``, one list of paths per answer), ``dropped``, ``abstained`` (no answer kept) and
    ``selection`` (the rule, alpha and the cut of each of the row's groups)."""
    keep, scores, groups = selection.keep.tolist(), answers.scores.tolist(), answers.groups()
    out, i = [], 0
    for row, ans in zip(rows, names):
        mine = range(i, i + len(ans))
        i += len(ans)
        cuts = {g: json_number(selection.groups[g].cut) for g in dict.fromkeys(groups[j] for j in mine)}
        out.append(
            {
                **row,
                "kept": [ans[j - mine.start] for j in mine if keep[j]],
                "kept_scores": [scores[j] for j in mine if keep[j]],
                **(
                    {"kept_paths": [row["cited_paths"][j - mine.start] for j in mine if keep[j]]}
                    if isinstance(row.get("cited_paths"), list) and len(row["cited_paths"]) == len(ans)
                    else {}
                ),  # fmt: skip
                "dropped": [ans[j - mine.start] for j in mine if not keep[j]],
                "abstained": not any(keep[j] for j in mine),
                "selection": {"rule": selector.rule, "alpha": selector.alpha, "cuts": cuts},
            }
        )
    return out
