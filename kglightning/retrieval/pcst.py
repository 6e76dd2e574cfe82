"""G-Retriever's subgraph retrieval: a k-hop neighbourhood of the topic entities, cut by a prize-collecting Steiner tree.

Per question (He et al., 2024, as KG-Guard §4.1 uses it):

1. the neighbourhood: every entity within ``hops`` steps of a topic entity over both edge directions, and the
   triples among them (:meth:`~kglightning.data.kg.KGIndex.neighborhood`; hubs with more than ``max_degree`` edges
   are kept but not expanded, as KG-Guard filters nodes with more than 1,000 neighbours on Wikidata);
2. prizes: the cosine similarity of the question's MiniLM embedding with each node label and each edge's relation
   text; the ``topk`` best nodes get prizes ``topk, ..., 1`` and the ``topk_e`` best distinct edge scores get
   prizes shared among their edges, as in G-Retriever;
3. the tree: ``pcst_fast`` (Goemans-Williamson, ``gw`` pruning, one cluster) with edge cost ``cost_e``.

Steps 2-3 select what PyG's :func:`torch_geometric.llm.utils.backend_utils.retrieval_via_pcst` selects, with
G-Retriever's WebQSP settings as defaults (``topk=3, topk_e=5, cost_e=0.5``), through
:func:`~kglightning.retrieval.pcst_prizes.pcst_cut`, which sets the prizes and costs up in array operations (PyG's
loop over edges in Python dominated a question's time on graphs of thousands of triples). Where this differs from G-Retriever:
G-Retriever runs PCST on RoG's pre-cut subgraphs; here step 1 cuts the neighbourhood from the whole KG. Relations are
embedded as their readable text (``location country capital``, :func:`~kglightning.data.text.relation_text`) rather
than the raw id, so the embeddings are shared with the detector's cache. A selected node without a selected edge
cannot be written as a triple, so RoG records keep only the tree's triples (its isolated nodes count in the stats).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch

from kglightning.data.embeddings import SentenceEncoder, UsesEmbeddings
from kglightning.data.kg import KGIndex
from kglightning.data.kg_paths import khop_ids
from kglightning.data.records import KGQARecord
from kglightning.data.text import relation_text
from kglightning.retrieval.pcst_prizes import pcst_cut

__all__ = ["PCSTRetriever", "SubgraphStats"]

log = logging.getLogger(__name__)


@dataclass
class SubgraphStats:
    """Per-question subgraph sizes and answer recall, summarised as in KG-Guard's Table 13 and Table 15."""

    nodes: list[int] = field(default_factory=list)
    triples: list[int] = field(default_factory=list)
    neighborhood_triples: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    answer_in_graph: list[bool] = field(default_factory=list)  # questions with gold answers only
    missing_topic: int = 0  # skipped: no topic entity in the KG
    partial_topic: int = 0  # some topic entities missing (the others were used)
    empty_neighborhood: int = 0  # a topic entity without any edge within reach
    truncated: int = 0  # the neighbourhood hit max_nodes

    def add(self, nodes: int, triples: int, neighborhood: int, seconds: float, answer_in_graph: bool | None) -> None:
        self.nodes.append(nodes)
        self.triples.append(triples)
        self.neighborhood_triples.append(neighborhood)
        self.seconds.append(seconds)
        if answer_in_graph is not None:
            self.answer_in_graph.append(answer_in_graph)

    def extend(self, other: SubgraphStats) -> None:
        """Append ``other``'s questions after this one's (the stats of consecutive parts of one question list)."""
        for name in ("nodes", "triples", "neighborhood_triples", "seconds", "answer_in_graph"):
            getattr(self, name).extend(getattr(other, name))
        for name in ("missing_topic", "partial_topic", "empty_neighborhood", "truncated"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def summary(self) -> dict[str, Any]:
        """Counts, average and maximum nodes and triples, answer recall (%), seconds per question."""

        def avg(x: list) -> float:
            return float(np.mean(x)) if x else float("nan")

        return {
            "questions": len(self.nodes),
            "avg_nodes": avg(self.nodes),
            "max_nodes": max(self.nodes, default=0),
            "avg_triples": avg(self.triples),
            "max_triples": max(self.triples, default=0),
            "avg_neighborhood_triples": avg(self.neighborhood_triples),
            "answer_in_graph_pct": 100 * avg(self.answer_in_graph),
            "with_answers": len(self.answer_in_graph),
            "seconds_per_question": avg(self.seconds),
            "missing_topic": self.missing_topic,
            "partial_topic": self.partial_topic,
            "empty_neighborhood": self.empty_neighborhood,
            "truncated": self.truncated,
        }


class PCSTRetriever(UsesEmbeddings):
    """Cuts a question's subgraph from a KG the G-Retriever way (see the module docstring).

    Args:
        encoder: the sentence encoder for prizes (default: the bundled all-MiniLM-L6-v2).
        cache_dir: where text embeddings are cached (default ``$KGLIGHTNING_CACHE/embeddings``).
        hops: breadth-first steps of the neighbourhood.
        topk: nodes that get a prize.
        topk_e: distinct edge scores that get a prize.
        cost_e: the cost of an edge.
        num_clusters: trees in the PCST forest.
        max_degree: hubs with more edges than this are not expanded (``None``: no limit).
        max_nodes: bound on the neighbourhood's nodes (``None``: no bound); hitting it is counted.
        on_missing_topic: ``"skip"`` a question none of whose topic entities is in the KG (counted and logged), or
            ``"error"``.
        show_progress: a progress bar over questions.

    Example:
        >>> import tempfile
        >>> kg = KGIndex.from_triples([("France", "capital", "Paris"), ("France", "language", "French"),
        ...     ("Paris", "river", "Seine"), ("Seine", "mouth", "English Channel"), ("France", "currency", "Euro")])
        >>> r = PCSTRetriever(SentenceEncoder(show_progress=False), cache_dir=tempfile.mkdtemp(), topk=2, topk_e=2,
        ...                   show_progress=False)
        >>> r.retrieve("Which river flows through the capital of France?", ["France"], kg)
        ([('France', 'capital', 'Paris'), ('Paris', 'river', 'Seine')], ['France', 'Paris', 'Seine'])
    """

    def __init__(
        self,
        encoder: SentenceEncoder | None = None,
        cache_dir: str | None = None,
        hops: int = 2,
        topk: int = 3,
        topk_e: int = 5,
        cost_e: float = 0.5,
        num_clusters: int = 1,
        max_degree: int | None = 1000,
        max_nodes: int | None = 20000,
        on_missing_topic: Literal["skip", "error"] = "skip",
        show_progress: bool = True,
    ) -> None:
        if hops < 1 or num_clusters < 1 or min(topk, topk_e) < 0 or cost_e < 0:
            raise ValueError("need hops >= 1, num_clusters >= 1, topk >= 0, topk_e >= 0 and cost_e >= 0")
        if on_missing_topic not in ("skip", "error"):
            raise ValueError(f"on_missing_topic must be 'skip' or 'error', got {on_missing_topic!r}")
        self.encoder = encoder or SentenceEncoder()
        self.cache_dir = cache_dir
        self.hops = hops
        self.topk = topk
        self.topk_e = topk_e
        self.cost_e = cost_e
        self.num_clusters = num_clusters
        self.max_degree = max_degree
        self.max_nodes = max_nodes
        self.on_missing_topic = on_missing_topic
        self.show_progress = show_progress
        self.stats = SubgraphStats()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(hops={self.hops}, topk={self.topk}, topk_e={self.topk_e}, cost_e={self.cost_e}, "
            f"max_degree={self.max_degree}, max_nodes={self.max_nodes})"
        )

    def neighborhood(self, kg: KGIndex, topics: Sequence[str]) -> tuple[KGIndex, bool]:
        """The k-hop neighbourhood of ``topics`` and whether ``max_nodes`` cut it."""
        ids, truncated = khop_ids(kg, topics, self.hops, self.max_degree, self.max_nodes)
        names = kg.entities
        return kg.subgraph(names[i] for i in ids.tolist()), truncated

    def pcst(self, question: str, sub: KGIndex, embeddings: Any = None) -> tuple[list[tuple[str, str, str]], list[str]]:
        """PCST on a neighbourhood: the selected triples and nodes (:func:`~kglightning.retrieval.pcst_prizes.pcst_cut`,
        the selection of PyG's ``retrieval_via_pcst``); the texts' rows from ``embeddings`` (anything with
        ``embed(texts)``, e.g. a :class:`~kglightning.data.embeddings.TransientEmbeddings` that stores nothing;
        default: :attr:`embeddings`, the disk cache)."""
        heads, rels, tails = sub.edge_ids()
        names = sub.entities
        if not heads.size:
            return [], list(names)
        emb = self.embeddings if embeddings is None else embeddings
        rel_emb = emb.embed([relation_text(r) for r in sub.relations]).float()  # one row per relation, not edge
        edges, nodes = pcst_cut(
            np.stack([heads, tails]),
            emb.embed(names).float(),
            rel_emb[torch.from_numpy(np.array(rels, dtype=np.int64))],  # a copy: the cached index is read-only
            emb.embed([question]).float(),
            self.topk,
            self.topk_e,
            self.cost_e,
            self.num_clusters,
        )
        r_names = sub.relations
        h, r, t = heads[edges].tolist(), rels[edges].tolist(), tails[edges].tolist()
        return [(names[a], r_names[b], names[c]) for a, b, c in zip(h, r, t)], [names[i] for i in nodes.tolist()]

    def retrieve(
        self, question: str, topics: Sequence[str], kg: KGIndex
    ) -> tuple[list[tuple[str, str, str]], list[str]]:
        """The PCST triples and nodes of one question (an empty list when no topic entity has an edge in reach)."""
        return self.pcst(question, self.neighborhood(kg, topics)[0])

    def retrieve_record(self, record: KGQARecord, kg: KGIndex, embeddings: Any = None) -> KGQARecord | None:
        """``record`` with its ``graph`` replaced by the PCST subgraph; ``None`` when it is skipped (counted).

        ``a_entity`` becomes the gold answers (``a_entity`` and ``answer``) that are KG entities; ``embeddings``: as
        :meth:`pcst`'s.
        """
        start = time.perf_counter()
        present = [e for e in record.q_entity if e in kg]
        if not present:
            if self.on_missing_topic == "error":
                raise ValueError(f"question {record.id!r}: no topic entity {record.q_entity} is in the KG")
            self.stats.missing_topic += 1
            log.warning("question %r skipped: no topic entity %s is in the KG", record.id, record.q_entity)
            return None
        self.stats.partial_topic += len(present) < len(record.q_entity)
        sub, truncated = self.neighborhood(kg, present)
        triples, nodes = self.pcst(record.question, sub, embeddings)
        neighborhood = sub.num_edges
        self.stats.truncated += truncated
        self.stats.empty_neighborhood += neighborhood == 0
        golds = [a for a in dict.fromkeys([*record.a_entity, *record.answer]) if a in kg]
        node_set = set(nodes).union(h for h, _, _ in triples).union(t for _, _, t in triples)
        recall = bool(node_set.intersection(golds)) if (record.a_entity or record.answer) else None
        self.stats.add(len(node_set), len(triples), neighborhood, time.perf_counter() - start, recall)
        extra = dict(record.extra)
        extra["retrieval"] = {"method": "pcst", "neighborhood_triples": neighborhood, "nodes": len(node_set)}
        if recall is not None:  # about this subgraph now, not the one the record came with
            extra["answer_in_graph"] = recall
        return KGQARecord(record.id, record.question, record.answer, present, golds, triples, record.prediction,
                          record.confidence, extra)  # fmt: skip

    def retrieve_records(
        self,
        records: Iterable[KGQARecord],
        kg: KGIndex | None,
        desc: str = "PCST subgraphs",
        keep_skipped: bool = False,
    ) -> Iterator[KGQARecord]:
        """:meth:`retrieve_record` over ``records`` with a progress bar.

        Args:
            records: the questions.
            kg: the KG to cut from; ``None`` cuts each record from its own graph.
            desc: the progress bar's label.
            keep_skipped: keep a question without a topic entity in the KG, with an empty graph (marked in
                ``extra["retrieval"]``), instead of leaving it out; counted either way.
        """
        from tqdm.auto import tqdm

        records = list(records)
        for record in tqdm(records, desc=desc, unit="q", disable=not self.show_progress):
            out = self.retrieve_record(record, kg if kg is not None else KGIndex.from_triples(record.graph))
            if out is None and keep_skipped:
                extra = dict(record.extra, retrieval={"method": "pcst", "skipped": "no topic entity in the KG"})
                out = replace(record, graph=[], extra=extra)
            if out is not None:
                yield out
        if self.stats.missing_topic:
            log.warning("%d of %d question(s) %s: no topic entity in the KG", self.stats.missing_topic, len(records),
                        "kept with an empty graph" if keep_skipped else "skipped")  # fmt: skip
