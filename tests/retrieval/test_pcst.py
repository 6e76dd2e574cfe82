"""PCST retrieval: the tree on a hand-made graph equals the brute-force optimum; neighbourhoods; bad input."""

from __future__ import annotations

import itertools

import pytest
import torch

from kglightning.data.embeddings import SentenceEncoder
from kglightning.data.kg import KGIndex
from kglightning.data.records import KGQARecord
from kglightning.data.text import relation_text
from kglightning.retrieval.pcst import PCSTRetriever


class TableEncoder(SentenceEncoder):
    """Fixed embeddings per text (unknown texts: a vector orthogonal to the question's), so prizes are known."""

    def __init__(self, table: dict[str, list[float]], dim: int = 4) -> None:
        super().__init__(model="table", show_progress=False)
        self.table, self._dim = table, dim

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def cache_key(self) -> str:
        return f"table-{abs(hash(tuple(sorted((k, tuple(v)) for k, v in self.table.items()))))}"

    def encode(self, texts):
        other = [0.0, 0.0, 0.0, 1.0]
        return torch.tensor([self.table.get(t, other) for t in texts], dtype=torch.float32).reshape(-1, self._dim)


# T is the topic; G, H, K are the 3 nodes most similar to the question (prizes 3, 2, 1 with topk=3).
TRIPLES = [("T", "r", "x"), ("x", "r", "G"), ("x", "r", "H"), ("T", "r", "w"), ("w", "r", "y"), ("y", "r", "z"),
           ("z", "r", "K")]  # fmt: skip
QUESTION = "question?"
TABLE = {QUESTION: [1, 0, 0, 0], "G": [1, 0, 0, 0], "H": [0.9, 0.1, 0, 0], "K": [0.8, 0.3, 0, 0], "r": [0, 1, 0, 0]}


def brute_force(triples, prizes: dict[str, float], cost: float) -> set[tuple[str, str, str]]:
    """The edge set of a tree minimising edge costs plus the prizes of the nodes left out (PCST's objective)."""
    nodes = {n for h, _, t in triples for n in (h, t)}
    best, best_cost = set(), sum(prizes.values()) - max(prizes.values())  # the best single node
    for k in range(1, len(triples) + 1):
        for edges in itertools.combinations(triples, k):
            covered = {n for h, _, t in edges for n in (h, t)}
            if len(covered) != k + 1:  # a tree on k edges has k + 1 nodes (and no cycle)
                continue
            reach, frontier = set(), [edges[0][0]]
            while frontier:
                n = frontier.pop()
                reach.add(n)
                frontier += [b for h, _, t in edges for a, b in ((h, t), (t, h)) if a == n and b not in reach]
            if reach != covered:
                continue
            value = k * cost + sum(p for n, p in prizes.items() if n not in covered)
            if value < best_cost - 1e-9:
                best, best_cost = set(edges), value
    assert nodes
    return best


@pytest.fixture
def retriever(tmp_path):
    return PCSTRetriever(TableEncoder(TABLE), cache_dir=str(tmp_path), hops=4, topk=3, topk_e=0, cost_e=0.5,
                         show_progress=False)  # fmt: skip


def test_pcst_finds_the_brute_force_optimum(retriever):
    kg = KGIndex.from_triples(TRIPLES)
    triples, nodes = retriever.retrieve(QUESTION, ["T"], kg)
    expected = brute_force(TRIPLES, {"G": 3, "H": 2, "K": 1}, cost=0.5)
    assert set(triples) == expected == {("x", "r", "G"), ("x", "r", "H")}  # K is 4 edges away: not worth 2.0
    assert set(nodes) == {"x", "G", "H"}


def test_cheaper_edges_reach_the_far_prize(tmp_path):
    r = PCSTRetriever(TableEncoder(TABLE), cache_dir=str(tmp_path), hops=4, topk=3, topk_e=0, cost_e=0.15,
                      show_progress=False)  # fmt: skip
    triples, _ = r.retrieve(QUESTION, ["T"], KGIndex.from_triples(TRIPLES))
    assert set(triples) == brute_force(TRIPLES, {"G": 3, "H": 2, "K": 1}, cost=0.15)
    assert ("z", "r", "K") in triples and len(triples) == 7


def test_edge_prizes_pull_in_the_best_relation(tmp_path):
    table = dict(TABLE, **{relation_text("good"): [1, 0, 0, 0]})
    kg = KGIndex.from_triples(TRIPLES + [("T", "good", "v")])
    r = PCSTRetriever(TableEncoder(table), cache_dir=str(tmp_path), hops=4, topk=0, topk_e=1, show_progress=False)
    triples, nodes = r.retrieve(QUESTION, ["T"], kg)
    assert triples == [("T", "good", "v")] and set(nodes) == {"T", "v"}


def test_neighborhood_hops_hubs_and_bound():
    kg = KGIndex.from_triples(TRIPLES + [("hub", "r", f"n{i}") for i in range(5)] + [("T", "r", "hub")])
    assert set(kg.neighborhood("T", 1).entities) == {"T", "x", "w", "hub"}
    assert "n0" in kg.neighborhood("T", 2).entities
    assert "n0" not in kg.neighborhood("T", 2, max_degree=3).entities  # the hub (6 edges) is not expanded
    assert "hub" in kg.neighborhood("T", 2, max_degree=3).entities
    assert kg.neighborhood("T", 3, max_nodes=5).num_entities == 5
    assert kg.neighborhood("nowhere", 2).num_entities == 0


def record(qid: str, topics: list[str], answers: list[str]) -> KGQARecord:
    return KGQARecord(qid, QUESTION, answers, topics, [], [])


def test_records_stats_and_bad_input(retriever, caplog):
    kg = KGIndex.from_triples(TRIPLES, entities=["lonely"])
    records = [record("q1", ["T"], ["G"]), record("q2", ["T", "unknown"], ["K"]), record("q3", ["nope"], ["G"]),
               record("q4", ["lonely"], []), record("q5", ["T"], ["not in kg"])]  # fmt: skip
    out = list(retriever.retrieve_records(records, kg))
    assert [r.id for r in out] == ["q1", "q2", "q4", "q5"]  # q3: no topic entity in the KG, skipped
    assert out[0].a_entity == ["G"] and out[1].q_entity == ["T"] and out[3].a_entity == []
    assert out[2].graph == [] and out[0].extra["retrieval"]["method"] == "pcst"
    assert out[0].extra["answer_in_graph"] is True and out[1].extra["answer_in_graph"] is False
    assert "answer_in_graph" not in out[2].extra  # no gold answer given
    s = retriever.stats.summary()
    assert (s["questions"], s["missing_topic"], s["partial_topic"], s["empty_neighborhood"]) == (4, 1, 1, 1)
    assert s["with_answers"] == 3 and s["answer_in_graph_pct"] == pytest.approx(100 / 3)  # G yes; K, unknown no
    assert s["max_triples"] == 2 and "no topic entity" in caplog.text
    strict = PCSTRetriever(TableEncoder(TABLE), cache_dir=retriever.cache_dir, on_missing_topic="error")
    with pytest.raises(ValueError, match="q3.*not in the KG|q3.*is in the KG"):
        strict.retrieve_record(records[2], kg)


def test_bad_settings():
    with pytest.raises(ValueError, match="hops"):
        PCSTRetriever(TableEncoder(TABLE), hops=0)
    with pytest.raises(ValueError, match="on_missing_topic"):
        PCSTRetriever(TableEncoder(TABLE), on_missing_topic="ignore")
