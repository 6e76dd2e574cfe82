"""The service's request and response, typed (pydantic), so that FastAPI validates every request before it reaches
the detector and documents both on the OpenAPI page (``/docs``).

A request is one question: the LLM's answers (a repeat is a vote, as beams give), optionally a confidence and the
paths the LLM cited per answer, and the question's subgraph as ``[head, relation, tail]`` triples. Everything a
records file would be refused for is refused here, with the record checks of
:meth:`~kglightning.data.records.KGQARecord.from_dict`, as a 422 whose ``loc`` names the field. The sizes a server
accepts are its :data:`LIMITS` (set by ``kglightning serve`` from its config before it starts).

Example:
    >>> request = GuardRequest(question="Which country is Paris the capital of?", answers=["France", "Europe"],
    ...                        graph=[["Paris", "capital of", "France"]], topic_entities=["Paris"])
    >>> request.record().prediction
    ['France', 'Europe']
    >>> GuardRequest(question="Where?", answers=[3], graph=[["a", "r", "b"]])
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for GuardRequest
    answers.0
      Input should be a valid string [type=string_type, input_value=3, input_type=int]
    ...
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kglightning.data.records import KGQARecord, RecordError

__all__ = [
    "LIMITS",
    "AnswerVerdict",
    "GuardBatchRequest",
    "GuardBatchResponse",
    "GuardRequest",
    "GuardResponse",
    "Limits",
    "NotScored",
]

Triple = Annotated[list[StrictStr], Field(min_length=3, max_length=3, description="[head, relation, tail]")]


@dataclass
class Limits:
    """What one request may hold (a larger one gets a 422 naming the field; a body over ``max_body_bytes`` a 413).

    Args:
        max_triples: triples in ``graph``.
        max_answers: entries in ``answers``, in ``topic_entities`` and paths cited for one answer.
        max_text_chars: characters of the id, the question, an answer, a topic entity and a triple's or path's part.
        max_body_bytes: bytes of the request body.
        max_batch_questions: questions in one request to the batch endpoint.
        kg_nodes: the nodes of the server's KG (``None``: it has none, and a request must send its graph); a
            request without a graph needs a topic entity among them.
    """

    max_triples: int = 2000
    max_answers: int = 100
    max_text_chars: int = 2000
    max_body_bytes: int = 8_000_000
    max_batch_questions: int = 1000
    kg_nodes: Container[str] | None = None


#: the limits this process validates against (``kglightning serve`` sets them before its API servers start)
LIMITS = Limits()


class GuardRequest(BaseModel):
    """One question and the LLM's answers to it, to be checked against the question's subgraph."""

    model_config = ConfigDict(extra="forbid")

    id: StrictStr | None = Field(None, description="the caller's id of the question, returned as given")
    question: StrictStr = Field(min_length=1, description="the question asked")
    answers: list[StrictStr] = Field(min_length=1, description="the LLM's answers; a repeat counts as a vote")
    confidence: list[Annotated[StrictFloat | StrictInt, Field(ge=0, le=1)]] | None = Field(
        None, description="one confidence in [0, 1] per entry of answers"
    )
    paths: list[list[list[StrictStr]]] | None = Field(
        None,
        description="per entry of answers, the reasoning paths the LLM cited for it, each written as in records: "
        "[entity, relation, entity, relation, ..., entity]",
    )
    graph: list[Triple] | None = Field(
        None,
        min_length=1,
        validate_default=True,
        description="the question's subgraph as [head, relation, tail] triples; leave it out when the server has a "
        "KG, and it cuts the subgraph around topic_entities as build-subgraphs does",
    )
    topic_entities: list[StrictStr] = Field(
        default_factory=list,
        validate_default=True,  # a request without a graph needs them even when it leaves them out
        description="the question's topic entities",
    )

    @field_validator("question")
    @classmethod
    def _question(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the question is blank")
        return _short(value, "the question")

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        return None if value is None else _short(value, "the id")

    @field_validator("topic_entities")
    @classmethod
    def _topics(cls, value: list[str], info: ValidationInfo) -> list[str]:
        _capped(value, LIMITS.max_answers, "topic entities", "topic entity {i}")
        if "graph" in info.data and info.data["graph"] is None and LIMITS.kg_nodes is not None:  # cut from the KG
            if not any(e in LIMITS.kg_nodes for e in value):
                raise ValueError(
                    "no topic entity is a node of the server's KG, so no subgraph can be cut around one (send the "
                    "graph, or topic entities spelled as the KG's nodes)"
                )
        return value

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: list[list[list[str]]] | None) -> list[list[list[str]]] | None:
        for k, paths in enumerate(value or []):
            _capped(paths, LIMITS.max_answers, f"paths cited for answer {k}", f"path {{i}} of answer {k}")
        return value

    @field_validator("answers")
    @classmethod
    def _answers(cls, value: list[str]) -> list[str]:
        return _capped(value, LIMITS.max_answers, "answers", "answer {i}")

    @field_validator("graph")
    @classmethod
    def _graph(cls, value: list[list[str]] | None) -> list[list[str]] | None:
        if value is None:
            if LIMITS.kg_nodes is None:
                raise ValueError("required: this server has no KG to cut the question's subgraph from")
            return None
        return _capped(value, LIMITS.max_triples, "triples", "triple {i}")

    @field_validator("confidence", "paths")
    @classmethod
    def _one_per_answer(cls, value: list | None, info: ValidationInfo) -> list | None:
        answers = info.data.get("answers")
        if value is not None and answers is not None and len(value) != len(answers):
            raise ValueError(f"{len(value)} entries for {len(answers)} answers: give one per answer")
        return value

    @model_validator(mode="after")
    def _as_record(self) -> GuardRequest:
        try:
            self.record()
        except RecordError as err:  # what a records file would be refused for, said the same way
            raise ValueError(str(err)) from None
        return self

    def record(self) -> KGQARecord:
        """The request as a record without gold answers (the records' own checks applied)."""
        data: dict[str, Any] = {
            "id": self.id if self.id is not None else "request",
            "question": self.question,
            "answer": [],
            "q_entity": list(self.topic_entities),
            "a_entity": [],
            "graph": self.graph if self.graph is not None else [],  # the server cuts it from its KG
            "prediction": list(self.answers),
        }
        if self.confidence is not None:
            data["confidence"] = [float(c) for c in self.confidence]
        if self.paths is not None:
            data["prediction_paths"] = self.paths
        return KGQARecord.from_dict(data, source="<request>")


def _capped(values: list, limit: int, plural: str, one: str) -> list:
    """``values`` when there are at most ``limit`` of them, each text (or each text of a list) :func:`_short`;
    ``one`` names item ``{i}`` in a message."""
    if len(values) > limit:
        raise ValueError(f"{len(values)} {plural}, over this server's limit of {limit}")
    texts = [t for value in values for t in ([value] if isinstance(value, str) else value)]
    if texts and (max(map(len, texts)) > LIMITS.max_text_chars or not _encodes("".join(texts))):
        for i, value in enumerate(values):  # one is wrong: find the first, to name it
            for text in [value] if isinstance(value, str) else value:
                _short(text, one.format(i=i))
    return values


def _encodes(text: str) -> bool:
    """Whether ``text`` is valid Unicode (no lone surrogate, which JSON's ``"\\ud800"`` can carry)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _short(text: str, what: str) -> str:
    """``text`` when it is valid Unicode and within :data:`LIMITS`' characters, else a ``ValueError`` saying so."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate ("\ud800" in the JSON)
        raise ValueError(f"{what} is not valid Unicode ({err.reason} at {err.start})") from None
    if len(text) > LIMITS.max_text_chars:
        raise ValueError(f"{what} has {len(text)} characters, over this server's limit of {LIMITS.max_text_chars}")
    return text


class AnswerVerdict(BaseModel):
    """The detector's verdict on one distinct answer."""

    answer: str = Field(description="the answer (its first spelling in answers)")
    hallucination_prob: float = Field(description="the detector's probability that the answer is hallucinated")
    hallucination_logit: float = Field(description="the same score as a logit (no float32 ties near 1)")
    flagged: bool = Field(description="hallucination_prob at or over the checkpoint's tuned threshold")
    grounding: Literal["exact", "near_miss", "ungrounded"] = Field(description="how the answer met the graph")
    in_graph: bool = Field(description="whether the answer names a node of the graph")
    entries: list[int] = Field(description="the positions in answers behind this answer (its votes)")
    kept: bool = Field(
        description="kept by the server's selection (the question rule, when it has one), else: not flagged"
    )


class NotScored(BaseModel):
    """An entry of ``answers`` that got no verdict, and why."""

    entry: int
    answer: str
    reason: Literal["abstention", "ungrounded_dropped"]


class GuardResponse(BaseModel):
    """The verdicts on one question's answers."""

    id: str | None
    answers: list[AnswerVerdict]
    not_scored: list[NotScored] = Field(description="entries without a verdict (never left out silently)")
    abstained: bool = Field(description="no answer is kept")
    threshold: float = Field(description="the tuned threshold of answers that name a node")
    ungrounded_threshold: float = Field(description="the tuned threshold of answers that name none")
    checkpoint: str = Field(description="sha256 of the detector checkpoint served")
    selection: dict[str, Any] | None = Field(
        description="the selection applied (rule, alpha, each group's cut, the calibration's sha256), or null"
    )
    retrieved: dict[str, Any] | None = Field(
        None,
        description="the subgraph the server cut from its KG (triples, nodes, the topic entities it was cut around "
        "and those not in the KG), or null: the request's graph",
    )


class GuardBatchRequest(BaseModel):
    """Questions sent together, whose answers are kept by a rule over the whole batch."""

    model_config = ConfigDict(extra="forbid")

    questions: list[GuardRequest] = Field(min_length=1, description="the questions, each as POST /v1/guard takes it")
    rule: Literal["top", "fdr", "kept_rate", "question"] = Field(
        "top", description="the selection rule over the batch (each rule's promise is in the response's selection)"
    )

    @field_validator("questions")
    @classmethod
    def _count(cls, value: list[GuardRequest]) -> list[GuardRequest]:
        if len(value) > LIMITS.max_batch_questions:
            raise ValueError(f"{len(value)} questions, over this server's limit of {LIMITS.max_batch_questions}")
        return value


class GuardBatchResponse(BaseModel):
    """The verdicts on a batch's questions, in the order sent, and the selection applied over them."""

    responses: list[GuardResponse]
    selection: dict[str, Any] = Field(
        description="the rule, alpha, its promise, the calibration's sha256 and per group the calibration questions "
        "and the answers kept"
    )
