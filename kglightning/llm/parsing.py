"""Robust parsing of a reasoner's ``{answer: confidence}`` output (grounding to entities: :mod:`.grounding`).

The DoublyCal reasoner prompts (App. C) ask for ``{<answer_1>: <confidence_1>,...,<answer_k>: <confidence_k>}``.
Real outputs drift from that: code fences, single quotes, unquoted keys (the paper's own example has them),
prose around the object, JSON lines, a list of ``{"answer": ..., "confidence": ...}`` records, percentages,
numbers as strings, confidences outside ``[0, 1]``, answers without a confidence. :func:`parse_answers` accepts
all of these and records every departure that changes the meaning as an *issue*; an output from which nothing can
be read is an abstention (no answers), never an exception. :class:`~kglightning.evidence.parse_stats.ParseStats`
(re-exported here) counts issues over a whole run; :mod:`kglightning.evidence.format` uses it too.

The module needs only the standard library.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kglightning.evidence.parse_stats import ParseStats

# issues of parse_answers (one entry per occurrence)
EMPTY_OUTPUT = "empty_output"  #: the output is empty or blank
NO_STRUCTURE = "no_structure"  #: nothing in the output reads as answers (an abstention)
NO_ANSWERS = "no_answers"  #: a structure was read but holds no answer (e.g. ``{}``)
MISSING_CONFIDENCE = "missing_confidence"  #: an answer without a confidence (kept, confidence ``None``)
INVALID_CONFIDENCE = "invalid_confidence"  #: a confidence that is not a number (kept, confidence ``None``)
CONFIDENCE_CLIPPED = "confidence_clipped"  #: a confidence outside ``[0, 1]``, clipped into it
EMPTY_ANSWER = "empty_answer"  #: an empty or null answer (dropped)
INVALID_ANSWER = "invalid_answer"  #: an answer that is a list or an object (dropped)
DUPLICATE_ANSWER = "duplicate_answer"  #: an answer given twice (the higher confidence is kept)
PATH_ANSWER = "path_answer"  #: a reasoning path echoed as the answer (``a -> r -> b``): its last entity is kept

_ANSWER_KEYS = ("answer", "answers", "prediction", "entity", "name")
_CONF_KEYS = ("confidence", "conf", "probability", "prob", "score")
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_NUMBER_RE = re.compile(rf"\s*({_NUMBER})\s*(%?)\s*")
# lenient `key: value` pairs inside braces; a numeric value is preferred so that keys may hold ':' and ','
_PAIR_NUM = re.compile(rf"\s*(?P<key>[^\n]+?)\s*:\s*(?P<val>{_NUMBER}\s*%?|null|None|\"[^\"]*\"|'[^']*')\s*(?:,|$)")
_PAIR_ANY = re.compile(r"\s*(?P<key>[^\n:,]+?)\s*(?::\s*(?P<val>[^,\n]*?))?\s*(?:,|\n|$)")
_CONF_LINE = re.compile(  # lengths bounded, so that a long line cannot cost quadratic time
    r"^[ \t]*(?:(?:[-*\u2022]|\d+[.)])[ \t]+)?(?:(?:the[ \t]+)?(?:final[ \t]+)?A(?:nswer)?(?:[ \t]+is)?[ \t]*:[ \t]*)?(?P<key>[^\n]{1,300}?)[ \t]*[\[(][ \t]*"
    r"confidence[ \t]*[:=][ \t]*(?P<val>[^\])\n]{0,40})[\])]",
    re.I | re.M,
)
_ANSWER_CONF_LINES = re.compile(
    rf"^\s*answer\s*:\s*(?P<key>[^\n]+?)\s*\n\s*confidence\s*:\s*(?P<val>{_NUMBER}\s*%?)\s*$", re.I | re.M
)
_COLON_LINE = re.compile(
    rf"^\s*(?:(?:[-*\u2022]|\d+[.)])\s+)?(?P<key>[^:\n]+?)\s*:\s*(?P<val>{_NUMBER}\s*%?)\s*,?\s*$", re.M
)
_MAX_LENIENT_CHARS = 20_000
_MAX_DEPTH = 8  # how deep to look for answers inside brackets that do not read as answers


@dataclass
class ParsedAnswers:
    """Answers read from one reasoner output.

    Args:
        answers: answer string -> confidence in ``[0, 1]``, or ``None`` when the output gave none. Empty means the
            reasoner abstained (or its output could not be read; see ``issues``).
        issues: one reason per departure from the requested format (see the module constants).
    """

    answers: dict[str, float | None] = field(default_factory=dict)
    issues: list[str] = field(default_factory=list)

    @property
    def abstained(self) -> bool:
        """Whether no answer was read."""
        return not self.answers

    def ranked(self) -> list[str]:
        """Answers by decreasing confidence (answers without one last; ties keep the output's order).

        Example:
            >>> parse_answers("{Memphis: 0.1, Atlanta: 0.8, Boston}").ranked()
            ['Atlanta', 'Memphis', 'Boston']
        """
        conf = self.answers
        return sorted(conf, key=lambda a: (conf[a] is None, -(conf[a] or 0.0)))


class _Object(list):  # type: ignore[type-arg]
    """A JSON object kept as its list of (key, value) pairs, so that repeated keys are not lost."""

    def items(self) -> list[tuple[Any, Any]]:
        return list(self)


def _to_confidence(value: Any, issues: list[str]) -> float | None:
    """A confidence in ``[0, 1]`` from a number, a numeric string or a percentage; ``None`` when there is none."""
    if isinstance(value, Mapping | _Object):
        for key in _CONF_KEYS:
            for k, v in value.items():
                if str(k).strip().lower() == key:
                    return _to_confidence(v, issues)
        issues.append(INVALID_CONFIDENCE)
        return None
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "null", "none")):
        issues.append(MISSING_CONFIDENCE)
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        issues.append(INVALID_CONFIDENCE)
        return None
    if isinstance(value, str):
        m = _NUMBER_RE.fullmatch(value.strip().strip("\"'"))
        if m is None:
            issues.append(INVALID_CONFIDENCE)
            return None
        conf = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
    else:
        try:
            conf = float(value)
        except OverflowError:  # an integer too large for a float (a model that repeats zeros)
            conf = math.inf
    if not math.isfinite(conf):
        issues.append(INVALID_CONFIDENCE)
        return None
    if not 0.0 <= conf <= 1.0:
        issues.append(CONFIDENCE_CLIPPED)
        conf = min(1.0, max(0.0, conf))
    return conf


def _entries(obj: Any) -> list[tuple[Any, Any]] | None:
    """(answer, raw confidence) pairs of a parsed object; a bare answer gets ``None``; ``None`` if not answers."""
    if isinstance(obj, Mapping | _Object):
        lower = {str(k).strip().lower(): v for k, v in obj.items()}
        akey = next((k for k in _ANSWER_KEYS if k in lower), None)
        is_record = akey is not None and (lower[akey] is None or isinstance(lower[akey], str | list))
        if is_record and set(lower) <= set(_ANSWER_KEYS) | set(_CONF_KEYS):  # {"answer": ..., "confidence": ...}
            answer = lower[akey]  # type: ignore[index]
            conf = next((lower[k] for k in _CONF_KEYS if k in lower), None)
            if isinstance(answer, list):
                if isinstance(conf, list) and len(conf) == len(answer):
                    return list(zip(answer, conf))
                return [(a, conf) for a in answer]
            return [(answer, conf)]
        return list(obj.items())
    if isinstance(obj, list | tuple | set | frozenset):
        items = sorted(obj, key=str) if isinstance(obj, set | frozenset) else obj
        out: list[tuple[Any, Any]] = []
        for item in items:
            if isinstance(item, Mapping | _Object):
                out.extend(_entries(item) or [])
            elif isinstance(item, list | tuple) and len(item) == 2 and not isinstance(item[0], list | tuple | Mapping):
                out.append((item[0], item[1]))
            else:
                out.append((item, None))
        return out
    return None


def _strip_quotes(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'":
        s = s[1:-1].strip()
    return s


def _pairs(body: str, pattern: re.Pattern[str]) -> list[tuple[str, str | None]] | None:
    """``key: value`` pairs that cover the whole ``body``, or ``None``."""
    pairs, pos = [], 0
    while pos < len(body) and (m := pattern.match(body, pos)) is not None and m.end() > pos:
        val = m["val"]
        pairs.append((_strip_quotes(m["key"]), None if val is None else _strip_quotes(val)))
        pos = m.end()
    return pairs if pairs and not body[pos:].strip(" \t\n,") else None


def _lenient(segment: str) -> Any:
    """Read ``{a: 0.8, b: 85%}`` / ``{a, b}`` / ``[a, b]`` written without quotes; ``None`` if it does not read."""
    body = segment[1:-1].strip()
    if not body or len(body) > _MAX_LENIENT_CHARS:
        return {} if not body else None
    if segment[0] == "{" and ":" in body:
        pairs = _pairs(body, _PAIR_NUM)
        # a numeric reading whose key holds ':' before ',' swallowed a non-numeric pair ("Spike: high, Belle")
        if pairs is None or any(":" in k and "," in k.split(":", 1)[1] for k, _ in pairs):
            pairs = _pairs(body, _PAIR_ANY)
        return _Object(pairs) if pairs else None
    if ":" in body or any(c in body for c in "{}[]"):
        return None
    return [_strip_quotes(x) for x in body.split(",")]


def _load(segment: str) -> Any:
    """Parse one bracketed segment: JSON, then a Python literal, then after light repairs, then leniently."""
    repaired = re.sub(r",\s*([}\]])", r"\1", segment.translate(str.maketrans("\u201c\u201d\u2018\u2019", "\"\"''")))
    for text in dict.fromkeys((segment, repaired)):
        try:
            return json.loads(text, object_pairs_hook=_Object)
        except (ValueError, RecursionError):
            pass
        if len(text) <= _MAX_LENIENT_CHARS:
            try:
                return ast.literal_eval(text)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                pass
    return _lenient(repaired)


def _segments(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Top-level balanced ``{...}`` / ``[...]`` spans of ``text[start:end]``, left to right, in one linear pass.

    Double-quoted strings inside brackets are skipped (a string also ends at a newline, so that one stray quote
    cannot hide the rest of the text); a mismatched closing bracket breaks every bracket still open.
    """
    end = len(text) if end is None else end
    closer = {"{": "}", "[": "]"}
    stack: list[tuple[int, str]] = []
    spans: list[tuple[int, int]] = []
    in_str = escaped = False
    for j in range(start, end):
        c = text[j]
        if in_str:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c in '"\n':
                in_str = False
        elif c == '"' and stack:
            in_str = True
        elif c in closer:
            stack.append((j, closer[c]))
        elif c in "}]":
            if stack and stack[-1][1] == c:
                i = stack.pop()[0]
                while spans and spans[-1][0] > i:  # drop the spans nested in this one
                    spans.pop()
                spans.append((i, j + 1))
            else:
                stack.clear()
    return spans


def _parsed_groups(text: str) -> list[list[tuple[Any, Any]]]:
    """Answer entries of every readable segment, in order; JSON lines (objects with only ``,``/whitespace between)
    form one group."""
    groups: list[list[tuple[Any, Any]]] = []
    prev_object_end = -1  # end of the previous segment if it was a {...} object

    def visit(lo: int, hi: int, depth: int) -> None:
        nonlocal prev_object_end
        for s, e in _segments(text, lo, hi):
            entries = _entries(_load(text[s:e]))
            if entries is None:
                if depth < _MAX_DEPTH:
                    visit(s + 1, e - 1, depth + 1)  # e.g. prose in brackets around a real object
                continue
            is_object = text[s] == "{"
            if is_object and groups and prev_object_end >= 0 and not text[prev_object_end:s].strip(" \t\r\n,"):
                groups[-1].extend(entries)
            else:
                groups.append(list(entries))
            prev_object_end = e if is_object else -1

    visit(0, len(text), 0)
    return groups


def _tame(text: str) -> str:
    """``text`` with each run of spaces and tabs made one space, each line stripped and blank lines dropped, in one
    linear pass. Answers are read with their whitespace collapsed anyway; what this removes is what made the line
    and pair patterns backtrack (a run of ``n`` spaces cost about ``n**4`` steps), so that every pattern below
    costs time linear in the text.

    >>> _tame("  Paris \\t [Confidence:  0.8]\\n\\n\\n  Lyon: 0.1  ")
    'Paris [Confidence: 0.8]\\nLyon: 0.1'
    """
    return "\n".join(line for line in (" ".join(raw.split()) for raw in text.split("\n")) if line)


def _line_entries(text: str) -> list[tuple[Any, Any]]:
    """``Atlanta [Confidence: 0.8]`` lines, else ``Answer: Atlanta`` + ``Confidence: 0.8``, else ``Atlanta: 0.8``."""
    found = [(m["key"], m["val"]) for m in _CONF_LINE.finditer(text)]
    if not found:
        found = [(m["key"], m["val"]) for m in _ANSWER_CONF_LINES.finditer(text)]
    if not found:
        reserved = set(_ANSWER_KEYS) | set(_CONF_KEYS)
        found = [(m["key"], m["val"]) for m in _COLON_LINE.finditer(text) if m["key"].strip().lower() not in reserved]
    return [(_strip_quotes(k.strip().lstrip("{[")), v) for k, v in found]  # lstrip: a truncated '{"a": 0.8'


def parse_answers(text: str | None, stats: ParseStats | None = None) -> ParsedAnswers:
    """Read ``{answer: confidence}`` from a reasoner's output, leniently, recording every departure as an issue.

    The last readable bracketed group in the text wins (after chain-of-thought prose the final answer comes last);
    JSON lines, i.e. objects separated only by commas or newlines, are one group. Failing that, lines such as
    ``Atlanta [Confidence: 0.8]`` or ``Atlanta: 0.8`` are read. Nothing readable gives an abstention.

    Args:
        text: the reasoner's raw output.
        stats: if given, the result is recorded into it.

    Example:
        >>> parse_answers('```json\\n{"Atlanta": 0.8, "Memphis": "10%"}\\n```').answers
        {'Atlanta': 0.8, 'Memphis': 0.1}
        >>> parse_answers("Final answer: {'Spike': 1.2, Belle}")
        ParsedAnswers(answers={'Spike': 1.0, 'Belle': None}, issues=['confidence_clipped', 'missing_confidence'])
        >>> parse_answers('[{"answer": "Washington, D.C.", "confidence": 0.6}]').answers
        {'Washington, D.C.': 0.6}
        >>> parse_answers("{Washington, D.C.: 0.7, Star Wars: Episode IV: 0.2}").answers
        {'Washington, D.C.': 0.7, 'Star Wars: Episode IV': 0.2}
        >>> parse_answers("The answer is: Asia [Confidence: 0.75]").answers
        {'Asia': 0.75}
        >>> parse_answers("{Tanzania -> official_language -> Swahili: 0.9}")
        ParsedAnswers(answers={'Swahili': 0.9}, issues=['path_answer'])
        >>> parse_answers("I am not sure.")
        ParsedAnswers(answers={}, issues=['no_structure'])
    """
    result = ParsedAnswers()
    issues = result.issues
    if text is None or not text.strip():
        issues.append(EMPTY_OUTPUT)
    else:
        text = _tame(text)
        groups = _parsed_groups(text)
        with_conf = [g for g in groups if any(c is not None for _, c in g)]
        entries = (with_conf or groups)[-1] if groups else _line_entries(text)
        if not groups and not entries:
            issues.append(NO_STRUCTURE)
        elif not entries:
            issues.append(NO_ANSWERS)
        for raw_answer, raw_conf in entries:
            if raw_answer is None or isinstance(raw_answer, list | tuple | set | Mapping):  # _Object is a list
                issues.append(EMPTY_ANSWER if raw_answer is None else INVALID_ANSWER)
                continue
            answer = " ".join(_strip_quotes(str(raw_answer)).split())
            if "->" in answer:
                issues.append(PATH_ANSWER)
                answer = _strip_quotes(answer.rsplit("->", 1)[1])
            if not answer:
                issues.append(EMPTY_ANSWER)
                continue
            conf = _to_confidence(raw_conf, issues)
            if answer in result.answers:
                issues.append(DUPLICATE_ANSWER)
                old = result.answers[answer]
                conf = old if conf is None else conf if old is None else max(old, conf)
            result.answers[answer] = conf
    if stats is not None:
        stats.record(result)
    return result
