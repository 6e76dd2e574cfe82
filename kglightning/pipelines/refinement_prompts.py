"""Prompts of the KG-Guard refinement loop: KAPING-style first question, and the follow-up that lists flagged answers.

The first chat is a system instruction and one user message with the retrieved triples, one per line as
``(subject, relation, object)`` (KAPING's verbalisation), then the question and the requested output, a JSON object
``{answer: confidence}`` that :func:`~kglightning.llm.parsing.parse_answers` reads. It shows no example answer: the
bundled SmolLM2-135M copied one as its answer for a quarter (``{"Paris": 0.9}``) to two thirds (``{"Entity A": 0.9}``)
of the questions. A re-prompt continues that chat with the LLM's most recent response and :func:`follow_up_message`
(KG-Guard §4.4).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from kglightning.data.text import prompt_name, relation_text
from kglightning.llm.backends import ChatMessage

__all__ = [
    "ANSWER_PROMPT",
    "FLAGGED_PROMPT",
    "REVISE_PROMPT",
    "SYSTEM_PROMPT",
    "UNMATCHED_PROMPT",
    "follow_up_message",
    "initial_messages",
    "verbalize_triple",
]

SYSTEM_PROMPT = (
    "You answer questions with facts from a knowledge graph. Answer only with names of entities that appear in the "
    "facts."
)
ANSWER_PROMPT = (
    "Facts from a knowledge graph, as (subject, relation, object) triples:\n{facts}\n\n"
    "Question: {question}\n\n"
    "Which entities from the facts answer the question? Reply with a JSON object that maps each answer entity to your "
    "confidence (0.0 to 1.0) that it is correct, and nothing else. If the facts do not answer the question, reply {{}}."
)
FLAGGED_PROMPT = (
    "A hallucination detector checked your answer against the knowledge graph and flagged as likely wrong: "
)
UNMATCHED_PROMPT = "These answers name no entity of the knowledge graph: "
REVISE_PROMPT = (
    "Revise your answer: drop or replace the flagged answers, using only entities from the facts above. Reply with "
    "the JSON object {answer: confidence} only."
)


def verbalize_triple(head: str, relation: str, tail: str) -> str:
    """A triple as KAPING writes it in the prompt (and as it is embedded for retrieval).

    Example:
        >>> verbalize_triple("France", "location.country.capital", "Paris")
        '(France, location country capital, Paris)'
    """
    return f"({prompt_name(head)}, {relation_text(relation)}, {prompt_name(tail)})"


def initial_messages(question: str, triples: Sequence[str]) -> list[ChatMessage]:
    """The first chat: the system instruction, then the triples and the question.

    Example:
        >>> chat = initial_messages("capital of France?", ["(France, location country capital, Paris)"])
        >>> [m["role"] for m in chat], chat[1]["content"].splitlines()[1]
        (['system', 'user'], '(France, location country capital, Paris)')
    """
    facts = "\n".join(triples) if triples else "(none)"
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": ANSWER_PROMPT.format(facts=facts, question=question)},
    ]


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(json.dumps(prompt_name(n), ensure_ascii=False) for n in names) + ". "


def follow_up_message(flagged: Sequence[str], unmatched: Sequence[str]) -> str:
    """The follow-up that lists the flagged answers; those that name no KG node are listed apart.

    Example:
        >>> print(follow_up_message(["Japan", "Atlantis"], ["Atlantis"]))  # doctest: +ELLIPSIS
        A hallucination detector ... as likely wrong: "Japan". These answers name no entity ...: "Atlantis". Revise...
    """
    scored = [f for f in flagged if f not in unmatched]
    text = FLAGGED_PROMPT + _quoted(scored) if scored else ""
    if unmatched:
        text += UNMATCHED_PROMPT + _quoted(unmatched)
    return text + REVISE_PROMPT
