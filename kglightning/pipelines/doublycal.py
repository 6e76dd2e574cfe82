"""The DoublyCal inference pipeline (DoublyCal §4.3, ablations of §5.4), run by ``predict``.

Per question: the proxy (:class:`~kglightning.modules.ProxySFT` with its trained adapter) writes top-K evidence
``<PATH confidence=c>...</PATH>``, optionally through a KG-Trie so that every path exists in the question's graph;
each evidence is grounded in the graph and its path instances are verbalized with ``[Confidence: c]``; a black-box
reasoner (any :class:`~kglightning.llm.backends.LLMBackend`: the bundled SmolLM2, a local HF model, or an
OpenAI-compatible endpoint) answers with verbalized ``{answer: confidence}``. The same evidence feeds every variant:

* ``doublycal``: evidence with its confidence (double calibration);
* ``singlecal``: the same evidence without confidence (only the reasoner's own verbalized UQ);
* ``evidence_only``: no reasoner; the grounded entities are the answers, each with the highest confidence of the
  evidence that reaches it;
* ``llm_only``: the reasoner without evidence.

At the end of ``predict`` the pipeline writes ``evidence.jsonl`` (the proxy's raw and parsed output), each variant's
predictions and evaluation, ``comparison.md``/``comparison.json`` (Hit, Recall, F1, EM, ECE, Brier, abstentions,
reasoner input tokens per question) and ``reliability_comparison.png`` to the predicted split's folder in
``output_dir`` (``outputs/doublycal/test/``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from kglightning.data.kg import KGIndex
from kglightning.data.records import KGQARecord
from kglightning.evidence.builder import EvidenceBuilder
from kglightning.evidence.format import parse_evidence
from kglightning.evidence.verbalize import path_instances, verbalize_instance
from kglightning.fileio import SplitOutputs, atomic_write, clear_outputs, write_text_atomic
from kglightning.llm.backends.base import Generation, GenerationParams, LLMBackend
from kglightning.llm.grounding import ground_answers
from kglightning.llm.parsing import ParseStats, parse_answers
from kglightning.llm.prompts import EvidenceLine, EvidenceMode, UQPrompt, VanillaPrompt, count_tokens
from kglightning.llm.trie import TrieConfig
from kglightning.modules.proxy_sft import ProxySFT
from kglightning.pipelines._ddp import gather_unique_rows, sum_over_ranks
from kglightning.pipelines.evidence_cache import ProxyEvidenceCache, proxy_identity
from kglightning.pipelines.report import comparison_markdown, comparison_outputs, write_comparison
from kglightning.retrieval.faiss_grounding import FaissGrounder

__all__ = ["VARIANTS", "DoublyCalPipeline", "Variant"]

log = logging.getLogger(__name__)

Variant = Literal["doublycal", "singlecal", "evidence_only", "llm_only"]
VARIANTS: tuple[str, ...] = ("doublycal", "singlecal", "evidence_only", "llm_only")
_MODE: dict[str, EvidenceMode] = {"doublycal": "with_confidence", "singlecal": "without_confidence", "llm_only": "none"}


def _left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (width - len(r)) + list(r) for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return ids, mask


class DoublyCalPipeline(SplitOutputs, L.LightningModule):
    """Proxy evidence → grounding → verbalized evidence → reasoner, for DoublyCal and its ablations.

    Batches are lists of :class:`~kglightning.data.records.KGQARecord` (:class:`~kglightning.datamodules.KGQADataModule`).

    Args:
        proxy: the trained evidence proxy (give its ``adapter_path``); its ``num_evidence``/``decoding`` set K.
        reasoner: the black-box LLM.
        variants: which answers to produce (default all four, see the module docstring).
        prompt: the reasoner's verbalized-UQ style (App. C), with its system message: a
            :class:`~kglightning.llm.prompts.UQPrompt` (``VanillaPrompt``, ``CoTPrompt``, ``SelfProbingPrompt`` or
            a subclass of your own).
        generation: the reasoner's decoding settings (:class:`~kglightning.llm.backends.GenerationParams`; default
            greedy, 128 new tokens per round).
        trie: generate evidence through the KG-Trie of the question's graph, so that every path exists in the KG
            (:class:`~kglightning.llm.trie.TrieConfig`); ``None`` decodes without it.
        builder: grounds the evidence (its ``max_hops`` does not limit grounding).
        max_instances: grounded path instances shown to the reasoner per evidence.
        missing_confidence: confidence given to an answer the reasoner wrote without one (counted as
            ``missing_confidence`` in the parse statistics).
        output_dir: where the report goes, one subfolder per predicted split
            (``outputs/doublycal/test/``; ``{split}`` in it places the split's name elsewhere).
        proxy_cache_dir: folder of a cache of the proxy's evidence per question
            (:class:`~kglightning.pipelines.evidence_cache.ProxyEvidenceCache`), so that a rerun after a crash does
            not generate it again; ``None``: no cache.
        n_bins: calibration bins.
        grounder: grounds answers that match no entity name exactly to the most similar name
            (:class:`~kglightning.retrieval.FaissGrounder`); ``None`` keeps exact matching only.
    """

    def __init__(
        self,
        proxy: ProxySFT,
        reasoner: LLMBackend,
        variants: list[Variant] | None = None,
        prompt: UQPrompt = VanillaPrompt(),
        generation: GenerationParams = GenerationParams(max_new_tokens=128),
        trie: TrieConfig | None = TrieConfig(),
        builder: EvidenceBuilder | None = None,
        max_instances: int = 5,
        missing_confidence: float = 0.5,
        output_dir: str = "outputs/doublycal",
        n_bins: int = 10,
        grounder: FaissGrounder | None = None,
        proxy_cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        variants = list(variants or VARIANTS)
        unknown = sorted(set(variants) - set(VARIANTS))
        if unknown or not variants:
            raise ValueError(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
        if not 0.0 <= missing_confidence <= 1.0:
            raise ValueError(f"missing_confidence must be in [0, 1], got {missing_confidence}")
        if max_instances < 1:
            raise ValueError(f"max_instances must be >= 1, got {max_instances}")
        self.proxy = proxy
        self.reasoner = reasoner
        self.variants = list(dict.fromkeys(variants))
        self.prompt = prompt
        self.trie = trie
        self.builder = builder or EvidenceBuilder()
        self.max_instances = max_instances
        self.params = generation
        self.missing_confidence = missing_confidence
        self.output_dir = output_dir
        self.n_bins = n_bins
        self.grounder = grounder
        self.proxy_cache_dir = proxy_cache_dir
        self.proxy_cache: ProxyEvidenceCache | None = None
        self._reset_stats()

    def _reset_stats(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.evidence_stats = ParseStats()
        self.answer_stats = {v: ParseStats() for v in self.variants}
        self.counts = {"evidence": 0, "ungrounded_evidence": 0, "questions_without_evidence": 0, "cached_evidence": 0}

    # evidence

    def proxy_texts(self, records: Sequence[KGQARecord], kgs: Sequence[KGIndex] | None = None) -> list[list[str]]:
        """The proxy's generated texts, ``K`` per question (KG-Trie constrained unless ``trie`` is ``None``).

        Args:
            records: the questions.
            kgs: their graphs, when already built (the tries are built from them).
        """
        out: list[list[str] | None] = [None] * len(records)
        if self.proxy_cache is not None:
            out = [self.proxy_cache.get(r) for r in records]
            self.counts["cached_evidence"] += sum(t is not None for t in out)
        todo = [i for i, t in enumerate(out) if t is None]
        if todo:
            kgs = None if kgs is None else [kgs[i] for i in todo]
            for i, texts in zip(todo, self._generate_evidence([records[i] for i in todo], kgs)):
                out[i] = texts
                if self.proxy_cache is not None:
                    self.proxy_cache.put(records[i], texts)
        return [t or [] for t in out]

    def _generate_evidence(
        self, records: Sequence[KGQARecord], kgs: Sequence[KGIndex] | None = None
    ) -> list[list[str]]:
        tok = self.proxy.tokenizer
        rows = []
        for rec in records:
            text = self.proxy.prompt_format.evidence_prompt(tok, rec.question)
            rows.append(tok(text, add_special_tokens=False)["input_ids"])
        ids, mask = _left_pad(rows, tok.pad_token_id, self.proxy.device)
        tries = None
        if self.trie is not None:
            kgs = kgs or [KGIndex.from_record(r) for r in records]
            tries = [self.trie.build(tok, kg, rec.q_entity) for rec, kg in zip(records, kgs)]
        texts, _ = self.proxy.generate_texts(ids, mask, tries=tries)
        k = len(texts) // len(records)
        return [texts[i * k : (i + 1) * k] for i in range(len(records))]

    def ground_evidence(self, record: KGQARecord, texts: Sequence[str], kg: KGIndex | None = None) -> list[dict]:
        """Parse, de-duplicate (first rank wins) and ground the proxy's evidence for one question.

        Returns one dict per distinct well-formed evidence that grounds to at least one entity: ``relations``,
        ``constraint``, ``confidence``, ``rank``, ``answers`` (the grounded entities) and ``paths`` (verbalized
        instances, at most ``max_instances``). Evidence that grounds to nothing is counted and left out.
        """
        seen: dict[tuple[Any, ...], tuple[int, Any]] = {}
        for rank, text in enumerate(texts):
            for z in parse_evidence(text, require_confidence=True, stats=self.evidence_stats).evidence:
                seen.setdefault((z.relations, z.constraint), (rank, z.to_evidence()))
        if not seen:
            return []
        ranks, evidence = zip(*seen.values())
        kg = KGIndex.from_record(record) if kg is None else kg
        grounded = self.builder.ground_all(record, evidence, kg)
        out = []
        for rank, z, answers in zip(ranks, evidence, grounded):
            self.counts["evidence"] += 1
            if not answers:
                self.counts["ungrounded_evidence"] += 1
                continue
            instances = path_instances(kg, record.q_entity, z, self.max_instances)
            out.append(
                {
                    "relations": list(z.relations),
                    "constraint": None if z.constraint is None else list(z.constraint),
                    "confidence": z.confidence,
                    "rank": rank,
                    "answers": sorted(answers),
                    "paths": [verbalize_instance(p, z.constraint) for p in instances],
                }
            )
        return out

    # answers

    def _answer(self, variant: str, text: str, entities: Sequence[str]) -> dict[str, Any]:
        parsed = parse_answers(text, self.answer_stats[variant])
        ranked = parsed.ranked()
        conf = [self.missing_confidence if parsed.answers[a] is None else parsed.answers[a] for a in ranked]
        entities = ground_answers(parsed, entities, near_miss=self.grounder).entities
        return {"prediction": ranked, "confidence": conf, "entities": sorted(entities), "issues": parsed.issues}

    @staticmethod
    def evidence_answers(evidence: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The ``evidence_only`` answer: every grounded entity with the highest confidence reaching it.

        Example:
            >>> z = [{"answers": ["Spike"], "confidence": 0.75}, {"answers": ["Belle", "Spike"], "confidence": 0.5}]
            >>> DoublyCalPipeline.evidence_answers(z)
            {'prediction': ['Spike', 'Belle'], 'confidence': [0.75, 0.5], 'input_tokens': 0}
        """
        best: dict[str, float] = {}
        for z in evidence:
            for a in z["answers"]:
                best[a] = max(best.get(a, 0.0), z["confidence"])
        ranked = sorted(best, key=lambda a: -best[a])
        return {"prediction": ranked, "confidence": [best[a] for a in ranked], "input_tokens": 0}

    def _messages(self, variant: str, record: KGQARecord, evidence: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
        lines = [EvidenceLine(p, z["confidence"]) for z in evidence for p in z["paths"]]
        return self.prompt.first_round(record.question, lines, _MODE[variant])

    def _tokens(self, messages: list[dict[str, str]], gen: Generation) -> int:
        return gen.prompt_tokens or count_tokens(messages)

    def reason(
        self, records: Sequence[KGQARecord], evidence: Sequence[Sequence[dict[str, Any]]], kgs: Sequence[KGIndex]
    ) -> list[dict[str, Any]]:
        """Run every LLM variant on every question in one backend call per round; per question, variant -> answer.

        Args:
            records: the questions.
            evidence: per question, its grounded evidence (:meth:`ground_evidence`).
            kgs: per question, its graph (answers are matched to its entity names).
        """
        jobs = [(v, i) for v in self.variants if v in _MODE for i in range(len(records))]
        convs = [self._messages(v, records[i], evidence[i]) for v, i in jobs]
        gens = self.reasoner.generate_with_params(convs, self.params) if jobs else []
        tokens = [self._tokens(c, g) for c, g in zip(convs, gens)]
        if self.prompt.two_rounds and jobs:
            convs = [self.prompt.second_round(c, g.text) for c, g in zip(convs, gens)]
            gens = self.reasoner.generate_with_params(convs, self.params)
            tokens = [t + self._tokens(c, g) for t, c, g in zip(tokens, convs, gens)]
        out: list[dict[str, Any]] = [{} for _ in records]
        for (v, i), g, t in zip(jobs, gens, tokens):
            out[i][v] = {**self._answer(v, g.text, kgs[i].entities), "raw": g.text, "input_tokens": t}
        if "evidence_only" in self.variants:
            for i, z in enumerate(evidence):
                out[i]["evidence_only"] = self.evidence_answers(z)
        return out

    # Lightning hooks

    def predict_step(self, batch: list[KGQARecord], batch_idx: int) -> list[dict[str, Any]]:
        records = list(batch)
        uses_evidence = any(v != "llm_only" for v in self.variants)
        kgs = [KGIndex.from_record(r) for r in records]
        texts = self.proxy_texts(records, kgs) if uses_evidence else [[] for _ in records]
        evidence = [self.ground_evidence(r, t, kg) for r, t, kg in zip(records, texts, kgs)]
        self.counts["questions_without_evidence"] += sum(not z for z in evidence)
        answers = self.reason(records, evidence, kgs)
        rows = [
            {
                "id": r.id,
                "question": r.question,
                "answer": list(r.answer),
                "q_entity": list(r.q_entity),
                "proxy_raw": t,
                "evidence": z,
                "variants": {v: a[v] for v in self.variants},
            }
            for r, t, z, a in zip(records, texts, evidence, answers)
        ]
        self.rows.extend(rows)
        return rows

    def output_files(self) -> list[Path]:
        """The files :meth:`write_report` writes."""
        out = self.run_dir()
        return [out / "evidence.jsonl", out / "run_stats.json", *comparison_outputs(out, self.variants)]

    def on_predict_start(self) -> None:
        self._reset_stats()
        self.proxy.eval()
        if self.proxy_cache_dir is not None:  # keyed by the weights as loaded now (after any checkpoint)
            key = proxy_identity(self.proxy, self.trie)
            self.proxy_cache = ProxyEvidenceCache(self.proxy_cache_dir, key, uses_graph=self.trie is not None)
        if self.trainer.is_global_zero:  # a run killed before its report leaves no earlier report behind
            clear_outputs(self.output_files())

    def on_predict_epoch_end(self) -> None:
        rows = gather_unique_rows(self.rows)
        stats = sum_over_ranks(self._run_stats())  # every process's counters, as the rows are every process's
        if self.trainer.is_global_zero and rows:
            self.results = self.write_report(rows, stats)

    def _grounder_counts(self) -> dict[str, Any]:
        if self.grounder is None:
            return {}
        return {"faiss_grounding": {"matched": self.grounder.matched, "unmatched": self.grounder.unmatched}}

    def _run_stats(self) -> dict[str, Any]:
        """This process's counters: evidence, proxy and answer parsing, faiss grounding."""
        return {
            **self.counts,
            "evidence_parse": self.evidence_stats.as_dict(),
            "answer_parse": {v: s.as_dict() for v, s in self.answer_stats.items()},
            **self._grounder_counts(),
        }

    def write_report(
        self, rows: Sequence[dict[str, Any]], stats: dict[str, Any] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Write ``evidence.jsonl``, the per-variant predictions and the comparison; return the results table.

        ``stats``: the counters for ``run_stats.json`` (default: this process's, :meth:`_run_stats`)."""
        out = self.run_dir()
        out.mkdir(parents=True, exist_ok=True)
        with atomic_write(out / "evidence.jsonl") as f:
            for row in rows:
                keep = ("id", "question", "answer", "q_entity", "proxy_raw", "evidence")
                f.write(json.dumps({k: row[k] for k in keep}, ensure_ascii=False) + "\n")
        results = write_comparison(rows, self.variants, out, self.n_bins)
        stats = {"questions": len(rows), **(self._run_stats() if stats is None else stats)}
        write_text_atomic(out / "run_stats.json", json.dumps(stats, indent=2) + "\n")
        rank_zero_info(
            f"DoublyCal comparison on {len(rows)} questions ({out}/comparison.md):\n" + comparison_markdown(results)
        )
        counts = {k: stats[k] for k in self.counts if k in stats}
        rank_zero_info(f"evidence: {counts}; proxy parse: {stats['evidence_parse']}")
        return results
