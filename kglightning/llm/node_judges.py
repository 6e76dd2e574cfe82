"""LLM-based hallucination detectors for answer nodes: KG-Guard's baselines (§4.2), LLM-as-judge and SelfCheckGPT.

Each is an :class:`AnswerNodeScorer`: for every record with a ``prediction`` it gives each predicted name a
hallucination score in ``[0, 1]`` (1 = hallucinated). :class:`~kglightning.datamodules.DetectionDataModule` runs
them on the test split (``baselines:``), and the detector's test table lists them beside MostFrequent and Random.

* :class:`LLMJudge` asks an LLM, per answer node, whether the answer is supported, with the paper's three contexts:
  ``G`` (question and subgraph as a triple list), ``G+RS`` (plus the answering LLM's reasoning summary) and
  ``G+RS+RT`` (plus its reasoning triples), read from ``record.extra["reasoning_summary"]`` and
  ``["reasoning_triples"]``. The verdict is parsed leniently (``yes``/``no``, ``correct``/``incorrect``,
  ``true``/``false``, ``supported``/``unsupported``, first one wins, "not correct" and "isn't supported" read as no,
  see :func:`parse_verdict`); an answer without a verdict scores 0.5 and is counted in ``counts["malformed"]``. PyG's ``torch_geometric.llm.models.LLMJudge`` grades a prediction against the
  gold answer through NVIDIA NIM; a hallucination judge must not see the gold answer, so it is written here.
* :class:`SelfCheck` draws ``samples`` answers from the answering method at temperature 1 and scores a node by the
  fraction of samples that do not contain it (Manakul et al., 2023, adapted to node sets as in KG-Guard).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from tqdm.auto import tqdm

from kglightning.data.proposer import AnswerNodeScorer, AnswerProposer
from kglightning.data.records import KGQARecord
from kglightning.data.text import prompt_name, relation_text
from kglightning.llm.backends.base import GenerationParams, LLMBackend
from kglightning.metrics.functional.qa import normalize

__all__ = ["LLMJudge", "SelfCheck", "parse_verdict"]

log = logging.getLogger(__name__)

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_POSITIVE = {"yes", "correct", "true", "supported"}  # not "right": "the right answer is X" is no verdict
_NEGATIVE = {"no", "incorrect", "false", "unsupported", "wrong", "unsupportable"}
_NEGATORS = {"not", "never", "cannot", "hardly", "isnt", "wasnt", "arent", "doesnt", "dont", "cant", "wont"}
_AUX = {"is", "was", "are", "were", "does", "do", "did", "can", "could", "would", "should", "has", "have", "had"}
_NEGATION_WINDOW = 3  # "is not entirely correct": a negator at most this many words before the verdict word


def parse_verdict(text: str) -> bool | None:
    """``True`` when the text says the answer is supported, ``False`` when not, ``None`` without a verdict.

    The first verdict word decides (``yes``/``no``, ``correct``/``incorrect``, ``true``/``false``,
    ``supported``/``unsupported``, or ``wrong``), so "Incorrect. The correct answer is ..." is a no. A positive
    word with a negation shortly before it ("not correct", "isn't supported", "is not entirely true") is a no.
    One pass over the words: linear in the text.

    Example:
        >>> parse_verdict("Yes."), parse_verdict("The answer is incorrect"), parse_verdict("maybe")
        (True, False, None)
        >>> parse_verdict("The proposed answer is not correct."), parse_verdict("It isn't supported by the graph")
        (False, False)
    """
    words = _WORD.findall(text.lower().replace("\u2019", "'"))
    for i, word in enumerate(words):
        if word in _NEGATIVE:
            return False
        if word in _POSITIVE:
            before = [w.replace("'", "") for w in words[max(0, i - _NEGATION_WINDOW) : i]]
            negated = word != "yes" and any(w in _NEGATORS or w.endswith("nt") and w[:-2] in _AUX for w in before)
            return not negated
    return None


class LLMJudge(AnswerNodeScorer):
    """LLM-as-judge per answer node (see the module docstring).

    Args:
        backend: the judging LLM.
        context: ``"G"``, ``"G+RS"`` or ``"G+RS+RT"``.
        max_triples: subgraph triples shown (the first ones of the record's graph).
        generation: decoding settings (the paper: temperature 0.1).
        name: column prefix in the test table (default ``judge_g``, ``judge_g_rs``, ``judge_g_rs_rt``).
        show_progress: a progress bar over answer nodes.
    """

    def __init__(
        self,
        backend: LLMBackend,
        context: Literal["G", "G+RS", "G+RS+RT"] = "G",
        max_triples: int = 200,
        generation: GenerationParams = GenerationParams(max_new_tokens=8),
        name: str | None = None,
        show_progress: bool = True,
    ) -> None:
        if context not in ("G", "G+RS", "G+RS+RT"):
            raise ValueError(f"context must be 'G', 'G+RS' or 'G+RS+RT', got {context!r}")
        self.backend = backend
        self.context = context
        self.max_triples = max_triples
        self.generation = generation
        self.name = name or "judge_" + context.lower().replace("+", "_")
        self.show_progress = show_progress
        self.counts = {"answers": 0, "malformed": 0}

    @property
    def cache_key(self) -> str:
        return f"judge-{self.backend.cache_key}-{self.context}-{self.max_triples}-{self.generation.to_dict()}"

    def messages(self, record: KGQARecord, answer: str) -> list[dict[str, str]]:
        """The judge's prompt for one answer node."""
        triples = "\n".join(
            f"({prompt_name(h)}, {relation_text(r)}, {prompt_name(t)})" for h, r, t in record.graph[: self.max_triples]
        )
        parts = [f"Question: {record.question}", f"Knowledge graph triples:\n{triples or '(none)'}"]
        if "RS" in self.context:
            parts.append(f"Reasoning summary of the answering model:\n{self._extra(record, 'reasoning_summary')}")
        if "RT" in self.context:
            cited = self._extra(record, "reasoning_triples")
            lines = (
                cited
                if isinstance(cited, str)
                else "\n".join(f"({', '.join(prompt_name(str(x)) for x in t)})" for t in cited)
            )
            parts.append(f"Triples the answering model cited:\n{lines}")
        parts.append(
            f"Proposed answer: {prompt_name(answer)}\nIs the proposed answer a correct answer to the question according to the "
            "knowledge graph? Reply with one word: yes or no."
        )
        return [{"role": "user", "content": "\n\n".join(parts)}]

    def _extra(self, record: KGQARecord, key: str):
        if key not in record.extra:
            raise KeyError(
                f"record {record.id!r} has no '{key}', which the {self.context} judge needs (the answering method "
                "must write it into the record)"
            )
        return record.extra[key]

    def score(self, records: Sequence[KGQARecord]) -> list[dict[str, float]]:
        pairs = [(i, a) for i, r in enumerate(records) for a in dict.fromkeys(r.prediction or [])]
        convs = [self.messages(records[i], a) for i, a in pairs]
        out: list[dict[str, float]] = [{} for _ in records]
        step = 256
        for start in tqdm(range(0, len(convs), step), desc=f"{self.name}", disable=not self.show_progress):
            gens = self.backend.generate_with_params(convs[start : start + step], self.generation)
            for (i, answer), gen in zip(pairs[start : start + step], gens):
                verdict = parse_verdict(gen.text)
                self.counts["answers"] += 1
                self.counts["malformed"] += verdict is None
                out[i][answer] = 0.5 if verdict is None else float(not verdict)
        if self.counts["malformed"]:
            log.warning("%s: %d of %d verdicts could not be parsed (scored 0.5)", self.name, self.counts["malformed"],
                        self.counts["answers"])  # fmt: skip
        return out


class SelfCheck(AnswerNodeScorer):
    """SelfCheckGPT for answer nodes: ``1 -`` the share of ``samples`` resampled answers that contain the node.

    Args:
        answerer: the answering method, re-run at ``temperature`` (any proposer with a ``generation`` attribute,
            such as :class:`~kglightning.llm.kaping.KAPINGAnswerer`).
        samples: ``N`` (the paper: 5 and 10).
        temperature: sampling temperature (the paper: 1.0).
        name: column prefix in the test table (default ``selfcheck_n<N>``).
    """

    def __init__(self, answerer: AnswerProposer, samples: int = 5, temperature: float = 1.0, name: str | None = None):
        if samples < 1 or temperature <= 0:
            raise ValueError("need samples >= 1 and temperature > 0")
        if not isinstance(getattr(answerer, "generation", None), GenerationParams):
            raise TypeError(f"{type(answerer).__name__} has no GenerationParams 'generation' to sample with")
        self.answerer = answerer
        self.samples = samples
        self.temperature = temperature
        self.name = name or f"selfcheck_n{samples}"

    @property
    def cache_key(self) -> str:
        key = f"{self.answerer.cache_key}-{self.samples}-{self.temperature:g}"
        return "selfcheck-" + hashlib.sha1(key.encode()).hexdigest()[:16]

    def score(self, records: Sequence[KGQARecord]) -> list[dict[str, float]]:
        base = self.answerer.generation  # type: ignore[attr-defined]
        drawn: list[list[list[str]]] = [[] for _ in records]
        try:
            for k in range(self.samples):
                self.answerer.generation = replace(base, temperature=self.temperature, seed=base.seed + 1 + k)  # type: ignore[attr-defined]
                for i, r in enumerate(self.answerer.propose([replace(r, prediction=None) for r in records])):
                    drawn[i].append(list(r.prediction or []))
        finally:
            self.answerer.generation = base  # type: ignore[attr-defined]
        keys = [[{normalize(x) for x in s} for s in samples] for samples in drawn]
        return [
            {
                a: sum(normalize(a) not in s for s in sample_keys) / self.samples
                for a in dict.fromkeys(r.prediction or [])
            }
            for r, sample_keys in zip(records, keys)
        ]
