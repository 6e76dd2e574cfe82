"""GCR's predictions: k beams per question, each a reasoning path on the KG and the answer it leads to.

GCR (graph-constrained reasoning) writes a ``predictions.jsonl`` with ``id``, ``question``, ``ground_truth`` (the gold
answers) and ``prediction``: a list of k beams (repeats included: they are votes), each the text::

    # Reasoning Path:
    Jamaica -> location.country.languages_spoken -> Jamaican English
    # Answer:
    Jamaican English

:func:`gcr_answers` makes each beam's answer one entry of the record's ``prediction`` (an answer part of several
non-empty lines gives one entry per line, each citing the same path) and its path the matching entry of
``prediction_paths``. A path that does not parse (an even number of ``" -> "`` parts, an empty part, none at all)
is kept out (the entry is ``[]``) and counted; a beam with no ``# Answer:`` part is counted and skipped. Without a
records folder, :func:`record_from_gcr` builds the record's graph from the paths GCR wrote.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kglightning.data.records import KGQARecord
from kglightning.data.sources.prediction_lines import (
    ImportStats,
    field_of,
    gold_answers,
    parse_path,
    question_id,
    record_from_paths,
)

__all__ = ["ANSWER_HEADER", "PATH_HEADER", "beam_parts", "gcr_answers", "is_gcr_row", "parse_beam", "record_from_gcr"]

ANSWER_HEADER = "# Answer:"
PATH_HEADER = "# Reasoning Path:"
_HEADERS = re.compile(f"({re.escape(ANSWER_HEADER)}|{re.escape(PATH_HEADER)})")
ORIGIN = "reasoning paths GCR wrote"


def is_gcr_row(row: dict[str, Any]) -> bool:
    """Whether a line looks like GCR's: a beam (a string that begins with ``# Reasoning Path:``; one cut short before
    its ``# Answer:`` is a beam without an answer, counted), or a list holding one (GCR writes a single beam as a
    string). An answer that merely mentions ``# Answer:`` is not a beam."""
    beams = row.get("prediction")
    if isinstance(beams, str):
        return _is_beam(beams)
    return isinstance(beams, list) and any(_is_beam(b) for b in beams)


def _is_beam(text: object) -> bool:
    return isinstance(text, str) and text.lstrip().startswith(PATH_HEADER)


def beam_parts(text: str) -> list[tuple[list[str], list[str]]]:
    """A beam's parts, each ``(path lines, answers)``: the non-empty lines of a ``# Reasoning Path:`` part (GCR's
    ``<PATH>``/``</PATH>`` marks taken off; without a ``# Reasoning Path:`` header, the lines before ``# Answer:``
    are the path) and of the ``# Answer:`` part after it. A header may stand anywhere in a line (the text after it
    counts). A header repeated inside an answer part (GCR wrote ``# Answer:\\n# Answer:\\n...`` for some WebQSP
    questions) is a header, never an answer; a ``# Reasoning Path:`` after an answer starts the next part, whose
    answers cite its own paths. Parts without an answer are left out.

    Example:
        >>> beam_parts("# Reasoning Path:\\nA -> r -> B\\n# Answer:\\nB\\n# Reasoning Path:\\nA -> s -> C\\n# Answer: C")
        [(['A -> r -> B'], ['B']), (['A -> s -> C'], ['C'])]
    """
    parts: list[tuple[list[str], list[str]]] = [([], [])]
    # the text before a first "# Reasoning Path:" is not a path (a preamble); without one, it is the path
    target: list[str] | None = None if PATH_HEADER in text.partition(ANSWER_HEADER)[0] else parts[-1][0]
    for piece in _HEADERS.split(text):  # the parts between headers, wherever a header stands in its line
        if piece == PATH_HEADER:
            if parts[-1][1]:  # a path after an answer: the next part
                parts.append(([], []))
            target = parts[-1][0]
            continue
        if piece == ANSWER_HEADER:
            target = parts[-1][1]
            continue
        for raw in piece.split("\n"):
            line = raw.strip()
            if target is parts[-1][0]:
                line = line.removeprefix("<PATH>").removesuffix("</PATH>").strip()
            if line and target is not None:
                target.append(line)
    return [(paths, answers) for paths, answers in parts if answers]


