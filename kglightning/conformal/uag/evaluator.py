"""UAG's LLM candidate evaluator (Eq. 6): ask the reasoner LLM over the question's best reasoning paths.

The prompt is UAG's (appendix, Table 5): ``Based on the following reasoning paths: {paths}, {question}?``. The paths
are the ``max_paths`` relation paths with the lowest Eq. 5 score over the *whole* candidate pool, each written as
grounded instances (``Tanzania -> location.country.official_language -> Swahili``). Taking them from the pool, not
from one configuration's traversal, makes the answer ``Phi(P)`` the same for every configuration of the LTT grid,
so one LLM call per question serves the whole calibration.

``Phi`` is the answer's first non-blank line, without a leading ``Answer:`` (UAG compares the raw generation). A
blank answer is counted in :attr:`LLMEvaluator.num_no_answer`, and the evaluator then falls back to the question
(see :mod:`.scores`). With ``constrained=True`` the answer is forced onto one of the question's candidate entity
names, or ``unknown`` (structured generation, :class:`~kglightning.llm.trie.names.NameChoice`; the backend must
support ``choices``, as :class:`~kglightning.llm.LocalHFBackend` does), so a small model's ``Phi`` is an entity and
not the start of a sentence; ``unknown`` counts as no answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from kglightning.conformal.uag.scores import QuestionScores, evaluator_scores
from kglightning.data.embeddings import EmbeddingCache
from kglightning.data.kg import KGIndex
from kglightning.data.records import KGQARecord
from kglightning.evidence.schema import Evidence
from kglightning.evidence.verbalize import path_instances, verbalize_instance
from kglightning.llm.backends.base import GenerationParams, LLMBackend
from kglightning.llm.trie.names import NameChoice

PROMPT = "Based on the following reasoning paths: {paths}, {question}?"
_ANSWER_PREFIX = re.compile(r"^\s*(?:the\s+)?answer\s*(?:is)?\s*[:\-]\s*", re.IGNORECASE)


def answer_text(text: str | None) -> str | None:
    """``Phi`` from a generation: its first non-blank line without an ``Answer:`` prefix; ``None`` if blank.

    Example:
        >>> answer_text(" \\n Answer: Swahili\\nmore"), answer_text("  "), answer_text(None)
        ('Swahili', None, None)
    """
    for line in (text or "").splitlines():
        line = _ANSWER_PREFIX.sub("", line).strip()
        if line:
            return line
    return None


class LLMEvaluator:
    """Gets ``Phi(P)`` from a reasoner LLM and rescores the candidates against it.

    Args:
        backend: any :class:`~kglightning.llm.backends.base.LLMBackend` (local model or an OpenAI-compatible server).
        max_paths: relation paths shown to the LLM.
        instances_per_path: grounded instances written per relation path.
        max_new_tokens: answer length bound (UAG used 10).
        temperature: ``0`` decodes greedily.
        constrained: force ``Phi`` onto a candidate entity name (or ``unknown``), see the module docstring.
    """

    def __init__(
        self,
        backend: LLMBackend,
        max_paths: int = 10,
        instances_per_path: int = 2,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        constrained: bool = False,
    ) -> None:
        self.backend = backend
        self.constrained = constrained
        self.max_paths = max_paths
        self.instances_per_path = instances_per_path
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.num_no_answer = 0

    def prompt(self, record: KGQARecord, scores: QuestionScores, kg: KGIndex | None = None) -> str:
        """UAG's prompt for one question."""
        kg = kg or KGIndex.from_record(record)
        best = torch.argsort(scores.path_score, stable=True)[: self.max_paths].tolist()
        lines: list[str] = []
        for i in best:
            evidence = Evidence(None, scores.paths[i])
            for inst in path_instances(kg, record.q_entity, evidence, limit=self.instances_per_path):
                lines.append(verbalize_instance(inst))
        question = record.question.rstrip().rstrip("?")
        return PROMPT.format(paths="; ".join(lines) if lines else "(none)", question=question)

    def answers(self, records: Sequence[KGQARecord], scores: Sequence[QuestionScores]) -> list[str | None]:
        """One ``Phi`` per question (``None`` when the answer could not be read)."""
        batch = [[{"role": "user", "content": self.prompt(r, s)}] for r, s in zip(records, scores)]
        if self.constrained:
            choices = [NameChoice(tuple(s.entities), max_answers=1) for s in scores]
            params = GenerationParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature)
            gens = self.backend.generate_with_params(batch, params, choices)
            out = [next(iter(c.parse(gen.text)[0]), None) for c, gen in zip(choices, gens)]
        else:
            gens = self.backend.generate(batch, max_new_tokens=self.max_new_tokens, temperature=self.temperature)
            out = [answer_text(gen.text) for gen in gens]
        self.num_no_answer += sum(a is None for a in out)
        return out

    def rescore(
        self, records: Sequence[KGQARecord], scores: Sequence[QuestionScores], cache: EmbeddingCache
    ) -> list[QuestionScores]:
        """Ask the LLM and replace each question's Eq. 6 scores by ``1 - cos(a, Phi)`` (in place; returned)."""
        for r, s, phi in zip(records, scores, self.answers(records, scores)):
            s.llm_answer = phi
            s.evaluator = evaluator_scores(cache, s.entities, r.question, phi)
        return list(scores)
