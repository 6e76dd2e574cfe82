"""Question-answering records over text passages (HotpotQA style), for methods that read documents (SGIC).

One record per line (``.jsonl``; ``.json``, ``.parquet``, dataset folders and ``hf:`` as for KG records) with
``question``, ``answer`` (a string or a list of accepted strings), ``context`` and an optional ``id`` (default:
``"<split>:line-<n>"``, the split named, or else the file's stem, so that files without ids never share one). ``context`` may be a list of passages as strings, HotpotQA's list of ``[title, sentences]`` pairs, or the
Hugging Face ``hotpot_qa`` mapping ``{"title": [...], "sentences": [[...], ...]}``; a titled passage becomes
``"title: sentence sentence ..."``.

Example:
    >>> import json, os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "dev.jsonl")
    >>> with open(p, "w") as f:
    ...     _ = f.write(json.dumps({"id": "h1", "question": "Who wrote Emma?", "answer": "Jane Austen",
    ...         "context": [["Emma (novel)", ["Emma is a novel", " by Jane Austen."]], "An unrelated passage."]}) + "\\n")
    >>> [(e.id, e.answer, e.documents) for e in read_passage_examples(p)]
    [('h1', ['Jane Austen'], ['Emma (novel): Emma is a novel by Jane Austen.', 'An unrelated passage.'])]
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kglightning.data.records import RecordError
from kglightning.data.sources.loaders import _open

__all__ = ["PassageExample", "read_passage_examples"]

log = logging.getLogger(__name__)


@dataclass
class PassageExample:
    """A question with its accepted answers and its documents (text passages or verbalized KG evidence)."""

    id: str
    question: str
    answer: list[str]
    documents: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


def _passage(item: Any, err) -> str:
    if isinstance(item, str):
        return " ".join(item.split())
    if isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str):
        sentences = item[1] if isinstance(item[1], (list, tuple)) else [item[1]]
        if all(isinstance(s, str) for s in sentences):
            return f"{item[0]}: {' '.join(''.join(sentences).split())}"
    raise err("each passage must be a string or a [title, sentences] pair", "context")


def _documents(context: Any, err) -> list[str]:
    if isinstance(context, Mapping) and "title" in context and "sentences" in context:
        titles, sentences = context["title"], context["sentences"]
        if not isinstance(titles, list) or not isinstance(sentences, list) or len(titles) != len(sentences):
            raise err("'title' and 'sentences' must be lists of the same length", "context")
        context = [[t, s] for t, s in zip(titles, sentences)]
    if not isinstance(context, list):
        raise err(f"expected a list of passages, got {type(context).__name__}", "context")
    return [_passage(item, err) for item in context]


def _example(raw: Any, source: str, line: int, prefix: str) -> PassageExample:
    def err(message: str, name: str | None = None) -> RecordError:
        return RecordError(message, source=source, line=line, field=name)

    if not isinstance(raw, Mapping):
        raise err(f"expected a JSON object, got {type(raw).__name__}")
    for key in ("question", "answer", "context"):
        if key not in raw:
            raise err("missing", key)
    question, answer = raw["question"], raw["answer"]
    if not isinstance(question, str) or not question.strip():
        raise err("must be a non-empty string", "question")
    answers = [answer] if isinstance(answer, str) else answer
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise err("must be a non-empty string or a non-empty list of non-empty strings", "answer")
    ident = raw.get("id", raw.get("_id", f"{prefix}:line-{line}"))
    keep = {k: v for k, v in raw.items() if k not in ("id", "_id", "question", "answer", "context")}
    return PassageExample(str(ident), question.strip(), list(answers), _documents(raw["context"], err), keep)


def read_passage_examples(
    path: str | os.PathLike,
    *,
    split: str | None = None,
    on_bad_record: Literal["raise", "skip"] = "raise",
    limit: int | None = None,
    id_prefix: str | None = None,
) -> list[PassageExample]:
    """Read and check passage records (see the module docstring).

    ``id_prefix`` names the records without an id (``"<id_prefix>:line-<n>"``; default: ``split``, else the file's
    stem): a data module passes its split, so that two split files without ids never give two questions one id.

    Raises:
        RecordError: a bad record naming the file, the line and the field (``on_bad_record="raise"``), a duplicate
            id, or a file with no record. With ``"skip"``, bad records are logged and counted instead.
    """
    if on_bad_record not in ("raise", "skip"):
        raise ValueError(f"on_bad_record must be 'raise' or 'skip', got {on_bad_record!r}")
    source, rows, _ = _open(path, split)
    prefix = id_prefix or split or Path(str(path)).stem
    out: list[PassageExample] = []
    seen: set[str] = set()
    skipped = 0
    for line, raw in rows:
        if limit is not None and len(out) >= limit:
            break
        try:
            if isinstance(raw, RecordError):
                raise raw
            ex = _example(raw, source, line, prefix)
            if ex.id in seen:
                raise RecordError(f"duplicate id {ex.id!r}", source=source, line=line, field="id")
        except RecordError as e:
            if on_bad_record == "raise":
                raise
            skipped += 1
            log.warning("skipping record: %s", e)
            continue
        seen.add(ex.id)
        out.append(ex)
    if skipped:
        log.warning("skipped %d of %d passage records from %s", skipped, skipped + len(out), source)
    if not out:
        raise RecordError("holds no valid passage record", source=source)
    return out