def parse_beam(text: str) -> tuple[list[str], list[str]] | None:
    """A beam's ``(path lines, answers)`` over all its parts (:func:`beam_parts`), or ``None`` when it has no
    ``# Answer:`` part or only empty ones.

    Example:
        >>> parse_beam("# Reasoning Path:\\nJamaica -> lang.spoken -> Jamaican English\\n# Answer:\\nJamaican English")
        (['Jamaica -> lang.spoken -> Jamaican English'], ['Jamaican English'])
        >>> parse_beam("# Reasoning Path:\\nJamaica -> lang.spoken -> Jamaican English") is None
        True
        >>> parse_beam("# Reasoning Path:\\nA -> r -> B\\n# Answer:\\n# Answer:\\nB")
        (['A -> r -> B'], ['B'])
    """
    parts = beam_parts(text)
    if not parts:
        return None
    return [line for paths, _ in parts for line in paths], [a for _, answers in parts for a in answers]


def gcr_answers(
    beams: str | Sequence[Any], stats: ImportStats | None = None
) -> tuple[list[str], list[list[list[str]]]]:
    """``(prediction, prediction_paths)`` of a line's beams, aligned: one entry per answer, in beam order, repeats
    kept (a bare string is one beam).

    Example:
        >>> beam = "# Reasoning Path:\\nA -> r -> B\\n# Answer:\\nB"
        >>> gcr_answers([beam, beam, "# Reasoning Path:\\nA -> r\\n# Answer:\\nC", "no answer"])
        (['B', 'B', 'C'], [[['A', 'r', 'B']], [['A', 'r', 'B']], []])
    """
    prediction: list[str] = []
    cited: list[list[list[str]]] = []
    for beam in [beams] if isinstance(beams, str) else beams:
        if not isinstance(beam, str):
            if stats is not None:
                stats.non_string_items += 1
            continue
        if stats is not None:
            stats.beams += 1
        parts = beam_parts(beam)
        if not parts:
            if stats is not None:
                stats.beams_without_answer += 1
            continue
        for path_lines, answers in parts:  # each part's answers cite that part's paths
            paths = _parsed_paths(path_lines, stats)
            if stats is not None:
                stats.cited_paths += len(paths)
                stats.answers += len(answers)
            prediction += answers
            cited += [[list(p) for p in paths] for _ in answers]
    return prediction, cited


def _parsed_paths(path_lines: list[str], stats: ImportStats | None) -> list:
    """The paths of a part's lines that parse; no path at all counts as one that did not parse."""
    paths = []
    for text in path_lines or [""]:
        path = parse_path(text)
        if path is None:
            if stats is not None:
                stats.unparsed_paths += 1
                stats.example("unparsed", text)
            continue
        paths.append(path)
    return paths


def record_from_gcr(row: dict[str, Any], *, source: str = "<record>", line: int | None = None,
                    stats: ImportStats | None = None) -> KGQARecord:  # fmt: skip
    """One GCR line (``id``, ``question``, ``prediction`` beams, ``ground_truth``) as a record whose graph is the
    union of the triples of the paths its beams cite, validated as
    :func:`~kglightning.data.sources.loaders.read_records` will read it back.

    Raises:
        RecordError: naming the source, the line and the field.
    """
    qid = question_id(row, source=source, line=line)
    question = field_of(row, "question", str, source=source, line=line)
    beams = field_of(row, "prediction", (str, list), source=source, line=line)
    gold = gold_answers(row, source=source, line=line)
    prediction, cited = gcr_answers(beams, stats)
    graph_paths = [p for paths in cited for p in paths]
    return record_from_paths(qid, question, gold, graph_paths, prediction, cited, origin=ORIGIN, source=source,
                             line=line, stats=stats)  # fmt: skip
