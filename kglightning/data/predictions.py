"""The one reader of predictions jsonl files, for every command that takes one (``evaluate``, ``conformalize``, ...).

A predictions file holds one JSON object per line, in the RoG / GNN-RAG form::

    {"id": "WebQTest-0", "question": "...", "prediction": "Paris\\nLyon" or ["Paris", "Lyon"],
     "ground_truth": ["Paris"], "confidence": [0.9, 0.2] or {"Paris": 0.9, "Lyon": 0.2}}

``ground_truth`` falls back to ``answer`` (kglightning's record format); a bare string is one answer. ``confidence``
is optional: a list aligned with the list ``prediction`` (or with the lines of a string prediction), or an object
answer → confidence that covers every non-blank proposed answer. Any other key is kept in :attr:`PredictionLine.row`.

Problems are reported as the record loader (:func:`~kglightning.data.sources.loaders.read_records`) reports them:
a :class:`~kglightning.data.records.RecordError` reading ``FILE:LINE: field 'NAME' what is wrong``. Bytes that are
not UTF-8, invalid JSON, a row that is not an object, a missing or mistyped field, a repeated ``id`` (the message
names both lines) and a file with no rows at all are all errors. With ``on_bad_record="skip"`` a bad row is left
out instead, logged at WARNING and kept in :attr:`PredictionList.skipped`; nothing is dropped silently.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kglightning.data.records import RecordError
from kglightning.data.sources.json_lines import decode_json_line
from kglightning.data.sources.loaders import _iter_jsonl

__all__ = [
    "PredictionLine",
    "PredictionList",
    "add_on_bad_record_argument",
    "parse_prediction_line",
    "read_predictions",
]

logger = logging.getLogger(__name__)


def _unit_float(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= 1


def _answers(value: Any) -> list[str]:
    """The proposed answers a confidence is aligned with: the lines of a string, or the list itself."""
    return value.split("\n") if isinstance(value, str) else list(value)


@dataclass
class PredictionLine:
    """One validated row of a predictions file.

    Args:
        id: the question id, a string or an integer, as written in the file.
        prediction: the proposed answers: a list of strings, or RoG's newline-joined string.
        ground_truth: the gold answers (from ``ground_truth``, else ``answer``); may be empty.
        confidence: one number in ``[0, 1]`` per proposed answer (a list), an object answer → number, or ``None``.
        line: the 1-based line in the file (``0`` when unknown).
        row: the whole JSON object, every key included, for commands that pass rows through.
    """

    id: str | int
    prediction: str | list[str]
    ground_truth: list[str]
    confidence: list[float] | dict[str, float] | None
    line: int
    row: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(
        cls,
        data: Any,
        *,
        source: str = "<predictions>",
        line: int | None = None,
        require_confidence: bool = False,
        require_gold: bool = True,
    ) -> PredictionLine:
        """Validate one parsed row; raise :class:`RecordError` naming ``source``, ``line`` and the field.

        Example:
            >>> PredictionLine.from_dict({"id": "q1", "prediction": "a\\nb", "answer": "a"}).ground_truth
            ['a']
        """

        def err(message: str, name: str | None = None) -> RecordError:
            return RecordError(message, source=source, line=line, field=name)

        if not isinstance(data, dict):
            raise err(f"expected a JSON object, got {type(data).__name__}")
        if "id" not in data:
            raise err("missing required field", "id")
        rid = data["id"]
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
            raise err(f"expected a non-empty string or an integer, got {rid!r}", "id")
        if "prediction" not in data:
            raise err("missing required field", "prediction")
        pred = data["prediction"]
        if isinstance(pred, list):
            bad = [i for i, p in enumerate(pred) if not isinstance(p, str)]
            if bad:
                item = pred[bad[0]]
                raise err(f"item {bad[0]} is {type(item).__name__} ({item!r}), expected a string", "prediction")
        elif not isinstance(pred, str):
            raise err(f"expected a string or a list of strings, got {type(pred).__name__}", "prediction")
        name = "ground_truth" if "ground_truth" in data else "answer"
        if name not in data and require_gold:
            raise err("missing required field (or its fallback 'answer')", "ground_truth")
        gold = data.get(name, [])
        if isinstance(gold, str):  # as for records: a bare string is one answer
            gold = [gold]
        if gold is None:
            raise err("is null, expected a list of strings", name)
        if not isinstance(gold, list) or not all(isinstance(a, str) for a in gold):
            raise err(f"expected a list of strings, got {type(gold).__name__}", name)
        conf = data.get("confidence")
        answers = _answers(pred)
        if isinstance(conf, dict):
            bad_keys = [k for k, v in conf.items() if not _unit_float(v)]
            if bad_keys:
                raise err(
                    f"value for {bad_keys[0]!r} is {conf[bad_keys[0]]!r}, expected a number in [0, 1]", "confidence"
                )
            missing = [p for p in answers if p.strip() and p not in conf]
            if missing:
                raise err(f"has no value for predicted answer {missing[0]!r}", "confidence")
        elif isinstance(conf, list):
            if len(conf) != len(answers):
                raise err(f"has {len(conf)} values for {len(answers)} predictions", "confidence")
            bad_i = [i for i, v in enumerate(conf) if not _unit_float(v)]
            if bad_i:
                raise err(f"item {bad_i[0]} is {conf[bad_i[0]]!r}, expected a number in [0, 1]", "confidence")
        elif conf is not None:
            raise err(
                f"expected a list of numbers or an object answer -> number, got {type(conf).__name__}", "confidence"
            )
        elif require_confidence:
            raise err("missing: this command needs a confidence per answer", "confidence")
        return cls(rid, pred, gold, conf, line if line is not None else 0, data)


def parse_prediction_line(
    text: str, source: str = "<predictions>", line: int | None = None, *, require_confidence: bool = False
) -> PredictionLine:
    """Parse and validate one jsonl line (see :meth:`PredictionLine.from_dict`).

    Example:
        >>> try:
        ...     parse_prediction_line('{"id": "q1", "prediction": 3, "answer": ["a"]}', "p.jsonl", 7)
        ... except RecordError as e:
        ...     print(e)
        p.jsonl:7: field 'prediction' expected a string or a list of strings, got int
    """
    data = decode_json_line(text, source=source, line=line)  # type: ignore[arg-type]  # None: no line in the message
    return PredictionLine.from_dict(data, source=source, line=line, require_confidence=require_confidence)


class PredictionList(list):
    """A ``list[PredictionLine]`` that remembers its file and the rows that were skipped.

    Attributes:
        source: the file the rows were read from.
        skipped: one :class:`RecordError` per skipped row (``on_bad_record="skip"``).
    """

    def __init__(self, rows: list[PredictionLine] | None = None, *, source: str = "<memory>"):
        super().__init__(rows or [])
        self.source = source
        self.skipped: list[RecordError] = []

    def summary(self) -> str:
        """One line: rows kept and skipped.

        Example:
            >>> PredictionList(source="p.jsonl").summary()
            'p.jsonl: 0 predictions kept, 0 skipped'
        """
        return f"{self.source}: {len(self)} predictions kept, {len(self.skipped)} skipped"


def read_predictions(
    path: str | os.PathLike,
    *,
    on_bad_record: Literal["raise", "skip"] = "raise",
    require_confidence: bool = False,
    require_gold: bool = True,
) -> PredictionList:
    """Read and validate a predictions jsonl file (blank lines are ignored; see the module docstring).

    Args:
        path: the jsonl file (any suffix is read as jsonl).
        on_bad_record: ``"raise"`` the first :class:`RecordError`, or ``"skip"`` bad rows (each logged at WARNING,
            plus a summary; they are listed in :attr:`PredictionList.skipped`).
        require_confidence: a row without ``confidence`` is bad too (commands that need one per answer).
        require_gold: a row without ``ground_truth`` (or ``answer``) is bad; ``False`` reads it with no gold answers
            (new questions to predict on: ``conformalize``'s test file). A ``null`` one is bad either way.

    Returns:
        The rows in file order, never empty.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is a directory, or ``on_bad_record`` is unknown.
        RecordError: a bad row (in ``"raise"`` mode), or no row to return (an empty file, or every row skipped).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "p.jsonl")
        >>> with open(p, "w") as f:
        ...     _ = f.write('{"id": "q1", "prediction": ["a"], "answer": ["a"]}\\n{"id": "q1", "prediction": [], '
        ...                 '"answer": []}\\n')
        >>> try:
        ...     read_predictions(p)
        ... except RecordError as e:
        ...     print(e.line, e.field, e.reason)
        2 id duplicate id 'q1' (first seen at line 1)
        >>> [r.id for r in read_predictions(p, on_bad_record="skip")]
        ['q1']
    """
    if on_bad_record not in ("raise", "skip"):
        raise ValueError(f"on_bad_record must be 'raise' or 'skip', got {on_bad_record!r}")
    p = Path(path)
    source = str(path)
    if not p.exists():
        raise FileNotFoundError(f"{source}: no such file")
    if p.is_dir():
        raise ValueError(f"{source}: is a directory, expected a predictions jsonl file")
    out = PredictionList(source=source)
    first_seen: dict[str, int] = {}
    for line, raw in _iter_jsonl(p, source):
        try:
            if isinstance(raw, RecordError):
                raise raw
            rec = PredictionLine.from_dict(
                raw, source=source, line=line, require_confidence=require_confidence, require_gold=require_gold
            )
            key = str(rec.id)  # 7 and "7" are one question, as records read both as "7"
            if key in first_seen:
                raise RecordError(
                    f"duplicate id {rec.id!r} (first seen at line {first_seen[key]})",
                    source=source,
                    line=line,
                    field="id",
                )
        except RecordError as e:
            if on_bad_record == "raise":
                raise
            out.skipped.append(e)
            logger.warning("skipping prediction row: %s", e)
            continue
        first_seen[key] = line
        out.append(rec)
    n_read = len(out) + len(out.skipped)
    if out.skipped:
        reasons = Counter(f"field '{e.field}'" if e.field else e.reason.split(":")[0] for e in out.skipped)
        why = ", ".join(f"{n} x {r}" for r, n in reasons.most_common())
        logger.warning("skipped %d of %d rows from %s: %s", len(out.skipped), n_read, source, why)
    if not out:
        if n_read == 0:
            raise RecordError("no predictions: the file is empty (or holds only blank lines)", source=source)
        raise RecordError(f"no valid predictions: all {n_read} rows skipped (first: {out.skipped[0]})", source=source)
    return out


def add_on_bad_record_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--on-bad-record raise|skip`` option of every command that reads a predictions file."""
    parser.add_argument(
        "--on-bad-record",
        "--on_bad_record",
        choices=("raise", "skip"),
        default="raise",
        help="stop at the first malformed line (default) or skip such lines, each logged and counted",
    )
