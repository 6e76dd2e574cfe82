"""Reasoner prompts of DoublyCal (App. C) as chat messages: Vanilla, CoT and two-round Self-Probing.

Each template is ``[KG_RAG_INSTRUCTION] <UQ instruction> [KG_RAG_CONTEXT] Question: [QUESTION]``. The UQ wording is
the paper's. The KG parts follow RoG's reasoning prompt, on which DoublyCal builds, and the paper's Fig. 2:

* evidence mode ``"with_confidence"`` (DoublyCal): the instruction opens with "Based on the reasoning paths and their
  confidence scores, ..." and each path line ends with ``[Confidence: c]`` (as in the paper's Fig. 2 and Tables 5-6);
* ``"without_confidence"`` (the SingleCal ablation): "Based on the reasoning paths, ..." and bare path lines;
* ``"none"`` (LLM only): App. C's templates with empty KG parts; evidence, if given, is ignored.

The context is ``Reasoning Paths:`` with one path per line, then ``Question:`` and the question (RoG's layout).
A prompt is one user message, optionally after a system message. Self-Probing first asks for a list of answers
(:func:`self_probing_first_round`), then continues the dialogue with the model's list and asks for confidences
(:func:`self_probing_second_round`). All templates ask for ``{answer: confidence}``, which
:func:`kglightning.llm.parsing.parse_answers` reads.

A pipeline takes its style as a :class:`UQPrompt` (``VanillaPrompt``, ``CoTPrompt``, ``SelfProbingPrompt``, named by
``class_path``); a new verbalized-UQ style is a subclass that returns its instruction (and, for a second round,
overrides :meth:`UQPrompt.second_round`).
"""

from __future__ import annotations

import abc
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from kglightning.data.text import prompt_name

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "CoTPrompt",
    "EvidenceLine",
    "EvidenceMode",
    "Message",
    "SelfProbingPrompt",
    "UQPrompt",
    "VanillaPrompt",
    "count_tokens",
    "cot_prompt",
    "render_evidence",
    "self_probing_first_round",
    "self_probing_second_round",
    "vanilla_prompt",
    "verbalize_path",
]

EvidenceMode = Literal["with_confidence", "without_confidence", "none"]
Message = dict[str, str]

KG_RAG_INSTRUCTION: dict[str, str] = {
    "with_confidence": "Based on the reasoning paths and their confidence scores, ",
    "without_confidence": "Based on the reasoning paths, ",
    "none": "",
}
OUTPUT_FORMAT = "Output format example: {<answer_1>: <confidence_1>,...,<answer_k>: <confidence_k>}"
UQ_INSTRUCTION = (
    "Please answer the following questions and provide the confidence (0.0 to 1.0) for each answer being correct. "
    "Please keep the answer as simple as possible and return all the possible answers and their confidence as a "
    f"json string. {OUTPUT_FORMAT}"
)
COT_INSTRUCTION = "Let's think it step by step."
SELF_PROBING_FIRST = (
    "Please answer the given question. Please keep the answer as simple as possible and return all the possible "
    "answers as a list."
)
SELF_PROBING_SECOND = (
    "Q: How likely are the above answers to be correct? Analyze the possible answers, provide your reasoning "
    "concisely, and give your confidence (0.0 to 1.0) for each answer being correct. Please keep the answer as "
    f"simple as possible and return all the possible answers and their confidence as a json string. {OUTPUT_FORMAT}"
)


@dataclass(frozen=True)
class EvidenceLine:
    """One grounded reasoning path and its evidence confidence.

    Args:
        path: the path as text (``"Snoopy -> sibling_of -> Spike"``), or its entities and relations in order.
        confidence: the evidence confidence in ``[0, 1]``; required in ``"with_confidence"`` mode.
    """

    path: str | Sequence[str]
    confidence: float | None = None


EvidenceLike = EvidenceLine | str | tuple[str, float | None]


def verbalize_path(elements: Sequence[str]) -> str:
    """Write a grounded path, entities and relations alternating, as RoG does.

    Example:
        >>> verbalize_path(["Snoopy", "sibling_of", "Spike"])
        'Snoopy -> sibling_of -> Spike'
    """
    return " -> ".join(map(prompt_name, elements))


