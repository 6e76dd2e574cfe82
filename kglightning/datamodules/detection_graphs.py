"""Augmented KG-Guard graphs (KG-Guard §3.2) built from records that carry proposed answers.

One :class:`torch_geometric.data.Data` per question holds only integer ids into a shared text-embedding table
(node labels, relation texts, the question), so graphs stay small and embeddings are computed once and cached.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from kglightning.data.kg import KGIndex
from kglightning.data.kg_paths import shortest_relation_paths_many
from kglightning.data.records import KGQARecord
from kglightning.data.text import RelationView, path_text, relation_text
from kglightning.data.triple_array import Vocab, as_triple_array, graph_nodes, node_layout
from kglightning.datamodules.graph_forms import GraphParts
from kglightning.datamodules.text_rows import TextRows
from kglightning.evidence.answer_signals import AnswerSignals
from kglightning.metrics.functional.qa import answer_key, is_abstention
from kglightning.metrics.functional.qa import node_matcher as match_node

GROUNDING_KINDS = ("exact", "near_miss", "ungrounded")
"""How an answer was matched to its graph: by name (exact or RoG-normalised), by the near-miss grounder, or not."""


@dataclass
class DetectionStats:
    """Counts of what graph construction kept and dropped for one split.

    ``instances`` and ``hallucinated`` count every labelled answer kept; ``by_grounding`` splits them by
    :data:`GROUNDING_KINDS` as ``{kind: [answers, hallucinated]}``. ``unlabelled`` counts the answers kept for
    questions with no gold answer (``labelled=False``: they have no label, and neither the loss nor a metric reads
    them). ``unmatched`` counts the distinct answers that
    name no node: kept as ungrounded answers, or dropped (``ungrounded="drop"``, counted in ``dropped``);
    ``duplicates`` the answers that repeat one already kept (the same node, or the same normalised text).
    """

    questions: int = 0
    graphs: int = 0
    instances: int = 0
    hallucinated: int = 0
    abstained: int = 0
    unmatched: int = 0
    dropped: int = 0
    duplicates: int = 0
    no_instance: int = 0
    unlabelled: int = 0
    unmatched_examples: list[str] = field(default_factory=list)
    by_grounding: dict[str, list[int]] = field(default_factory=lambda: {k: [0, 0] for k in GROUNDING_KINDS})

    def count(self, kind: str, hallucinated: bool) -> None:
        self.instances += 1
        self.hallucinated += hallucinated
        self.by_grounding[kind][0] += 1
        self.by_grounding[kind][1] += hallucinated

    def merge(self, other: DetectionStats) -> None:
        """Add the counts of ``other`` (the next chunk of the same split) to these; the examples stay the first five.

        Example:
            >>> a, b = DetectionStats(questions=2, unmatched_examples=["q1: 'x'"]), DetectionStats(questions=3)
            >>> b.count("exact", True)
            >>> a.merge(b)
            >>> a.questions, a.instances, a.by_grounding["exact"]
            (5, 1, [1, 1])
        """
        for f in fields(self):
            if f.type in ("int", int):
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        self.unmatched_examples = (self.unmatched_examples + other.unmatched_examples)[:5]
        for kind, (n, h) in other.by_grounding.items():
            mine = self.by_grounding.setdefault(kind, [0, 0])
            mine[0] += n
            mine[1] += h

    def summary(self, split: str) -> str:
        def rate(h: int, n: int) -> str:
            return f"{h / n:.1%}" if n else "n/a"

        groups = ", ".join(
            f"{n} {kind.replace('_', '-')} ({rate(h, n)} hallucinated)" for kind, (n, h) in self.by_grounding.items()
        )
        return (
            f"{split}: {self.questions} questions -> {self.graphs} graphs, {self.instances} answers "
            f"({rate(self.hallucinated, self.instances)} hallucinated): {groups}; excluded: {self.abstained} "
            f"abstentions, {self.duplicates} repeats of an answer, {self.dropped} ungrounded answers dropped, "
            f"{self.no_instance} questions with no answer left, {self.unlabelled} answers of questions with no gold "
            "answer (kept unlabelled: no loss, no metric)"
        )


def node_texts(record: KGQARecord, relation_view: RelationView = "readable") -> list[str]:
    """The distinct strings of a record that its detection graph refers to: the question, the proposed answers (an
    ungrounded answer's text is its input), node labels and relation texts (written as ``relation_view``)."""
    graph = as_triple_array(record.graph)
    nodes = graph.vocab.take(np.unique(graph.ids[:, [0, 2]])) if len(graph) else []
    rels = graph.vocab.take(np.unique(graph.ids[:, 1])) if len(graph) else []
    out = [record.question, *(record.prediction or []), *nodes]
    out += [relation_text(r, relation_view) for r in rels]
    return list(dict.fromkeys(out))


def answer_paths(
    record: KGQARecord,
    answers: Sequence[str],
    max_hops: int = 3,
    max_paths: int = 20,
    relation_view: RelationView = "readable",
) -> list[tuple[int | None, list[str]]]:
    """Per answer: the hop count of its nearest topic entity (``None``: unreachable within ``max_hops``) and the texts
    of the shortest relation paths from there (``"inverse of location country capital -> ..."``). An answer is
    searched as the node it names (:func:`node_matcher`: ``"paris"`` is the node ``Paris``).

    Example:
        >>> r = KGQARecord("q", "capital of France?", [], ["France"], [], [("France", "location.country.capital",
        ...     "Paris"), ("Paris", "location.location.containedby", "Europe")])
        >>> answer_paths(r, ["Paris", "Europe", "Mars"], max_hops=2)[:2]
        [(1, ['location country capital']), (2, ['location country capital -> location location containedby'])]
    """
    kg = KGIndex.from_record(record)
    topics = [q for q in dict.fromkeys(record.q_entity) if q in kg]
    match = node_matcher(record)
    nodes = [match(a) for a in answers]
    targets = list(dict.fromkeys(n for n in nodes if n is not None))
    found = {t: shortest_relation_paths_many(kg, t, targets, max_hops, max_paths) for t in topics}
    out: list[tuple[int | None, list[str]]] = []
    for node in nodes:
        per_topic = [found[t].get(node) or [] for t in topics] if node is not None else []
        hops = min((len(p[0]) for p in per_topic if p), default=None)
        texts = [
            path_text(p, relation_view)
            for paths in per_topic
            for p in paths
            if hops is not None and len(p) == hops and p
        ]
        out.append((hops, list(dict.fromkeys(texts))))
    return out


def node_matcher(record: KGQARecord) -> Callable[[str], str | None]:
    """How a proposed answer names a node of ``record``'s graph (:func:`~kglightning.metrics.functional.qa.node_matcher`
    over the graph's nodes).

    Example:
        >>> match = node_matcher(KGQARecord("q", "?", [], ["France"], [], [("France", "capital", "Paris")]))
        >>> match("paris"), match("Paris"), match("Lyon"), match("the")
        ('Paris', 'Paris', None, None)
    """
    return match_node(graph_nodes(record.graph))


class _GraphNodes:
    """A graph's nodes by name: ``name in nodes`` and ``nodes[name]`` (its position) look the name up in the
    vocabulary and the position among the node ids, so no per-graph dict of every name is built; :meth:`match` is
    :func:`~kglightning.metrics.functional.qa.node_matcher` over the names, whose normal forms are computed only when
    an answer is not a node's exact name."""

    def __init__(self, vocab: Vocab, node_ids: np.ndarray, rows: TextRows) -> None:
        self.vocab, self.node_ids, self.rows = vocab, node_ids, rows
        self._full: Callable[[str], str | None] | None = None
        self._names: dict[str, int] | None = None

    def position(self, name: str) -> int | None:
        if not self.vocab.has_table:  # a vocabulary kept in Arrow: look among this graph's names, not every name
            if self._names is None:
                self._names = {}
                for k, n in enumerate(self.vocab.take(self.node_ids)):
                    self._names.setdefault(n, k)
            return self._names.get(name)
        v = self.vocab.get(name)
        if v is None:
            return None
        hit = np.flatnonzero(self.node_ids == v)
        return int(hit[0]) if hit.size else None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.position(name) is not None

    def __getitem__(self, name: str) -> int:
        k = self.position(name)
        if k is None:
            raise KeyError(name)
        return k

    def __len__(self) -> int:
        return len(self.node_ids)

    def match(self, answer: str) -> str | None:
        if answer in self:
            return answer
        if self._full is None:
            names = self.vocab.take(self.node_ids)
            self._full = match_node(names, self.rows.normal_forms(self.vocab, self.node_ids))
        return self._full(answer)


def graph_parts(
    record: KGQARecord,
    text_id: Mapping[str, int] | TextRows,
    stats: DetectionStats,
    add_reverse_edges: bool = True,
    ungrounded: Literal["keep", "drop"] = "drop",
    near_miss: Callable[[str], str | None] | None = None,
    relation_view: RelationView = "readable",
) -> GraphParts | None:
    """The graph :func:`build_detection_graph` describes, before it is a ``Data``: numpy arrays and lists
    (:class:`~kglightning.datamodules.graph_forms.GraphParts`), or ``None`` when the record has no answer to classify.
    Its ``labels``, ``grounding`` and ``answer_nodes`` become the graph's ``y``, ``answer_grounding`` and
    ``answer_index``; its edges are the forward ones and the question node's, the reverse edges being made from them
    (:meth:`~kglightning.datamodules.graph_forms.GraphParts.edges`)."""
    rows = text_id if isinstance(text_id, TextRows) else TextRows(text_id, memo=False)  # one graph: no memo
    stats.questions += 1
    graph = as_triple_array(record.graph)
    triples, node_ids, src_arr, dst_arr = node_layout(graph)  # first appearance, an exact repeat is one edge
    node_of = _GraphNodes(graph.vocab, node_ids, rows)
    virtual = len(node_of)
    match = node_of.match

    gold = {key for a in [*record.answer, *record.a_entity] if (key := answer_key(a))}
    preds = record.prediction or []
    # pass 1: names (exact, then by answer_key); pass 2: the near-miss grounder for what is left, so a misspelling
    # never takes the node of a later exact answer; an answer that names a node is never an abstention
    named = {k: n for k, pred in enumerate(preds) if answer_key(pred) and (n := match(pred)) is not None}
    abstained = {k for k, pred in enumerate(preds) if k not in named and is_abstention(pred)}
    stats.abstained += len(abstained)
    grounded: list[tuple[int, str, int, int, str]] = []  # (node, answer, kind, rank, node name)
    loose: list[tuple[str, int]] = []  # (answer, rank)
    # the entries of ``prediction`` behind each kept answer (its votes), by node or by normalised text
    entries: dict[tuple[str, int | str], list[int]] = {}
    seen_nodes: set[int] = set()
    seen_loose: set[str] = set()
    near_of_text: dict[str, str | None] = {}  # normalised text of an answer sent to near_miss -> what it returned
    named_nodes = set(named.values())
    for k, pred in enumerate(preds):
        if k in abstained:
            continue
        node_name, kind = named.get(k), 0
        if node_name is None and near_miss is not None and node_of:
            key = answer_key(pred)
            near = near_of_text[key] if key in near_of_text else near_miss(pred)  # a repeat is not looked up again
            near_of_text[key] = near
            if near is not None and near in node_of:
                if node_of[near] in seen_nodes or near in named_nodes:
                    # a vote for a node another answer names (before or after it), not a second answer: it never
                    # takes the node of an exact answer, and it is labelled as that node
                    entries.setdefault(("node", node_of[near]), []).append(k)
                    stats.duplicates += 1
                    continue
                node_name, kind = near, 1
        if node_name is not None:
            entries.setdefault(("node", node_of[node_name]), []).append(k)
            if node_of[node_name] in seen_nodes:
                stats.duplicates += 1
                continue
            seen_nodes.add(node_of[node_name])
            grounded.append((node_of[node_name], pred, kind, k, node_name))
            continue
        entries.setdefault(("text", answer_key(pred)), []).append(k)
        if answer_key(pred) in seen_loose:
            stats.duplicates += 1
            continue
        seen_loose.add(answer_key(pred))  # before the drop: a dropped answer's repeats are repeats, counted as such
        stats.unmatched += 1
        if len(stats.unmatched_examples) < 5:
            stats.unmatched_examples.append(f"{record.id}: {pred!r}")
        if ungrounded == "drop":
            stats.dropped += 1
            continue
        loose.append((pred, k))
    if not grounded and not loose:
        stats.no_instance += 1
        return None
    names = [name for _, name, *_ in grounded] + [name for name, _ in loose]
    kinds = [kind for _, _, kind, _, _ in grounded] + [2] * len(loose)
    ranks = [rank for _, _, _, rank, _ in grounded] + [rank for _, rank in loose]
    # an answer grounded to a node is that node: right when its own text or its node's name is a gold answer
    labels = [float(answer_key(name) not in gold and answer_key(node) not in gold) for _, name, _, _, node in grounded]
    labels += [float(answer_key(name) not in gold) for name, _ in loose]
    if gold:
        for kind, label in zip(kinds, labels):
            stats.count(GROUNDING_KINDS[kind], bool(label))
    else:  # no gold answer: nothing to label against (y is kept but masked by ``labelled``)
        stats.unlabelled += len(labels)
    confidences = [
        record.confidence[k] if record.confidence and k < len(record.confidence) else float("nan") for k in ranks
    ]
    answer_nodes = [node for node, *_ in grounded]

    rel_ids, rel_of = np.unique(triples[:, 1], return_inverse=True)
    rel = rows.relations(graph.vocab, rel_ids, relation_view)[rel_of.reshape(-1)]
    topics = [node_of[q] for q in dict.fromkeys(record.q_entity) if q in node_of]

    signals = AnswerSignals(record)
    degree = np.bincount(np.concatenate([src_arr, dst_arr]), minlength=virtual)
    answer_signals = [signals.values(entries["node", node], int(degree[node])) for node, *_ in grounded]
    answer_signals += [signals.values(entries["text", answer_key(name)], None) for name, _ in loose]
    answer_entries = [sorted(entries["node", node]) for node, *_ in grounded]
    answer_entries += [sorted(entries["text", answer_key(name)]) for name, _ in loose]

    stats.graphs += 1
    return GraphParts(
        qid=record.id,
        node_text=np.concatenate([rows.nodes(graph.vocab, node_ids), [rows[record.question]]]).astype(np.int64),
        src=np.asarray(src_arr, dtype=np.int64),
        dst=np.asarray(dst_arr, dtype=np.int64),
        rel=np.asarray(rel, dtype=np.int64),
        reverse=add_reverse_edges,
        topics=topics,
        answer_nodes=answer_nodes,
        ungrounded_text=[rows[name] for name, _ in loose],
        grounding=kinds,
        answer_rank=[r / max(len(preds), 1) for r in ranks],
        labels=labels,
        labelled=bool(gold),  # False: the record has no gold answer, so y says nothing
        confidences=confidences,
        answer_signals=answer_signals,
        answer_names=names,
        answer_entries=answer_entries,  # per answer, the entries of record.prediction behind it
    )


def build_detection_graph(
    record: KGQARecord,
    text_id: Mapping[str, int] | TextRows,
    stats: DetectionStats,
    add_reverse_edges: bool = True,
    ungrounded: Literal["keep", "drop"] = "drop",
    near_miss: Callable[[str], str | None] | None = None,
    relation_view: RelationView = "readable",
) -> Data | None:
    """The augmented graph of one record, or ``None`` when it has no answer to classify (:func:`graph_parts` as a
    ``Data``).

    Nodes are the subgraph's entities in order of first appearance, then the virtual question node. Each triple
    ``(h, r, t)`` gives an edge ``h → t`` (and, with ``add_reverse_edges``, an explicit reverse edge ``t → h`` of
    kind ``EDGE_REVERSE``); the virtual node has an edge to each topic entity found in the graph. Each proposed
    answer is matched to a node by exact name, else by RoG-normalised name, else (once every answer has been matched
    by name) by ``near_miss`` (answer -> node name or ``None``; an answer whose near miss is a node another answer
    names, before or after it, is a repeat of that answer, a vote for it, not a second answer); its label
    is 1 (hallucinated) when neither its text nor its node's name matches a gold answer (``answer`` ∪ ``a_entity``)
    after normalisation. An answer that matches no node is kept as an *ungrounded* answer
    (``ungrounded="keep"``: its text is its only input, ``ungrounded_text``) or dropped and counted.

    Answers come grounded first, then ungrounded, each in the order of ``prediction``: ``y``, ``answer_names``,
    ``answer_grounding`` (index into :data:`GROUNDING_KINDS`) and ``answer_rank`` (position in ``prediction`` over
    its length) follow that order; ``answer_index`` holds the grounded answers' nodes.

    ``text_id`` maps each text to its row of the embedding table; a :class:`~kglightning.datamodules.text_rows.TextRows`
    shared by the graphs of a split looks each vocabulary string up once for all of them.
    """
    parts = graph_parts(record, text_id, stats, add_reverse_edges, ungrounded, near_miss, relation_view)
    return None if parts is None else parts.to_data()


def answer_owner(batch: Any) -> Tensor:
    """``(A,)`` the graph of each answer of a batch, in answer order (grounded then ungrounded, graph by graph)."""
    counts = getattr(batch, "num_answer_items", None)
    if counts is None:  # graphs built before ungrounded answers existed: every answer is a node
        return batch.batch[batch.answer_index]
    return torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
