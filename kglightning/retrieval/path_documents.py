"""KG evidence as text documents: the best relation paths of a question, each with its grounded instances.

For methods written for text passages (SGIC), a question's graph becomes a short list of documents. Every relation
path of up to ``max_hops`` hops from a topic entity is a candidate (:func:`~kglightning.data.kg_paths.topic_relation_paths`);
candidates are ranked by the cosine similarity of their MiniLM embedding (``path_text``) with the question's, without
looking at the answers; each of the ``num_documents`` best becomes one document: its grounded path instances
(``Snoopy -> sibling_of -> Spike; Snoopy -> sibling_of -> Belle``), at most ``max_instances`` of them. The lower-ranked
documents are the distractors that SGIC's document uncertainty has to tell apart.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from kglightning.data.embeddings import SentenceEncoder, UsesEmbeddings
from kglightning.data.kg import KGIndex
from kglightning.data.kg_paths import topic_relation_paths
from kglightning.data.records import KGQARecord
from kglightning.data.text import path_text
from kglightning.evidence.schema import Evidence
from kglightning.evidence.verbalize import path_instances, verbalize_instance
from kglightning.retrieval.documents import DocumentSource

__all__ = ["PathDocuments"]

log = logging.getLogger(__name__)


class PathDocuments(DocumentSource, UsesEmbeddings):
    """Turns KG records into ranked text documents (one relation path and its instances per document).

    Args:
        encoder: the sentence encoder (default: the bundled all-MiniLM-L6-v2).
        cache_dir: where text embeddings are cached (default ``$KGLIGHTNING_CACHE/embeddings``).
        num_documents: documents per question (the best-ranked paths).
        max_hops: longest relation path.
        max_instances: grounded instances written per document.
        max_path_fanout: paths ending in more entities than this are not candidates.
        max_paths_per_entity: bound on enumerated paths per topic entity.
        show_progress: a progress bar over questions.

    A question whose topic entities are not in its graph, or that has no path, gets no document; it is counted in
    :attr:`num_without_documents`.
    """

    def __init__(
        self,
        encoder: SentenceEncoder | None = None,
        cache_dir: str | None = None,
        num_documents: int = 5,
        max_hops: int = 2,
        max_instances: int = 3,
        max_path_fanout: int = 50,
        max_paths_per_entity: int = 2000,
        show_progress: bool = True,
    ) -> None:
        if min(num_documents, max_hops, max_instances, max_path_fanout) < 1:
            raise ValueError("num_documents, max_hops, max_instances and max_path_fanout must be >= 1")
        self.encoder = encoder or SentenceEncoder()
        self.cache_dir = cache_dir
        self.num_documents = num_documents
        self.max_hops = max_hops
        self.max_instances = max_instances
        self.max_path_fanout = max_path_fanout
        self.max_paths_per_entity = max_paths_per_entity
        self.show_progress = show_progress
        self.num_without_documents = 0

    @property
    def cache_key(self) -> str:
        return (
            f"paths:{self.encoder.cache_key}:n{self.num_documents}:h{self.max_hops}:i{self.max_instances}"
            f":f{self.max_path_fanout}:p{self.max_paths_per_entity}"
        )

    def ranked_paths(self, record: KGQARecord, kg: KGIndex, q_emb: torch.Tensor) -> list[tuple[str, ...]]:
        """The record's candidate relation paths, most similar to the question first (ties: path order)."""
        paths = sorted(
            topic_relation_paths(kg, record.q_entity, self.max_hops, self.max_paths_per_entity, self.max_path_fanout)
        )
        if not paths:
            return []
        sims = self.embeddings.embed([path_text(p) for p in paths]) @ q_emb
        order = torch.argsort(sims, descending=True, stable=True)[: self.num_documents].tolist()
        return [paths[i] for i in order]

    def document(self, record: KGQARecord, kg: KGIndex, relations: Sequence[str]) -> str:
        """One path's grounded instances, ``; ``-separated."""
        instances = path_instances(kg, record.q_entity, Evidence(None, tuple(relations)), self.max_instances)
        return "; ".join(verbalize_instance(p) for p in instances)

    def __call__(self, records: Sequence[KGQARecord]) -> list[list[str]]:
        """Per record, its documents, best first (an empty list when it has no path)."""
        records = list(records)
        if not records:
            return []
        q_emb = self.embeddings.embed([r.question for r in records])
        out: list[list[str]] = []
        for record, q in tqdm(
            zip(records, q_emb), total=len(records), desc="path documents", disable=not self.show_progress, unit="q"
        ):
            kg = KGIndex.from_record(record)
            docs = [d for d in (self.document(record, kg, p) for p in self.ranked_paths(record, kg, q)) if d]
            self.num_without_documents += not docs
            out.append(docs)
        if self.num_without_documents:
            log.info("%d of %d questions have no path document", self.num_without_documents, len(records))
        return out