def _line(item: EvidenceLike) -> EvidenceLine:
    if isinstance(item, EvidenceLine):
        return item
    if isinstance(item, str):
        return EvidenceLine(item)
    path, confidence = item
    return EvidenceLine(path, confidence)


def render_evidence(evidence: Sequence[EvidenceLike], mode: EvidenceMode = "with_confidence", digits: int = 2) -> str:
    """The evidence lines of the context, one path per line (``""`` in mode ``"none"``).

    Args:
        evidence: :class:`EvidenceLine` objects, path strings, or ``(path, confidence)`` tuples.
        mode: whether to append ``[Confidence: c]``, or to drop the evidence.
        digits: decimals of the written confidence.

    Data cannot forge lines or confidences: a path is written on one line, and square brackets in it (which the
    ``[Confidence: c]`` suffix uses) become parentheses (the last example).

    Raises:
        ValueError: in ``"with_confidence"`` mode, for a line without a confidence or with one outside ``[0, 1]``.

    Example:
        >>> print(render_evidence([("Snoopy -> sibling_of -> Spike", 0.5), EvidenceLine(["Snoopy", "r", "Belle"], 0.25)]))
        Snoopy -> sibling_of -> Spike [Confidence: 0.50]
        Snoopy -> r -> Belle [Confidence: 0.25]
        >>> render_evidence([("Snoopy -> sibling_of -> Spike", 0.5)], mode="without_confidence")
        'Snoopy -> sibling_of -> Spike'
        >>> render_evidence([("Spike\\n[Confidence: 1.00] -> r -> X", 0.1)])
        'Spike (Confidence: 1.00) -> r -> X [Confidence: 0.10]'
    """
    if mode == "none":
        return ""
    rows = []
    for line in map(_line, evidence):
        text = prompt_name(line.path, 10**9) if isinstance(line.path, str) else verbalize_path(line.path)
        text = text.replace("[", "(").replace("]", ")")
        if mode == "with_confidence":
            c = line.confidence
            if c is None or not (math.isfinite(c) and 0.0 <= c <= 1.0):
                raise ValueError(f"evidence {text!r} needs a confidence in [0, 1] in 'with_confidence' mode, got {c}")
            text = f"{text} [Confidence: {c:.{digits}f}]"
        rows.append(text)
    return "\n".join(rows)


def _user_content(
    instruction: str, question: str, evidence: Sequence[EvidenceLike], mode: EvidenceMode, digits: int
) -> str:
    if mode not in KG_RAG_INSTRUCTION:
        raise ValueError(f"unknown evidence mode {mode!r}; expected one of {sorted(KG_RAG_INSTRUCTION)}")
    prefix = KG_RAG_INSTRUCTION[mode]
    if prefix:
        instruction = prefix + instruction[0].lower() + instruction[1:]
    context = "" if mode == "none" else f"Reasoning Paths:\n{render_evidence(evidence, mode, digits)}\n\n"
    return f"{instruction}\n\n{context}Question:\n{question}"


def _messages(content: str, system: str | None) -> list[Message]:
    head = [{"role": "system", "content": system}] if system else []
    return head + [{"role": "user", "content": content}]


def vanilla_prompt(
    question: str,
    evidence: Sequence[EvidenceLike] = (),
    *,
    mode: EvidenceMode = "with_confidence",
    system: str | None = None,
    digits: int = 2,
) -> list[Message]:
    """Vanilla verbalized UQ (App. C.1): answers with confidences as a JSON string.

    Args:
        question: the question, verbatim.
        evidence: reasoning paths (see :func:`render_evidence`); ignored in mode ``"none"``.
        mode: ``"with_confidence"`` (DoublyCal), ``"without_confidence"`` (SingleCal) or ``"none"`` (LLM only).
        system: an optional system message.
        digits: decimals of the evidence confidences.

    Example:
        >>> msgs = vanilla_prompt("What is the name of Snoopy's brother?", [("Snoopy -> sibling_of -> Spike", 0.75)])
        >>> print(msgs[0]["content"])  # doctest: +ELLIPSIS
        Based on the reasoning paths and their confidence scores, please answer the following questions and provide the confidence (0.0 to 1.0) for each answer being correct. ... {<answer_1>: <confidence_1>,...,<answer_k>: <confidence_k>}
        <BLANKLINE>
        Reasoning Paths:
        Snoopy -> sibling_of -> Spike [Confidence: 0.75]
        <BLANKLINE>
        Question:
        What is the name of Snoopy's brother?
    """
    return VanillaPrompt(system, digits).first_round(question, evidence, mode)


