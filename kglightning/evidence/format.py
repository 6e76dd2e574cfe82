"""The proxy model's text format for KG evidence (DoublyCal App. A) and its strict-but-lenient parser.

Input (SFT, App. A.1): ``Please generate a valid relation path that can be helpful for answering the following
question: <Q>``; the RL stage (App. A.2) asks for an *enhanced* path *with well-calibrated confidence*.
Target: a constrained relational path, its relations joined by ``<SEP>``, with an optional one-hop constraint
(relation and entity, joined by ``<SEP>``) and the Bayesian confidence as an attribute::

    <PATH confidence=0.75>r1<SEP>r2<CONSTRAINT>r_c<SEP>c</CONSTRAINT></PATH>

Relations are kept verbatim, including a leading ``~`` that marks a reverse hop (:mod:`kglightning.data.kg`).

The paper's format states the confidence *before* the path, so a left-to-right model must commit to it before it
has written the evidence it qualifies. ``confidence_position="after"`` writes it in a trailing element instead, so
the confidence is generated conditioned on the path::

    <PATH>r1<SEP>r2<CONSTRAINT>r_c<SEP>c</CONSTRAINT></PATH> <CONFIDENCE>0.75</CONFIDENCE>

The space before ``<CONFIDENCE>`` keeps ``</PATH>`` whole for BPE tokenizers, which would otherwise merge ``><``
into one token, so that a model decoding through the KG-Trie (whose sequences end with ``</PATH>``) sees the tokens
it was trained on. The parser reads both forms, with any whitespace (a block with both is malformed:
``invalid_attribute``).

:func:`parse_evidence` extracts every ``<PATH ...>...</PATH>`` block of a generated text. It is lenient on
whitespace (around tags and separators, ``confidence = "0.75"``) and on tag case, strict on structure: a block with
unbalanced or nested tags, an empty relation, a constraint without exactly a relation and an entity, or a confidence
that is not a number in ``[0, 1]`` is *malformed*; it is returned with its reason, never dropped silently, and
:class:`~kglightning.evidence.parse_stats.ParseStats` counts reasons over a run.

RoG's multi-task SFT (which DoublyCal follows, App. D.2) adds an auxiliary QA task: :func:`qa_input` and
:func:`qa_target` write it in RoG's layout (instruction, ``Reasoning Paths:``, ``Question:``; answers one per line).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple

from kglightning.evidence.parse_stats import ParseStats

if TYPE_CHECKING:
    from kglightning.evidence.schema import Evidence

__all__ = [
    "Constraint",
    "MalformedBlock",
    "MalformedReason",
    "ParseResult",
    "ConfidencePosition",
    "ParseStats",
    "PathEvidence",
    "format_evidence",
    "writes_verbatim",
    "parse_evidence",
    "qa_input",
    "qa_target",
    "rl_input",
    "sft_input",
]

SFT_TEMPLATE = (
    "Please generate a valid relation path that can be helpful for answering the following question: {question}"
)
RL_TEMPLATE = (
    "Please generate an enhanced relation path with well-calibrated confidence that can be helpful for answering "
    "the following question: {question}"
)
QA_INSTRUCTION = (
    "Based on the reasoning paths, please answer the given question. Please keep the answer as simple as possible "
    "and return all the possible answers as a list."
)
SEP = "<SEP>"
#: where a block's confidence is written: in the opening tag (the paper's format) or in a trailing element
ConfidencePosition = Literal["open", "after"]

#: why a block (or a whole text, for ``no_path``) is malformed
MalformedReason = Literal[
    "no_path",  # the text holds no <PATH> tag at all (not a block; listed in ParseResult.issues)
    "unclosed_tag",  # <PATH ...> never closed (e.g. generation cut by max_new_tokens)
    "unbalanced_tags",  # </PATH> without <PATH>, or <CONSTRAINT> / </CONSTRAINT> unpaired
    "nested_tags",  # <PATH> inside <PATH>, or <CONSTRAINT> inside <CONSTRAINT>
    "invalid_structure",  # a second constraint, text after </CONSTRAINT>, or a tag that has no place there
    "empty_relation",  # an empty relation (r1<SEP><SEP>r2, <PATH></PATH>) or a bare "~"
    "invalid_constraint",  # a constraint that is not exactly relation<SEP>entity, both non-empty
    "stray_markup",  # '<' or '>' left in a relation or entity (an unknown or broken tag)
    "invalid_attribute",  # an attribute other than a single confidence=...
    "invalid_confidence",  # confidence is not a number
    "confidence_out_of_range",  # confidence outside [0, 1] (or not finite)
    "missing_confidence",  # no confidence attribute, when one is required
]

# whitespace inside a tag is bounded (a run of n spaces after '<' cost n**2 steps): a longer run is no tag
_TAG = re.compile(r"<\s{0,16}(?P<close>/)?\s{0,16}(?P<name>PATH|CONSTRAINT|SEP)\b(?P<attrs>[^<>]*)>", re.I)
_CONF_ATTR = re.compile(r"\s*confidence\s*=(?P<raw>.*)", re.I | re.S)  # raw is stripped after: no lazy backtracking
_TRAILING = re.compile(r"\s*<\s*CONFIDENCE\s*>(?P<raw>[^<>]*)<\s*/\s*CONFIDENCE\s*>", re.I)
_TRAILING_START = re.compile(r"\s*<\s*CONFIDENCE\b", re.I)
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|nan)", re.I)


def sft_input(question: str) -> str:
    """The SFT instruction (App. A.1).

    Example:
        >>> sft_input("what is the name of snoopy's brother?")
        "Please generate a valid relation path that can be helpful for answering the following question: what is the name of snoopy's brother?"
    """
    return SFT_TEMPLATE.format(question=question)


def rl_input(question: str) -> str:
    """The RL (GRPO) instruction (App. A.2); the target format is the same as in SFT.

    Example:
        >>> rl_input("who is snoopy's brother?").startswith("Please generate an enhanced relation path")
        True
    """
    return RL_TEMPLATE.format(question=question)


def qa_input(question: str, reasoning_paths: Sequence[str]) -> str:
    """RoG's auxiliary QA input: instruction, the reasoning paths one per line, then the question.

    As in RoG, a ``?`` is appended to a question that lacks one.

    Args:
        question: the question.
        reasoning_paths: grounded paths already written as text, e.g. ``"Snoopy -> sibling_of -> Spike"``.

    Example:
        >>> print(qa_input("who is snoopy's brother", ["Snoopy -> sibling_of -> Spike"]))
        Based on the reasoning paths, please answer the given question. Please keep the answer as simple as possible and return all the possible answers as a list.
        <BLANKLINE>
        Reasoning Paths:
        Snoopy -> sibling_of -> Spike
        <BLANKLINE>
        Question:
        who is snoopy's brother?
    """
    question = question if question.rstrip().endswith("?") else question.rstrip() + "?"
    return f"{QA_INSTRUCTION}\n\nReasoning Paths:\n" + "\n".join(reasoning_paths) + f"\n\nQuestion:\n{question}"


def qa_target(answers: Sequence[str]) -> str:
    """RoG's auxiliary QA target: the answers, one per line.

    Example:
        >>> qa_target(["Spike", "Belle"])
        'Spike\\nBelle'
    """
    return "\n".join(answers)


class Constraint(NamedTuple):
    """The optional one-hop constraint ``r_c(a, c)`` of a constrained relational path."""

    relation: str
    entity: str


@dataclass(frozen=True)
class PathEvidence:
    """One well-formed ``<PATH>`` block.

    Args:
        relations: the relational path, each relation verbatim (``~r`` is a reverse hop).
        constraint: the optional constraint.
        confidence: the confidence attribute, ``None`` when absent.
        span: ``(start, end)`` character offsets of the block in the parsed text (not part of equality).
    """

    relations: tuple[str, ...]
    constraint: Constraint | None = None
    confidence: float | None = None
    span: tuple[int, int] | None = field(default=None, compare=False)

    def format(self, digits: int = 2, confidence_position: ConfidencePosition = "open") -> str:
        """Write this block back in the canonical format (see :func:`format_evidence`)."""
        return format_evidence(
            self.relations, self.constraint, self.confidence, digits=digits, confidence_position=confidence_position
        )

    def to_evidence(self, topic: str | None = None) -> Evidence:
        """The :class:`~kglightning.evidence.schema.Evidence` record (``topic=None``: ground from every topic).

        Example:
            >>> z = parse_evidence("<PATH confidence=0.75>sibling_of<CONSTRAINT>gender<SEP>Male</CONSTRAINT></PATH>")
            >>> str(z.evidence[0].to_evidence("Snoopy"))
            'Snoopy -> sibling_of [gender Male] (0.75)'
        """
        from kglightning.evidence.schema import Evidence

        constraint = None if self.constraint is None else tuple(self.constraint)
        return Evidence(topic, self.relations, constraint, self.confidence)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MalformedBlock:
    """A ``<PATH>`` block (or a stray tag) that does not follow the format, with the first reason found."""

    reason: MalformedReason
    text: str
    span: tuple[int, int]


@dataclass
class ParseResult:
    """The blocks of one generated text.

    Args:
        evidence: the well-formed blocks, in text order.
        malformed: the malformed blocks, in text order.
        no_path: whether the text holds no ``<PATH>`` tag at all.
    """

    evidence: list[PathEvidence] = field(default_factory=list)
    malformed: list[MalformedBlock] = field(default_factory=list)
    no_path: bool = False

    @property
    def issues(self) -> list[str]:
        """One reason per malformed block, plus ``"no_path"`` for a text without any tag (for :class:`ParseStats`)."""
        return [m.reason for m in self.malformed] + (["no_path"] if self.no_path else [])

    @property
    def ok(self) -> bool:
        """At least one well-formed block and no malformed one."""
        return bool(self.evidence) and not self.malformed


def writes_verbatim(name: str) -> bool:
    """Whether ``name`` can be a relation or entity of a ``<PATH>`` block as it is: non-empty, not ``~``, no
    surrounding whitespace and no ``<`` or ``>`` (which the format reserves for tags).

    Example:
        >>> writes_verbatim("New  York"), writes_verbatim(" Paris"), writes_verbatim("a<b")
        (True, False, False)
    """
    return bool(name) and name == name.strip() and name != "~" and "<" not in name and ">" not in name


def _field(value: str, what: str) -> str:
    text = str(value).strip()  # whitespace inside a name is kept: the name must ground as the KG writes it
    if text in ("", "~"):
        raise ValueError(f"empty {what}: {value!r}")
    if "<" in text or ">" in text:
        raise ValueError(f"{what} {value!r} contains '<' or '>', which the <PATH> format reserves for tags")
    return text


def format_evidence(
    relations: Sequence[str],
    constraint: tuple[str, str] | None = None,
    confidence: float | None = None,
    *,
    digits: int = 2,
    confidence_position: ConfidencePosition = "open",
) -> str:
    """Write evidence in the proxy's target format.

    A relation or entity is stripped of surrounding whitespace; whitespace inside it is kept as it is, so that the
    name grounds as the KG writes it (the parser does the same, so parsing the result gives the fields back). The
    confidence is written with ``digits`` decimals, and omitted when ``None``.

    Args:
        relations: the relational path (at least one relation); ``~r`` marks a reverse hop.
        constraint: optional ``(relation, entity)``.
        confidence: the evidence confidence in ``[0, 1]``.
        digits: decimals of the confidence.
        confidence_position: ``"open"`` (in the opening tag, the paper's format) or ``"after"`` (a trailing
            ``<CONFIDENCE>`` element, written after the path).

    Raises:
        ValueError: on an empty path or field, a field containing ``<``/``>``, or a confidence outside ``[0, 1]``.

    Example:
        >>> format_evidence(["sibling_of"], ("gender", "male"), 0.75)
        '<PATH confidence=0.75>sibling_of<CONSTRAINT>gender<SEP>male</CONSTRAINT></PATH>'
        >>> format_evidence(["~people.person.children", "location.location.containedby"], confidence=0.5, digits=3)
        '<PATH confidence=0.500>~people.person.children<SEP>location.location.containedby</PATH>'
        >>> format_evidence(["sibling_of"], confidence=0.75, confidence_position="after")
        '<PATH>sibling_of</PATH> <CONFIDENCE>0.75</CONFIDENCE>'
    """
    if isinstance(relations, str):
        raise TypeError("relations must be a sequence of relation names, not one string")
    body = SEP.join(_field(r, "relation") for r in relations)
    if not body:
        raise ValueError("a relational path needs at least one relation")
    if constraint is not None:
        if len(constraint) != 2:
            raise ValueError(f"a constraint is (relation, entity), got {constraint!r}")
        body += f"<CONSTRAINT>{_field(constraint[0], 'constraint relation')}{SEP}"
        body += f"{_field(constraint[1], 'constraint entity')}</CONSTRAINT>"
    if confidence is None:
        return f"<PATH>{body}</PATH>"
    if not (math.isfinite(confidence) and 0.0 <= confidence <= 1.0):
        raise ValueError(f"confidence must be in [0, 1], got {confidence!r}")
    if digits < 0:
        raise ValueError(f"digits must be >= 0, got {digits}")
    if confidence_position == "after":
        return f"<PATH>{body}</PATH> <CONFIDENCE>{confidence:.{digits}f}</CONFIDENCE>"
    if confidence_position != "open":
        raise ValueError(f"confidence_position must be 'open' or 'after', got {confidence_position!r}")
    return f"<PATH confidence={confidence:.{digits}f}>{body}</PATH>"


def _confidence(attrs: str) -> tuple[float | None, MalformedReason | None]:
    if not attrs.strip():
        return None, None
    m = _CONF_ATTR.fullmatch(attrs)
    if m is None:
        return None, "invalid_attribute"
    return _confidence_value(m["raw"])


def _confidence_value(raw: str) -> tuple[float | None, MalformedReason | None]:
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        raw = raw[1:-1].strip()
    if not _NUMBER.fullmatch(raw):
        return None, "invalid_confidence"
    value = float(raw)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        return None, "confidence_out_of_range"
    return value, None


def _split_field(text: str) -> tuple[str, MalformedReason | None]:
    value = text.strip()  # as format_evidence writes it: a name keeps its inner whitespace
    if "<" in value or ">" in value:
        return value, "stray_markup"
    return value, None


def _parse_body(text: str, lo: int, hi: int, tags: list[re.Match[str]]) -> PathEvidence | MalformedReason:
    """Parse ``text[lo:hi]``, the inside of one block, whose SEP/CONSTRAINT tags are ``tags`` (absolute offsets)."""
    relations: list[str] = []
    fields: list[str] = []
    state = "path"  # then "constraint", then "after"
    pos = lo
    for tag in tags:
        name, close = tag["name"].upper(), bool(tag["close"])
        if tag["attrs"].strip() or (name == "SEP" and close):
            return "invalid_structure"
        if state == "after":
            return "invalid_structure" if name == "CONSTRAINT" and not close else "unbalanced_tags"
        if name == "CONSTRAINT" and not close and state == "constraint":
            return "nested_tags"
        if name == "CONSTRAINT" and close and state == "path":
            return "unbalanced_tags"
        value, bad = _split_field(text[pos : tag.start()])
        if bad:
            return bad
        (relations if state == "path" else fields).append(value)
        if name == "CONSTRAINT":
            state = "after" if close else "constraint"
        pos = tag.end()
    value, bad = _split_field(text[pos:hi])
    if state == "constraint":
        return "unbalanced_tags"
    if state == "after" and value:
        return "invalid_structure"
    if bad:
        return bad
    if state == "path":
        relations.append(value)
    if any(r in ("", "~") for r in relations):
        return "empty_relation"
    if state == "path":
        return PathEvidence(tuple(relations))
    if len(fields) != 2 or not all(fields) or fields[0] == "~":
        return "invalid_constraint"
    return PathEvidence(tuple(relations), Constraint(*fields))


def parse_evidence(text: str, *, require_confidence: bool = False, stats: ParseStats | None = None) -> ParseResult:
    """Extract every ``<PATH ...>...</PATH>`` block from generated text.

    Blocks are found by tag depth: a ``<PATH>`` inside another makes the outer block ``nested_tags``; a ``<PATH>``
    never closed is ``unclosed_tag`` up to the next ``<PATH>`` (or the end), after which scanning resumes; a stray
    ``</PATH>`` is ``unbalanced_tags``. Text outside blocks is ignored.

    Args:
        text: the generated text.
        require_confidence: make a block without a confidence attribute malformed (``missing_confidence``);
            otherwise it is well-formed with ``confidence=None`` (RoG's plain ``<PATH>`` format).
        stats: if given, the result is recorded into it.

    Example:
        >>> r = parse_evidence("<PATH confidence = '0.75'> sibling_of <CONSTRAINT> gender <SEP> male </CONSTRAINT></PATH>"
        ...                    " <PATH confidence=1.5>~r1</PATH> <PATH confidence=0.2>r1<SEP><SEP>r2</PATH>")
        >>> r.evidence
        [PathEvidence(relations=('sibling_of',), constraint=Constraint(relation='gender', entity='male'), confidence=0.75, span=(0, 89))]
        >>> r.issues
        ['confidence_out_of_range', 'empty_relation']
        >>> parse_evidence("no tags here").issues
        ['no_path']
    """
    result = ParseResult()
    tags = list(_TAG.finditer(text))
    is_open = [t["name"].upper() == "PATH" and not t["close"] for t in tags]
    is_close = [t["name"].upper() == "PATH" and bool(t["close"]) for t in tags]
    result.no_path = not any(is_open) and not any(is_close)
    # the close of the block opened at k is the first later tag where the depth drops below its depth after k
    depth = list(itertools.accumulate(int(o) - int(c) for o, c in zip(is_open, is_close)))
    opens_before = [0, *itertools.accumulate(map(int, is_open))]
    match: list[int | None] = [None] * len(tags)
    stack: list[int] = []
    for i in reversed(range(len(tags))):  # next strictly lower depth, with a monotonic stack (linear time)
        while stack and depth[stack[-1]] >= depth[i]:
            stack.pop()
        match[i] = stack[-1] if stack else None
        stack.append(i)
    k = 0
    while k < len(tags):
        start = tags[k].start()
        if is_close[k]:
            result.malformed.append(MalformedBlock("unbalanced_tags", tags[k].group(0), (start, tags[k].end())))
            k += 1
            continue
        if not is_open[k]:
            k += 1
            continue
        j = match[k]
        if j is None:  # never closed: malformed up to the next <PATH>, then resume there
            nxt = next((i for i in range(k + 1, len(tags)) if is_open[i]), None)
            end = tags[nxt].start() if nxt is not None else len(text)
            result.malformed.append(MalformedBlock("unclosed_tag", text[start:end], (start, end)))
            k = nxt if nxt is not None else len(tags)
            continue
        end = tags[j].end()
        block = text[start:end]
        parsed: PathEvidence | MalformedReason
        if opens_before[j] - opens_before[k + 1] > 0:  # another <PATH> inside
            parsed = "nested_tags"
        elif tags[j]["attrs"].strip():
            parsed = "invalid_structure"
        else:
            confidence, bad = _confidence(tags[k]["attrs"])
            trailing = _TRAILING.match(text, end)
            if trailing is not None:  # <PATH>...</PATH> <CONFIDENCE>c</CONFIDENCE>
                end = trailing.end()
                block = text[start:end]
                if bad is None:
                    bad = "invalid_attribute" if confidence is not None else None
                    confidence, bad = (None, bad) if bad else _confidence_value(trailing["raw"])
            elif bad is None and confidence is None and _TRAILING_START.match(text, end):
                bad = "invalid_confidence"  # an opened <CONFIDENCE> element that does not close as one
            if bad is None and confidence is None and require_confidence:
                bad = "missing_confidence"
            parsed = bad or _parse_body(text, tags[k].end(), tags[j].start(), tags[k + 1 : j])
            if isinstance(parsed, PathEvidence):
                parsed = PathEvidence(parsed.relations, parsed.constraint, confidence, (start, end))
        if isinstance(parsed, PathEvidence):
            result.evidence.append(parsed)
        else:
            result.malformed.append(MalformedBlock(parsed, block, (start, end)))
        k = j + 1
    if stats is not None:
        stats.record(result)
    return result
