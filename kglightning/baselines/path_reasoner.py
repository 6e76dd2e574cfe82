"""A retriever-reasoner KBQA baseline: rank relation paths by sentence similarity, answer with their end entities.

For each question, every relation path of up to ``max_hops`` hops that starts at a topic entity is rendered as
text (``"location country capital -> inverse of location location containedby"``) and scored by the cosine
similarity of its MiniLM embedding with the question's. A softmax with temperature over the scores of all the
question's paths gives each path a probability. The ``top_k_paths`` best paths are followed; each end entity gets
the highest probability of a selected path that reaches it as its confidence.

Its mistakes are real KBQA mistakes (a plausible but wrong relation, a path one hop short, an answer the retrieval
dropped), which is why its predictions are the training data of the hallucination detector.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

import torch
from tqdm.auto import tqdm

from kglightning.data.embeddings import SentenceEncoder, UsesEmbeddings
from kglightning.data.kg import KGIndex
from kglightning.data.kg_paths import topic_relation_paths
from kglightning.data.proposer import AnswerProposer
from kglightning.data.records import KGQARecord
from kglightning.data.text import path_text

log = logging.getLogger(__name__)


class EmbeddingPathReasoner(AnswerProposer, UsesEmbeddings):
    """Proposes answers with a confidence by ranking relation paths from the topic entities.

    Args:
        encoder: the sentence encoder (default: the bundled all-MiniLM-L6-v2).
        cache_dir: where text embeddings are cached (default ``$KGLIGHTNING_CACHE/embeddings``).
        max_hops: longest relation path considered.
        top_k_paths: number of best paths followed at most.
        min_relative_prob: a path among the top ``top_k_paths`` is followed only if its probability is at least
            this fraction of the best path's (``0`` follows all of them).
        max_answers: most answers returned per question (highest confidence first).
        max_path_fanout: paths that end in more entities than this are ignored (they answer nothing specific).
        max_paths_per_entity: bound on enumerated paths per topic entity.
        temperature: softmax temperature over path similarities.
        show_progress: show a progress bar.

    Questions whose topic entities are absent from their graph, or that have no path, get an empty prediction
    (an abstention); they are counted in :attr:`num_abstained` and logged.
    """

    def __init__(
        self,
        encoder: SentenceEncoder | None = None,
        cache_dir: str | None = None,
        max_hops: int = 2,
        top_k_paths: int = 3,
        min_relative_prob: float = 0.0,
        max_answers: int = 20,
        max_path_fanout: int = 50,
        max_paths_per_entity: int = 2000,
        temperature: float = 0.05,
        show_progress: bool = True,
    ) -> None:
        if max_hops < 1 or top_k_paths < 1 or max_answers < 1:
            raise ValueError("max_hops, top_k_paths and max_answers must be >= 1")
        if not 0 <= min_relative_prob <= 1:
            raise ValueError(f"min_relative_prob must be in [0, 1], got {min_relative_prob}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.encoder = encoder or SentenceEncoder()
        self.cache_dir = cache_dir
        self.max_hops = max_hops
        self.top_k_paths = top_k_paths
        self.min_relative_prob = min_relative_prob
        self.max_answers = max_answers
        self.max_path_fanout = max_path_fanout
        self.max_paths_per_entity = max_paths_per_entity
        self.temperature = temperature
        self.show_progress = show_progress
        self.num_abstained = 0

    @property
    def cache_key(self) -> str:
        """Identifies this configuration, so cached proposals of another configuration are never reused."""
        return (
            f"paths-{self.encoder.cache_key}-h{self.max_hops}-k{self.top_k_paths}-r{self.min_relative_prob:g}"
            f"-a{self.max_answers}"
            f"-f{self.max_path_fanout}-p{self.max_paths_per_entity}-t{self.temperature:g}"
        )

    @property
    def encoder_hint(self) -> SentenceEncoder:
        return self.encoder

    def candidate_paths(self, record: KGQARecord, kg: KGIndex | None = None) -> dict[tuple[str, ...], set[str]]:
        """Relation paths from the record's topic entities (found in its graph) to their end entities."""
        kg = kg or KGIndex.from_record(record)
        return topic_relation_paths(kg, record.q_entity, self.max_hops, self.max_paths_per_entity, self.max_path_fanout)

    def _answer(
        self, q_emb: torch.Tensor, paths: dict[tuple[str, ...], set[str]]
    ) -> tuple[list[str], list[float], list]:
        keys = sorted(paths)
        emb = self.embeddings.embed([path_text(p) for p in keys])
        sims = emb @ q_emb
        probs = torch.softmax(sims / self.temperature, dim=0)
        order = torch.argsort(probs, descending=True, stable=True)[: self.top_k_paths].tolist()
        order = [i for i in order if probs[i] >= self.min_relative_prob * probs[order[0]]]
        conf: dict[str, float] = {}
        for i in order:
            for entity in paths[keys[i]]:
                conf[entity] = max(conf.get(entity, 0.0), float(probs[i]))
        ranked = sorted(conf.items(), key=lambda kv: (-kv[1], kv[0]))[: self.max_answers]
        evidence = [
            {"path": list(keys[i]), "score": round(float(sims[i]), 6), "prob": round(float(probs[i]), 6)} for i in order
        ]
        return [e for e, _ in ranked], [min(1.0, max(0.0, c)) for _, c in ranked], evidence

    def propose(self, records: Iterable[KGQARecord], chunk_size: int = 256) -> list[KGQARecord]:
        """Copies of ``records`` with ``prediction``, ``confidence`` and ``extra['evidence']`` filled in."""
        records = list(records)
        out: list[KGQARecord] = []
        bar = tqdm(total=len(records), desc="proposing answers", disable=not self.show_progress, unit="q")
        for start in range(0, len(records), chunk_size):
            chunk = records[start : start + chunk_size]
            q_emb = self.embeddings.embed([r.question for r in chunk])
            for record, q in zip(chunk, q_emb):
                paths = self.candidate_paths(record)
                if paths:
                    pred, conf, evidence = self._answer(q, paths)
                else:
                    pred, conf, evidence = [], [], []
                    self.num_abstained += 1
                extra = dict(record.extra, evidence=evidence)
                out.append(replace(record, prediction=pred, confidence=conf, prediction_paths=None, extra=extra))
            bar.update(len(chunk))
        bar.close()
        if self.num_abstained:
            log.info(
                "path reasoner abstained on %d of %d questions (no topic entity or no path in the graph)",
                self.num_abstained,
                len(records),
            )
        return out