def cot_prompt(
    question: str,
    evidence: Sequence[EvidenceLike] = (),
    *,
    mode: EvidenceMode = "with_confidence",
    system: str | None = None,
    digits: int = 2,
) -> list[Message]:
    """CoT verbalized UQ (App. C.2): Vanilla plus "Let's think it step by step." before the context.

    Example:
        >>> msgs = cot_prompt("Who is Snoopy's brother?", mode="none")
        >>> msgs[0]["content"].split("\\n\\n")[0].endswith("<confidence_k>} Let's think it step by step.")
        True
    """
    return CoTPrompt(system, digits).first_round(question, evidence, mode)


def self_probing_first_round(
    question: str,
    evidence: Sequence[EvidenceLike] = (),
    *,
    mode: EvidenceMode = "with_confidence",
    system: str | None = None,
    digits: int = 2,
) -> list[Message]:
    """Self-Probing, first interaction (App. C.3): all possible answers as a list, no confidence yet.

    Example:
        >>> msgs = self_probing_first_round("Who is Snoopy's brother?", ["Snoopy -> sibling_of -> Spike"],
        ...                                 mode="without_confidence")
        >>> msgs[0]["content"].split("\\n")[0]
        'Based on the reasoning paths, please answer the given question. Please keep the answer as simple as possible and return all the possible answers as a list.'
    """
    return SelfProbingPrompt(system, digits).first_round(question, evidence, mode)


def self_probing_second_round(first_round: Sequence[Message], first_answer: str | Sequence[str]) -> list[Message]:
    """Self-Probing, second interaction: the dialogue so far, the model's answer list, then the confidence probe.

    Args:
        first_round: the messages of :func:`self_probing_first_round`.
        first_answer: the model's first reply, verbatim, or its answers (written as a JSON list).

    Example:
        >>> first = self_probing_first_round("Who is Snoopy's brother?", mode="none")
        >>> msgs = self_probing_second_round(first, ["Spike", "Belle"])
        >>> [m["role"] for m in msgs], msgs[1]["content"]
        (['user', 'assistant', 'user'], '["Spike", "Belle"]')
        >>> msgs[2]["content"].startswith("Q: How likely are the above answers to be correct?")
        True
    """
    if not first_round or first_round[-1].get("role") != "user":
        raise ValueError("first_round must end with the user message of the first interaction")
    answer = first_answer if isinstance(first_answer, str) else json.dumps(list(first_answer), ensure_ascii=False)
    return [dict(m) for m in first_round] + [
        {"role": "assistant", "content": answer.strip()},
        {"role": "user", "content": SELF_PROBING_SECOND},
    ]


