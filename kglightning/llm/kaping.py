"""KG-Guard's LLM answerer: KAPING (Baek et al., 2023) over a question's subgraph, answers constrained to its nodes.

Per question, the subgraph's triples are verbalized (``(head, relation text, tail)``) and the ``top_triples`` most
similar to the question (MiniLM cosine) go into the prompt as facts, most similar first. The LLM answers with node
names of the subgraph, one per line, or ``unknown``: with ``constrained=True`` (the paper's structured generation)
every line is forced onto a node name by :class:`~kglightning.llm.trie.names.NameListLogitsProcessor`; otherwise
(a backend that cannot constrain, e.g. an endpoint) the lines are grounded to node names like every other answer of
the toolkit: equal after RoG normalization (:func:`~kglightning.llm.grounding.ground_answers`: case, punctuation and
articles ignored), then, with a ``grounder`` (:class:`~kglightning.retrieval.FaissGrounder`), to the most similar
name above its similarity floor; the other lines are dropped and counted. ``unknown`` is an abstention: an empty
``prediction``, which the detection data leaves out (KG-Guard §3.1) and counts.

With ``reasoning=True`` the answerer is KAPING as KG-Guard extends it (§4.1): after an answer (not after ``unknown``)
it is asked, in the same conversation, for a short reasoning summary (free text) and for the facts it relied on, as
lines copied from its facts (forced onto the fact lines when ``constrained``; matched exactly otherwise, the other
lines dropped and counted). They are written to ``extra["reasoning_summary"]`` and ``extra["reasoning_triples"]``,
which the ``G+RS`` and ``G+RS+RT`` judges of :mod:`kglightning.llm.node_judges` read; the detector does not use them.

With ``generation.logprobs``, ``extra["kaping"]`` also holds ``logprob`` and ``tokens``: the sum and count of the
token log-probabilities of the first answer's own line (the answer's tokens; line breaks and end tokens excluded), so
that ``"A"`` and ``"A\\nB"`` score ``A`` alike; the whole generation's for ``unknown``.

Generations go through the backend's response cache, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from kglightning.data.embeddings import SentenceEncoder, UsesEmbeddings
from kglightning.data.proposer import AnswerProposer
from kglightning.data.records import KGQARecord
from kglightning.data.text import prompt_name, relation_text
from kglightning.llm.backends.base import Generation, GenerationParams, LLMBackend
from kglightning.llm.grounding import ground_answers
from kglightning.llm.trie.names import UNKNOWN, NameChoice

if TYPE_CHECKING:  # retrieval shares llm's floor: the grounder is passed in (by class_path), never imported here
    from kglightning.retrieval.faiss_grounding import FaissGrounder

__all__ = ["KAPINGAnswerer"]

log = logging.getLogger(__name__)

INSTRUCTION = (
    "Below are facts in the form of (head, relation, tail) that might be relevant to answer the question. Answer "
    "with the names of the answer entities, exactly as they appear in the facts, one per line. If the facts do not "
    f"contain the answer, answer {UNKNOWN}."
)

#: the version of what a proposal stores (part of :attr:`KAPINGAnswerer.cache_key`)
FORMAT = 2

SUMMARY_REQUEST = "In one or two sentences, summarize the reasoning that led to your answer."
TRIPLES_REQUEST = "Copy the facts above that support your answer, one per line, exactly as they are written."


def fact_line(fact: Sequence[str]) -> str:
    """How a fact is written in the prompt (and cited back): ``(head, relation text, tail)``."""
    return f"({', '.join(map(prompt_name, fact))})"


def fact_texts(record: KGQARecord) -> list[str]:
    """The text of each triple of ``record.graph``, as KAPING embeds it: ``(head, relation text, tail)``."""
    return [f"({h}, {relation_text(r)}, {t})" for h, r, t in record.graph]


class KAPINGAnswerer(AnswerProposer, UsesEmbeddings):
    """Proposes answers with an LLM reading the question's top triples (see the module docstring).

    Args:
        backend: the LLM (any :class:`~kglightning.llm.backends.base.LLMBackend`; ``constrained`` needs one that
            supports ``choices``, such as :class:`~kglightning.llm.LocalHFBackend`).
        encoder: the sentence encoder that ranks triples (default: the bundled all-MiniLM-L6-v2).
        cache_dir: where text embeddings are cached (default ``$KGLIGHTNING_CACHE/embeddings``).
        top_triples: facts in the prompt.
        max_answers: most names in one answer.
        constrained: structured generation over the subgraph's node names.
        grounder: with ``constrained=False``, grounds answer lines that match no node name after normalization to
            the most similar one (near-miss spellings; :class:`~kglightning.retrieval.FaissGrounder`, with its
            similarity floor). ``None``: normalized exact names only.
        generation: decoding settings (the paper: temperature 0.1; greedy by default here).
        reasoning: also ask for a reasoning summary and the supporting facts (see the module docstring).
        reasoning_splits: the splits whose answers get the reasoning when a DataModule asks per split
            (:meth:`for_split`): the LLM judges read it on the test split only, and it costs two more generations
            per answer. ``None``: every split. The answers themselves do not change.
        reasoning_tokens: most new tokens of the summary.
        max_cited: most facts cited.
        show_progress: a progress bar over questions.
    """

    def __init__(
        self,
        backend: LLMBackend,
        encoder: SentenceEncoder | None = None,
        cache_dir: str | None = None,
        top_triples: int = 10,
        max_answers: int = 5,
        constrained: bool = True,
        grounder: FaissGrounder | None = None,
        generation: GenerationParams = GenerationParams(max_new_tokens=48),
        instruction: str = INSTRUCTION,
        reasoning: bool = False,
        reasoning_splits: list[str] | None = ["test"],  # noqa: B006 (never mutated; shown as the default by the CLI)
        reasoning_tokens: int = 64,
        max_cited: int = 3,
        show_progress: bool = True,
    ) -> None:
        if top_triples < 1 or max_answers < 1 or reasoning_tokens < 1 or max_cited < 1:
            raise ValueError("top_triples, max_answers, reasoning_tokens and max_cited must be >= 1")
        self.backend = backend
        self.encoder = encoder or SentenceEncoder()
        self.cache_dir = cache_dir
        self.top_triples = top_triples
        self.max_answers = max_answers
        self.constrained = constrained
        self.grounder = grounder
        self.generation = generation
        self.instruction = instruction
        self.reasoning = reasoning
        self.reasoning_splits = None if reasoning_splits is None else list(reasoning_splits)
        self.reasoning_tokens = reasoning_tokens
        self.max_cited = max_cited
        self.show_progress = show_progress
        self.counts = {"questions": 0, "unknown": 0, "empty_graph": 0, "dropped_lines": 0, "explained": 0,
                       "uncited": 0, "dropped_citations": 0, "fuzzy_grounded": 0, "logprob_unaligned": 0}  # fmt: skip

    @property
    def cache_key(self) -> str:
        """What the proposals depend on: the backend, encoder, prompt, every decoding setting and the grounding.

        ``v{FORMAT}`` marks what the stored proposals hold (2: ``logprob`` of the answer's own line)."""
        texts = [self.instruction, *((SUMMARY_REQUEST, TRIPLES_REQUEST) if self.reasoning else ())]
        prompt = hashlib.sha1("\x00".join(texts).encode()).hexdigest()[:8]
        decoding = hashlib.sha1(json.dumps(self.generation.to_dict(), sort_keys=True).encode()).hexdigest()[:8]
        return (
            f"kaping-v{FORMAT}-{self.backend.cache_key}-{self.encoder.cache_key}-t{self.top_triples}"
            f"-a{self.max_answers}-c{int(self.constrained)}-d{decoding}-i{prompt}"
            + (f"-r{self.reasoning_tokens}-m{self.max_cited}" if self.reasoning else "")
            # unconstrained answers are grounded after generation: how is part of the proposals' key
            + ("" if self.constrained else f"-g{'norm' if self.grounder is None else self.grounder.cache_key}")
        )

    @property
    def grounds_near_misses(self) -> bool:
        """Whether :attr:`grounder` is used: only unconstrained answers can miss a node name."""
        return self.grounder is not None and not self.constrained

    def for_split(self, split: str) -> KAPINGAnswerer:
        """This answerer, without the reasoning for a split outside ``reasoning_splits`` (counts are shared)."""
        if not self.reasoning or self.reasoning_splits is None or split in self.reasoning_splits:
            return self
        plain = copy.copy(self)
        plain.reasoning = False
        return plain

    @property
    def encoder_hint(self) -> SentenceEncoder:
        return self.encoder

    def facts(self, record: KGQARecord) -> list[tuple[str, str, str]]:
        """The ``top_triples`` triples of the record's graph most similar to its question, best first."""
        if not record.graph:
            return []
        emb = self.embeddings.embed(fact_texts(record))
        q = self.embeddings.embed([record.question])[0]
        order = (emb @ q).argsort(descending=True, stable=True)[: self.top_triples].tolist()
        return [(record.graph[i][0], relation_text(record.graph[i][1]), record.graph[i][2]) for i in order]

    def messages(self, record: KGQARecord, facts: Sequence[tuple[str, str, str]]) -> list[dict[str, str]]:
        lines = "\n".join(fact_line(f) for f in facts)
        return [{"role": "user", "content": f"{self.instruction}\n\n{lines}\n\nQuestion: {record.question}"}]

    def choice(self, record: KGQARecord) -> NameChoice:
        """What the answer may name: every node of the record's graph, or ``unknown``."""
        return NameChoice(tuple(sorted({n for h, _, t in record.graph for n in (h, t)})), self.max_answers)

    def _ground(self, text: str, choice: NameChoice) -> tuple[list[str], bool, int, list[int]]:
        """``(names, abstained, dropped lines, line of each name)`` of one answer (see the module docstring).

        A name's line is the index, in ``text.split("\\n")``, of the first line that names it."""
        names, unknown, dropped = choice.parse(text)
        raw = [line.strip() for line in text.split("\n")]
        if self.constrained or not dropped:
            return names, unknown, dropped, [raw.index(n) for n in names]
        first = {}
        for i, line in enumerate(raw):
            if line:
                first.setdefault(line, i)
        matched = self.grounder.matched if self.grounder is not None else 0
        # each line's "confidence" is minus its index: an entity keeps the highest, i.e. its first line
        grounded = ground_answers({line: -i for line, i in first.items()}, choice.names, near_miss=self.grounder)
        if self.grounder is not None:
            self.counts["fuzzy_grounded"] += self.grounder.matched - matched
        entities = list(grounded.entities)
        return entities, unknown, len(grounded.unmatched), [-int(grounded.entities[e]) for e in entities]  # type: ignore[arg-type]

    @staticmethod
    def answer_logprob(gen: Generation, line: int | None) -> tuple[float, int] | None:
        """``(sum of log-probabilities, tokens)`` of the answer written on ``line`` of ``gen.text`` (its own tokens,
        see :meth:`~kglightning.llm.backends.base.Generation.line_logprobs`); the whole generation's when ``line`` is
        ``None`` (no answer); ``None`` without log-probabilities, or when the tokens' line of that number does not
        write that line's text (tokens shifted against the text: a ``response_prefix``, a server's reasoning)."""
        if gen.token_logprobs is None:
            return None
        if line is None:
            return sum(gen.token_logprobs), len(gen.token_logprobs)
        lines = gen.line_logprobs()
        wanted = "".join(gen.text.split("\n")[line].split())
        if line >= len(lines) or not wanted or lines[line][0] != wanted:
            return None
        return lines[line][1], lines[line][2]

    def explain(self, convs: list[list[dict[str, str]]], answers: list[list[str]],
                facts: list[list[tuple[str, str, str]]]) -> list[dict[str, Any]]:  # fmt: skip
        """The reasoning summary and the cited facts of each answered conversation (two batched generations)."""
        follow = [[*c, {"role": "assistant", "content": "\n".join(a)}] for c, a in zip(convs, answers)]
        summary_params = replace(self.generation, max_new_tokens=self.reasoning_tokens, logprobs=False)
        summaries = self.backend.generate_with_params(
            [[*c, {"role": "user", "content": SUMMARY_REQUEST}] for c in follow], summary_params
        )
        lines = [[fact_line(f) for f in fs] for fs in facts]
        choices = [NameChoice(tuple(ls), self.max_cited) for ls in lines]
        cite_params = replace(self.generation, max_new_tokens=self.generation.max_new_tokens * 2, logprobs=False)
        cite_convs = [[*c, {"role": "user", "content": TRIPLES_REQUEST}] for c in follow]
        if self.constrained:
            cited = self.backend.generate_with_params(cite_convs, cite_params, choices)
        else:
            cited = self.backend.generate_with_params(cite_convs, cite_params)
        out = []
        for fs, ls, choice, summary, gen in zip(facts, lines, choices, summaries, cited):
            names, _, dropped = choice.parse(gen.text)
            by_line = dict(zip(ls, fs))
            triples = [list(by_line[n]) for n in names]
            self.counts["explained"] += 1
            self.counts["uncited"] += not triples
            self.counts["dropped_citations"] += dropped
            out.append({"reasoning_summary": summary.text.strip(), "reasoning_triples": triples})
        return out

    def propose(self, records: Iterable[KGQARecord], chunk_size: int = 64) -> list[KGQARecord]:
        """Copies of ``records`` with ``prediction`` (an empty list for ``unknown``) and ``extra['kaping']``."""
        records = list(records)
        out: list[KGQARecord] = []
        bar = tqdm(total=len(records), desc="KAPING answers", unit="q", disable=not self.show_progress)
        for start in range(0, len(records), chunk_size):
            chunk = records[start : start + chunk_size]
            # the chunk's new strings encoded (and written as one cache shard) at once, not question by question
            self.embeddings.add([t for r in chunk for t in fact_texts(r)] + [r.question for r in chunk])
            facts = [self.facts(r) for r in chunk]
            convs = [self.messages(r, f) for r, f in zip(chunk, facts)]
            choices = [self.choice(r) for r in chunk]
            if self.constrained:
                try:
                    gens = self.backend.generate_with_params(convs, self.generation, choices)
                except NotImplementedError as e:
                    raise NotImplementedError(f"{e}; or set constrained: false") from e
            else:
                gens = self.backend.generate_with_params(convs, self.generation)
            grounded = [self._ground(gen.text, choice) for gen, choice in zip(gens, choices)]
            answered = [i for i, (names, unknown, _, _) in enumerate(grounded) if names and not unknown]
            reasons: dict[int, dict[str, Any]] = {}
            if self.reasoning and answered:
                why = self.explain([convs[i] for i in answered], [grounded[i][0] for i in answered],
                                   [facts[i] for i in answered])  # fmt: skip
                reasons = dict(zip(answered, why))
            for k, (record, fact, gen) in enumerate(zip(chunk, facts, gens)):
                names, unknown, dropped, where = grounded[k]
                self.counts["questions"] += 1
                self.counts["empty_graph"] += not record.graph
                self.counts["unknown"] += unknown or not names
                self.counts["dropped_lines"] += dropped
                info = {"raw": gen.text, "unknown": unknown or not names, "dropped_lines": dropped,
                        "facts": [list(f) for f in fact]}  # fmt: skip
                if gen.token_logprobs is not None:  # generation.logprobs: the first answer's own log-probability
                    scored = self.answer_logprob(gen, where[0] if names else None)
                    if scored is None:  # the tokens do not write the answer's line where the text has it
                        self.counts["logprob_unaligned"] += 1
                        scored = (sum(gen.token_logprobs), len(gen.token_logprobs))
                    info |= {"logprob": scored[0], "tokens": scored[1]}
                extra = dict(record.extra, kaping=info, **reasons.get(k, {}))
                out.append(replace(record, prediction=names, confidence=None, prediction_paths=None, extra=extra))
            bar.update(len(chunk))
        bar.close()
        c = self.counts
        log.info("KAPING: %d questions, %d unknown (abstentions), %d empty graphs, %d answer lines dropped%s",
                 c["questions"], c["unknown"], c["empty_graph"], c["dropped_lines"],
                 f", {c['fuzzy_grounded']} lines grounded by similarity" if self.grounds_near_misses else "")  # fmt: skip
        if c["logprob_unaligned"]:
            log.warning("KAPING: %d answers scored over their whole generation: their tokens do not show the answer's "
                        "line", c["logprob_unaligned"])  # fmt: skip
        if self.reasoning:
            log.info("KAPING reasoning: %d answers explained, %d without a cited fact, %d citation lines dropped",
                     c["explained"], c["uncited"], c["dropped_citations"])  # fmt: skip
        return out
