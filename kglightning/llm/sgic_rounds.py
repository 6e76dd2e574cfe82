"""The engine of SGIC's rounds (SGIC §3.2-3.3): round 0, document scores, K calibrations, and the training set.

:class:`SelfCalibration` holds the backend, the prompt, the estimator and the decoding, and runs each step over a
batch of :class:`~kglightning.data.sources.passages.PassageExample` in one backend call, counting prompt and generated
tokens and seconds under the tags it is given. The inference pipeline (:class:`~kglightning.pipelines.SGICPipeline`)
and the fine-tuning data (:class:`~kglightning.datamodules.SGICFinetuneDataModule`) both drive it.

:meth:`SelfCalibration.training_records` builds SGIC's uncertainty-aware fine-tuning set (§3.3), as we read it:

* an example whose round-0 answer is already correct becomes a *kept* record: its input is the Table 1 prompt with
  that answer as Round 1, its target the same answer. This is the substitution step: the model learns to keep a
  correct, low-uncertainty answer instead of changing it;
* otherwise the example is calibrated round by round until an answer is correct or ``rounds`` are spent; an example
  corrected at round ``k`` becomes a *calibrated* record whose input is the prompt the model saw at round ``k`` (every
  earlier, wrong answer with its uncertainty) and whose target is the correct answer of round ``k``;
* an example still wrong after the last round is dropped (counted).

Correctness is SQuAD exact match against the accepted answers. ``target="gold"`` substitutes the first accepted
answer for the model's own correct wording.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any, Literal

from kglightning.data.sources.passages import PassageExample
from kglightning.llm.backends.base import Generation, GenerationParams, LLMBackend
from kglightning.llm.sgic_prompt import SGICPrompt
from kglightning.llm.uncertainty import MaxProbProduct, UncertaintyEstimator, answer_uncertainty, document_uncertainty
from kglightning.metrics.functional.squad import squad_exact_match, squad_hit

__all__ = ["History", "SelfCalibration", "split_mean"]

#: the rounds of one question so far: ``(answer, uncertainty, confidence)``, round 0 first
History = list[tuple[str, float, float]]


def split_mean(total: float, count: float) -> float:
    """``s̄`` from the sum and count of a split's round-0 confidences, kept inside ``(0, 1)`` for Eq. 2 (0.5 if empty).

    >>> split_mean(1.2, 2), split_mean(0.0, 3), split_mean(0.0, 0)
    (0.6, 1e-06, 0.5)
    """
    mean = total / count if count else 0.5
    return min(max(mean, 1e-6), 1 - 1e-6)


def clean_answer(text: str) -> str:
    """One line of text: whitespace collapsed."""
    return " ".join(text.split())


class SelfCalibration:
    """Runs SGIC's steps on a backend.

    Args:
        backend: the LLM (it must return token log-probabilities).
        rounds: ``K``, the calibration rounds after round 0.
        prompt: the Table 1 format (default :class:`~kglightning.llm.sgic_prompt.SGICPrompt`).
        estimator: a generation's confidence (default :class:`~kglightning.llm.uncertainty.MaxProbProduct`).
        generation: greedy decoding settings (``temperature`` must be 0); log-probabilities are always requested.
        correct_if: when an answer counts as correct while building the training set: SQuAD exact match (``"em"``,
            the paper's) or Hit (``"hit"``: an accepted answer occurs in the answer, as RoG's metric counts it; for
            small models whose answers are sentences).
    """

    def __init__(
        self,
        backend: LLMBackend,
        rounds: int = 5,
        prompt: SGICPrompt | None = None,
        estimator: UncertaintyEstimator | None = None,
        generation: GenerationParams = GenerationParams(max_new_tokens=32, stop=("\n",)),
        correct_if: Literal["em", "hit"] = "em",
    ) -> None:
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        if generation.temperature != 0:
            raise ValueError(
                f"generation.temperature must be 0 (got {generation.temperature}): SGIC's scores multiply the highest "
                "token probabilities, which greedy decoding generates"
            )
        if correct_if not in ("em", "hit"):
            raise ValueError(f"correct_if must be 'em' or 'hit', got {correct_if!r}")
        self.backend = backend
        self.rounds = rounds
        self.correct_if = correct_if
        self.prompt = prompt if prompt is not None else SGICPrompt()
        self.estimator = estimator if estimator is not None else MaxProbProduct()
        self.params = dataclasses.replace(generation, logprobs=True)
        self.cost: dict[str, dict[str, float]] = {}
        self._round0: dict[str, Generation] = {}

    def is_correct(self, answer: str, gold: Sequence[str]) -> bool:
        """Whether ``answer`` counts as correct: SQuAD exact match (``correct_if="em"``) or Hit (``"hit"``)."""
        return bool((squad_exact_match if self.correct_if == "em" else squad_hit)(answer, gold))

    def reset(self, tags: Sequence[str] = ()) -> None:
        """Forget the remembered round-0 answers and the cost (zeroed for ``tags``)."""
        self._round0 = {}
        self.cost = {t: {"prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0, "cached": 0} for t in tags}

    def generate(
        self, convs: list[list[dict[str, str]]], params: GenerationParams, tags: Sequence[str] = ()
    ) -> list[Generation]:
        """The backend's generations, their tokens and seconds added to the cost of every tag.

        Generations read from the backend's response cache take no time; they are counted in ``cached``, so a
        report can say that its seconds cover only the rest.
        """
        if not convs:
            return []
        start = time.perf_counter()
        gens = self.backend.generate_with_params(convs, params)
        seconds = time.perf_counter() - start
        for tag in tags:
            cost = self.cost.setdefault(tag, {"prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0, "cached": 0})
            cost["cached"] = cost.get("cached", 0) + sum(g.cached for g in gens)
            cost["prompt_tokens"] += sum(g.prompt_tokens for g in gens)
            cost["completion_tokens"] += sum(g.completion_tokens for g in gens)
            cost["seconds"] += seconds
        return gens

    def confidence(self, gen: Generation) -> float:
        """The estimator's confidence (a clear error naming the backend if it gave no log-probabilities)."""
        return self.estimator(gen, backend=f"backend {self.backend.name!r}")

    def round_zero(self, examples: Sequence[PassageExample], tags: Sequence[str] = ()) -> list[Generation]:
        """Round 0 (every document, no scores), generated once per prompt and decoding settings (not per example
        id, which two splits may share)."""
        convs = [self.prompt.plain(e.question, e.documents) for e in examples]
        keys = [json.dumps([c, self.params.to_dict()], sort_keys=True, default=str) for c in convs]
        todo = {k: c for k, c in zip(keys, convs) if k not in self._round0}
        for k, g in zip(todo, self.generate(list(todo.values()), self.params, tags)):
            self._round0[k] = g
        return [self._round0[k] for k in keys]

    def mean_confidence(
        self, examples: Sequence[PassageExample], batch_size: int = 8, tags: Sequence[str] = ()
    ) -> tuple[float, int]:
        """``(sum, count)`` of the round-0 confidences of ``examples`` (the parts of ``s̄``)."""
        total = 0.0
        for start in range(0, len(examples), batch_size):
            total += sum(self.confidence(g) for g in self.round_zero(examples[start : start + batch_size], tags))
        return total, len(examples)

    def document_scores(
        self, examples: Sequence[PassageExample], tags: Sequence[str] = (), spent: list[int] | None = None
    ) -> list[list[float]]:
        """Eq. 3 for every document of every example, in one backend call.

        ``spent``, if given, is one count per example, to which each example's prompt tokens are added."""
        pairs = [(i, d) for i, e in enumerate(examples) for d in e.documents]
        convs = [self.prompt.plain(examples[i].question, [d]) for i, d in pairs]
        confs: list[list[float]] = [[] for _ in examples]
        for (i, _), g in zip(pairs, self.generate(convs, self.params, tags)):
            confs[i].append(self.confidence(g))
            if spent is not None:
                spent[i] += g.prompt_tokens
        return [document_uncertainty(c) for c in confs]

    def scored(self, gen: Generation, mean: float) -> tuple[str, float, float]:
        """``(answer, Eq. 2 uncertainty, confidence)`` of one generation."""
        conf = self.confidence(gen)
        return clean_answer(gen.text), answer_uncertainty(conf, mean), conf

    def messages(self, example: PassageExample, doc_scores: Sequence[float], history: History) -> list[dict[str, str]]:
        """The Table 1 prompt after ``history``."""
        return self.prompt.calibration(example.question, example.documents, doc_scores, [(a, u) for a, u, _ in history])

    def calibrate(
        self,
        examples: Sequence[PassageExample],
        doc_scores: Sequence[Sequence[float]],
        histories: list[History],
        mean: float,
        active: Sequence[bool] | None = None,
        tags: Sequence[str] = (),
        spent: list[int] | None = None,
    ) -> list[bool]:
        """One calibration round for the ``active`` examples (all by default); their histories grow by one answer.

        ``spent``, if given, is one count per example, to which each example's prompt tokens are added."""
        active = [True] * len(examples) if active is None else list(active)
        idx = [i for i, a in enumerate(active) if a]
        convs = [self.messages(examples[i], doc_scores[i], histories[i]) for i in idx]
        for i, g in zip(idx, self.generate(convs, self.params, tags)):
            histories[i].append(self.scored(g, mean))
            if spent is not None:
                spent[i] += g.prompt_tokens
        return active

    def training_records(
        self, examples: Sequence[PassageExample], mean: float, target: Literal["answer", "gold"] = "answer"
    ) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """SGIC's fine-tuning records for ``examples`` (see the module docstring) and the counts of each outcome."""
        zero = self.round_zero(examples, ("build",))
        doc_scores = self.document_scores(examples, ("build",))
        histories: list[History] = [[self.scored(g, mean)] for g in zero]
        correct = [self.is_correct(h[0][0], e.answer) for h, e in zip(histories, examples)]
        done_at: list[int | None] = [0 if c else None for c in correct]
        for k in range(1, self.rounds + 1):
            active = [d is None for d in done_at]
            if not any(active):
                break
            self.calibrate(examples, doc_scores, histories, mean, active, ("build",))
            for i, a in enumerate(active):
                if a and self.is_correct(histories[i][k][0], examples[i].answer):
                    done_at[i] = k
        records, counts = [], {"kept": 0, "calibrated": 0, "dropped": 0}
        for e, s, h, k in zip(examples, doc_scores, histories, done_at):
            if k is None:
                counts["dropped"] += 1
                continue
            kind = "kept" if k == 0 else "calibrated"
            counts[kind] += 1
            shown = h[:1] if k == 0 else h[:k]
            answer = h[k][0] if target == "answer" else e.answer[0]
            records.append(
                {
                    "id": e.id,
                    "kind": kind,
                    "correct_round": k,
                    "messages": self.messages(e, s, shown),
                    "target": answer,
                    "question": e.question,
                    "answer": e.answer,
                    "document_scores": s,
                    "history": [{"answer": a, "uncertainty": u} for a, u, _ in h],
                }
            )
        return records, counts