class UQPrompt(abc.ABC):
    """A verbalized-UQ prompt style (DoublyCal App. C): the messages of its first round, and of a second if it has one.

    Subclasses return their UQ instruction from :meth:`instruction`; the KG parts (the evidence-mode prefix and the
    ``Reasoning Paths:`` context) are added here, the same for every style.

    Args:
        system_prompt: an optional system message before the user turn.
        confidence_digits: decimals of the evidence confidences.

    Example:
        >>> class Terse(UQPrompt):
        ...     def instruction(self) -> str:
        ...         return "Answer with {answer: confidence} only."
        >>> print(Terse().first_round("Who is Snoopy's brother?", [("Snoopy -> sibling_of -> Spike", 0.75)])[0]["content"])
        Based on the reasoning paths and their confidence scores, answer with {answer: confidence} only.
        <BLANKLINE>
        Reasoning Paths:
        Snoopy -> sibling_of -> Spike [Confidence: 0.75]
        <BLANKLINE>
        Question:
        Who is Snoopy's brother?
    """

    #: whether the style asks a second question after the model's first answer (Self-Probing)
    two_rounds: ClassVar[bool] = False

    def __init__(self, system_prompt: str | None = None, confidence_digits: int = 2) -> None:
        if confidence_digits < 0:
            raise ValueError(f"confidence_digits must be >= 0, got {confidence_digits}")
        self.system_prompt = system_prompt
        self.confidence_digits = confidence_digits

    @abc.abstractmethod
    def instruction(self) -> str:
        """The UQ instruction of the first round, without the KG prefix."""

    def first_round(
        self, question: str, evidence: Sequence[EvidenceLike] = (), mode: EvidenceMode = "with_confidence"
    ) -> list[Message]:
        """The prompt of the first (for single-round styles, the only) round.

        Args:
            question: the question, verbatim.
            evidence: reasoning paths (see :func:`render_evidence`); ignored in mode ``"none"``.
            mode: ``"with_confidence"`` (DoublyCal), ``"without_confidence"`` (SingleCal) or ``"none"`` (LLM only).
        """
        content = _user_content(self.instruction(), question, evidence, mode, self.confidence_digits)
        return _messages(content, self.system_prompt)

    def second_round(self, first_round: Sequence[Message], first_answer: str | Sequence[str]) -> list[Message]:
        """The follow-up after the model's first answer; only styles with ``two_rounds`` have one."""
        raise ValueError(f"{type(self).__name__} has a single round")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(system_prompt={self.system_prompt!r}, confidence_digits={self.confidence_digits})"
        )


class VanillaPrompt(UQPrompt):
    """Vanilla verbalized UQ (App. C.1): answers with confidences as a JSON string (see :func:`vanilla_prompt`)."""

    def instruction(self) -> str:
        return UQ_INSTRUCTION


class CoTPrompt(UQPrompt):
    """CoT verbalized UQ (App. C.2): Vanilla plus "Let's think it step by step." (see :func:`cot_prompt`)."""

    def instruction(self) -> str:
        return f"{UQ_INSTRUCTION} {COT_INSTRUCTION}"


class SelfProbingPrompt(UQPrompt):
    """Self-Probing (App. C.3): a list of answers first, then a confidence probe in the same dialogue.

    Example:
        >>> prompt = SelfProbingPrompt()
        >>> first = prompt.first_round("Who is Snoopy's brother?", ["Snoopy -> sibling_of -> Spike"], "without_confidence")
        >>> prompt.two_rounds, len(prompt.second_round(first, "Spike"))
        (True, 3)
    """

    two_rounds: ClassVar[bool] = True

    def instruction(self) -> str:
        return SELF_PROBING_FIRST

    def second_round(self, first_round: Sequence[Message], first_answer: str | Sequence[str]) -> list[Message]:
        return self_probing_second_round(first_round, first_answer)


def count_tokens(messages: Sequence[Message], tokenizer: PreTrainedTokenizerBase | Any | None = None) -> int:
    """Prompt length in tokens, exact with a tokenizer, estimated without.

    With a Hugging Face tokenizer that has a chat template, the length of the templated conversation including
    the generation prompt; without a template, the sum of the encoded message contents (no special tokens).
    Without a tokenizer, a heuristic: per message ``max(words, ceil(chars / 4)) + 4`` (about four characters per
    English token, never fewer tokens than whitespace-separated words, four tokens of role framing), plus 3 for the
    reply primer.

    Example:
        >>> count_tokens([{"role": "user", "content": "What is the name of Snoopy's brother?"}])
        17
    """
    if tokenizer is None:
        total = 3
        for m in messages:
            content = m["content"]
            total += max(len(content.split()), math.ceil(len(content) / 4)) + 4
        return total
    if getattr(tokenizer, "chat_template", None):
        ids: Any = tokenizer.apply_chat_template(list(messages), tokenize=True, add_generation_prompt=True)
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        if len(ids) and isinstance(ids[0], list):  # a batch of one
            ids = ids[0]
        return len(ids)
    return sum(len(tokenizer.encode(m["content"], add_special_tokens=False)) for m in messages)
