"""Augmented KG-Guard graphs (KG-Guard §3.2) built from records that carry proposed answers.

One :class:`torch_geometric.data.Data` per question holds only integer ids into a shared text-embedding table
(node labels, relation texts, the question), so graphs stay small and embeddings are computed once and cached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch_geometric.data import Data

from kglightning.data.kg import KGIndex
from kglightning.data.kg_paths import shortest_relation_paths_many
from kglightning.data.records import KGQARecord
from kglightning.data.text import path_text, relation_text
from kglightning.metrics.functional.qa import normalize
from kglightning.nn.kgguard import EDGE_FORWARD, EDGE_REVERSE, EDGE_VIRTUAL

#: predictions that mean "no answer"; they are excluded from the detection task and counted.
ABSTENTIONS = frozenset({"", "unknown", "none", "n/a", "na", "no answer", "i don't know", "i do not know", "not sure"})


@dataclass
class DetectionStats:
    """Counts of what graph construction kept and dropped for one split."""

    questions: int = 0
    graphs: int = 0
    instances: int = 0
    hallucinated: int = 0
    abstained: int = 0
    unmatched: int = 0
    no_instance: int = 0
    unmatched_examples: list[str] = field(default_factory=list)

    def summary(self, split: str) -> str:
        rate = self.hallucinated / self.instances if self.instances else float("nan")
        return (
            f"{split}: {self.questions} questions -> {self.graphs} graphs, {self.instances} answer nodes "
            f"({rate:.1%} hallucinated); excluded: {self.abstained} abstentions, {self.unmatched} predictions "
            f"not in the subgraph, {self.no_instance} questions with no answer node left"
        )


def node_texts(record: KGQARecord) -> list[str]:
    """Strings of a record that the graph refers to: node labels, relation texts and the question."""
    out = [record.question]
    for h, r, t in record.graph:
        out += [h, relation_text(r), t]
    return out


def answer_paths(
    record: KGQARecord, answers: Sequence[str], max_hops: int = 3, max_paths: int = 20
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
        texts = [path_text(p) for paths in per_topic for p in paths if hops is not None and len(p) == hops and p]
        out.append((hops, list(dict.fromkeys(texts))))
    return out


def node_matcher(record: KGQARecord) -> Callable[[str], str | None]:
    """How a proposed answer names a node of ``record``'s graph: the node with that exact name, else the one node
    whose RoG-normalised name is the answer's (``"paris"`` -> ``"Paris"``); ``None`` for no node, or for several.

    Example:
        >>> match = node_matcher(KGQARecord("q", "?", [], ["France"], [], [("France", "capital", "Paris")]))
        >>> match("paris"), match("Paris"), match("Lyon"), match("the")
        ('Paris', 'Paris', None, None)
    """
    nodes = {n: None for h, _, t in record.graph for n in (h, t)}
    by_norm: dict[str, str | None] = {}
    for name in nodes:
        key = normalize(name)
        if key:  # a name of punctuation or articles only normalises to "": it matches nothing by its normal form
            by_norm[key] = name if key not in by_norm else None  # ambiguous normalised names match nothing

    def match(answer: str) -> str | None:
        return answer if answer in nodes else by_norm.get(normalize(answer))

    return match


def build_detection_graph(
    record: KGQARecord, text_id: dict[str, int], stats: DetectionStats, add_reverse_edges: bool = True
) -> Data | None:
    """The augmented graph of one record, or ``None`` when it has no answer node to classify.

    Nodes are the subgraph's entities in order of first appearance, then the virtual question node. Each triple
    ``(h, r, t)`` gives an edge ``h → t`` (and, with ``add_reverse_edges``, an explicit reverse edge ``t → h`` of
    kind ``EDGE_REVERSE``); the virtual node has an edge to each topic entity found in the graph. Each proposed
    answer is matched to a node by exact name, else by RoG-normalised name; its label is 1 (hallucinated) when its
    name matches no gold answer (``answer`` ∪ ``a_entity``) after normalisation.
    """
    stats.questions += 1
    node_of: dict[str, int] = {}
    for h, _, t in record.graph:
        node_of.setdefault(h, len(node_of))
        node_of.setdefault(t, len(node_of))
    virtual = len(node_of)
    match = node_matcher(record)

    gold = {normalize(a) for a in [*record.answer, *record.a_entity]}
    answer_nodes: list[int] = []
    answer_names: list[str] = []
    labels: list[float] = []
    confidences: list[float] = []
    for k, pred in enumerate(record.prediction or []):
        if normalize(pred) in ABSTENTIONS or pred.strip().lower() in ABSTENTIONS:
            stats.abstained += 1
            continue
        matched = match(pred)
        node = None if matched is None else node_of[matched]
        if node is None:
            stats.unmatched += 1
            if len(stats.unmatched_examples) < 5:
                stats.unmatched_examples.append(f"{record.id}: {pred!r}")
            continue
        if node in answer_nodes:
            continue
        answer_nodes.append(node)
        answer_names.append(pred)
        labels.append(float(normalize(pred) not in gold))
        confidences.append(record.confidence[k] if record.confidence else float("nan"))
    if not answer_nodes:
        stats.no_instance += 1
        return None

    triples = list(dict.fromkeys(record.graph))  # an exact duplicate triple is one edge
    src = [node_of[h] for h, _, _ in triples]
    dst = [node_of[t] for _, _, t in triples]
    rel = [text_id[relation_text(r)] for _, r, _ in triples]
    kind = [EDGE_FORWARD] * len(triples)
    if add_reverse_edges:
        src, dst, rel, kind = src + dst, dst + src, rel + rel, kind + [EDGE_REVERSE] * len(triples)
    topics = [node_of[q] for q in dict.fromkeys(record.q_entity) if q in node_of]
    src += [virtual] * len(topics)
    dst += topics
    rel += [0] * len(topics)
    kind += [EDGE_VIRTUAL] * len(topics)

    n = virtual + 1
    topic_mask = torch.zeros(n, dtype=torch.bool)
    topic_mask[topics] = True
    answer_mask = torch.zeros(n, dtype=torch.bool)
    answer_mask[answer_nodes] = True
    names = list(node_of) + [record.question]
    stats.graphs += 1
    stats.instances += len(answer_nodes)
    stats.hallucinated += int(sum(labels))
    return Data(
        num_nodes=n,
        node_text=torch.tensor([text_id[s] for s in names], dtype=torch.long),
        topic_mask=topic_mask,
        answer_mask=answer_mask,
        edge_index=torch.tensor([src, dst], dtype=torch.long).view(2, -1),
        edge_text=torch.tensor(rel, dtype=torch.long),
        edge_kind=torch.tensor(kind, dtype=torch.long),
        answer_index=torch.tensor(answer_nodes, dtype=torch.long),
        y=torch.tensor(labels),
        proposer_confidence=torch.tensor(confidences),
        question_index=torch.tensor([virtual]),
        qid=record.id,
        answer_names=answer_names,
    )
