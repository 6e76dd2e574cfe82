"""Id-level grounding, constraint scoring and the shared multi-target path search, against brute force."""

import numpy as np
import pytest
from evidence_brute import adjacency, brute_follow, brute_shortest_relation_paths, seeded_graphs

from kglightning.data import KGIndex
from kglightning.data.kg_paths import shortest_relation_paths, shortest_relation_paths_many
from kglightning.evidence import PathGrounder, score_constraints
from kglightning.evidence.paths import constraint_filter, label_id, step


def names(kg, ids):
    return {kg.entities[i] for i in ids.tolist()}


def test_label_ids_and_step():
    kg = KGIndex.from_triples([("a", "r", "b"), ("a", "s", "b"), ("c", "r", "b")])
    assert label_id(kg, "r") == 0 and label_id(kg, "~s") == 3 and label_id(kg, "~t") is None
    a = np.array([kg.entity_id("a")])
    assert names(kg, step(kg, a, label_id(kg, "s"))) == {"b"}
    assert names(kg, step(kg, step(kg, a, 0), label_id(kg, "~r"))) == {"a", "c"}
    assert step(kg, np.empty(0, dtype=np.int64), 0).size == 0


def test_grounder_matches_follow_and_shares_prefixes():
    for _, triples in seeded_graphs():
        kg, adj = KGIndex.from_triples(triples), adjacency(triples)
        g = PathGrounder(kg, kg._ids(["n0", "n1"]))
        paths = list(kg.relation_paths(["n0", "n1"], 3, max_paths=60))
        for p in paths:
            got = names(kg, g.ground(p))
            assert got == kg.follow(["n0", "n1"], p) == brute_follow(adj, ["n0", "n1"], p)
        assert g.hops_walked <= sum(map(len, paths))
        assert g.ground(("nope",)).size == 0


def test_constraint_filter_both_directions():
    kg = KGIndex.from_triples([("x", "g", "M"), ("y", "g", "F"), ("O", "won", "y"), ("O", "won", "x")])
    ids = kg._ids(["x", "y"])
    assert names(kg, constraint_filter(kg, ids, label_id(kg, "g"), kg.entity_id("F"))) == {"y"}
    assert names(kg, constraint_filter(kg, ids, label_id(kg, "~won"), kg.entity_id("O"))) == {"x", "y"}
    assert constraint_filter(kg, ids, label_id(kg, "won"), kg.entity_id("O")).size == 0  # wrong direction
    assert constraint_filter(kg, ids, None, 0).size == 0 and constraint_filter(kg, ids, 0, None).size == 0


@pytest.mark.parametrize("alpha, beta", [(0.5, 0.5), (1.0, 3.0)])
def test_score_constraints_brute_force(alpha, beta):
    for seed, triples in seeded_graphs():
        kg, adj = KGIndex.from_triples(triples), adjacency(triples)
        ground = sorted(kg.follow("n0", ["r0"]) | kg.follow("n0", ["~r1"]))
        answers = set(ground[::2])
        s = score_constraints(kg, kg._ids(ground), np.isin(np.arange(kg.num_entities), kg._ids(answers)), alpha, beta)
        got = {
            (kg._labels[a], kg.entities[c], n, h, round(p, 12))
            for a, c, n, h, p in zip(s.label, s.entity, s.grounded, s.hits, s.confidence.tolist())
        }
        want = set()
        for cand in {hop for a in answers for hop in adj[a]}:
            kept = {x for x in ground if cand in adj[x]}
            hits = len(kept & answers)
            want.add((*cand, len(kept), hits, round((alpha + hits) / (alpha + beta + len(kept)), 12)))
        assert got == want, seed


def test_many_targets_equals_per_pair():
    for seed, triples in seeded_graphs():
        kg, adj = KGIndex.from_triples(triples), adjacency(triples)
        targets = ["n0", "n3", "n5", "m.0", "n2", "absent", "n3"]
        for max_hops, max_paths in ((4, 1000), (2, 1000), (4, 2)):
            many = shortest_relation_paths_many(kg, "n1", targets, max_hops, max_paths)
            assert list(many) == list(dict.fromkeys(targets))
            for t in many:
                assert many[t] == shortest_relation_paths(kg, "n1", t, max_hops, max_paths), (seed, t)
                if max_paths == 1000:
                    assert set(many[t]) == brute_shortest_relation_paths(adj, "n1", t, max_hops), (seed, t)


def test_many_targets_edge_cases():
    kg = KGIndex.from_triples([("a", "r", "b")])
    assert shortest_relation_paths_many(kg, "a", ["a", "b"]) == {"a": [()], "b": [("r",)]}
    assert shortest_relation_paths_many(kg, "zz", ["a"]) == {"a": []}
    assert shortest_relation_paths_many(kg, "a", []) == {}
    assert shortest_relation_paths_many(kg, "a", ["b"], max_paths=0) == {"b": []}
    assert shortest_relation_paths_many(KGIndex.from_triples([]), "a", ["b"]) == {"b": []}
