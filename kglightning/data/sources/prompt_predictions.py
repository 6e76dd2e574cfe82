"""RoG / GNN-RAG predictions whose prompts list the reasoning paths the LLM was given.

RoG and GNN-RAG write one jsonl line per question: ``id``, ``question``, ``prediction`` (the LLM's reply, one answer
per line), ``ground_truth`` (the gold answers) and ``input`` (the prompt), whose ``Reasoning Paths:`` block holds one
path per line, ``entity -> relation -> entity -> relation -> entity``. Those paths are the subgraph the LLM saw:
:func:`record_from_prompt` turns a line into a :class:`~kglightning.data.records.KGQARecord` whose ``graph`` is the
paths' triples, whose ``q_entity`` are the paths' first entities and whose ``prediction`` is the reply's lines, so
the detector (``DetectionDataModule``) can label and score every answer the LLM gave. The command that writes such
records is ``kglightning import-predictions`` (:mod:`~kglightning.data.sources.predictions_import`).
"""

from __future__ import annotations

import os
from typing import Any

from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.sources.prediction_lines import (
    ImportStats,
    field_of,
    gold_answers,
    parse_path,
    question_id,
    read_json_objects,
    record_from_paths,
    split_reply,
)

__all__ = [
    "PATHS_HEADER",
    "QUESTION_HEADER",
    "is_prompt_row",
    "parse_reasoning_paths",
    "read_prompt_predictions",
    "record_from_prompt",
]

PATHS_HEADER = "Reasoning Paths:"
QUESTION_HEADER = "Question:"
ORIGIN = "reasoning paths of the prompt"


def is_prompt_row(row: dict[str, Any]) -> bool:
    """Whether a line looks like RoG / GNN-RAG's: an ``input`` prompt with a ``Reasoning Paths:`` block."""
    return isinstance(row.get("input"), str) and PATHS_HEADER in row["input"]


def parse_reasoning_paths(prompt: str, stats: ImportStats | None = None) -> list[list[str]]:
    """The paths of a prompt's ``Reasoning Paths:`` block, each as ``[e0, r1, e1, r2, e2, ...]``.

    The block runs from the header (text after it on its line is a path too) to a line that starts with
    ``Question:`` (or the end); blank lines in it are skipped. A line that does not alternate entities and relations (an even number of ``" -> "``-separated parts,
    or fewer than 3, as when a name holds a line break) is skipped and counted in ``stats``.

    Example:
        >>> parse_reasoning_paths("Reasoning Paths:\\nJamaica -> lang.spoken -> Jamaican English\\n\\nQuestion:\\n...")
        [['Jamaica', 'lang.spoken', 'Jamaican English']]
    """
    start = prompt.find(PATHS_HEADER)
    if start < 0:
        return []
    out = []
    for line in prompt[start + len(PATHS_HEADER) :].split("\n"):  # [0]: the rest of the header's line, a path too
        if line.strip().startswith(QUESTION_HEADER):  # "Question:" alone, or with the question on its line
            break
        if not line.strip():
            continue
        parts = parse_path(line)
        if parts is None:
            if stats is not None:
                stats.malformed_paths += 1
                stats.example("malformed", line)
            continue
        out.append(parts)
    if stats is not None:
        stats.paths += len(out)
    return out


def record_from_prompt(row: dict[str, Any], *, source: str = "<record>", line: int | None = None,
                       stats: ImportStats | None = None) -> KGQARecord:  # fmt: skip
    """One predictions line (``id``, ``question``, ``prediction``, ``ground_truth``, ``input``) as a RoG record,
    validated as :func:`~kglightning.data.sources.loaders.read_records` will read it back.

    Raises:
        RecordError: naming the source, the line and the field, when one is missing or of the wrong type, or when
            the record would not be read back (an empty question).
    """
    qid = question_id(row, source=source, line=line)
    question = field_of(row, "question", str, source=source, line=line)
    reply = field_of(row, "prediction", (str, list), source=source, line=line)
    gold = gold_answers(row, source=source, line=line)
    prompt = field_of(row, "input", str, source=source, line=line)
    paths = parse_reasoning_paths(prompt, stats)
    prediction = split_reply(reply, stats)
    if stats is not None:
        stats.answers += len(prediction)
    return record_from_paths(qid, question, gold, paths, prediction, origin=ORIGIN, source=source, line=line,
                             stats=stats)  # fmt: skip


def read_prompt_predictions(path: str | os.PathLike, stats: ImportStats | None = None) -> list[KGQARecord]:
    """Every line of a RoG / GNN-RAG ``predictions.jsonl`` as a record (see :func:`record_from_prompt`).

    Raises:
        RecordError: naming the file and the line: a line that cannot be read, a bad field, a repeated ``id``.
    """
    out: list[KGQARecord] = []
    first_line: dict[str, int] = {}
    for i, row in read_json_objects(path, stats):
        record = record_from_prompt(row, source=str(path), line=i, stats=stats)
        if record.id in first_line:
            raise RecordError(f"repeats id {record.id!r} of line {first_line[record.id]}", source=str(path), line=i,
                              field="id")  # fmt: skip
        first_line[record.id] = i
        out.append(record)
    return out
