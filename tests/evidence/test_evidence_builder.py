"""EvidenceBuilder: the paper's Snoopy example, constraint selection, grounding, mining against brute force."""

import pytest
from evidence_brute import adjacency, brute_follow, brute_shortest_relation_paths, seeded_graphs

from kglightning.data import KGQARecord
from kglightning.data.kg import KGIndex
from kglightning.evidence import Evidence, EvidenceBuilder

# DoublyCal Figure 2 / §4.1. The KG states SiblingOf(Snoopy, x) for both siblings, as z3 := SiblingOf(q, â) needs:
# with a reversed triple (Spike, sibling_of, Snoopy) the two siblings would sit behind different hop directions.
SNOOPY = [
    ("Snoopy", "sibling_of", "Spike"),
    ("Snoopy", "sibling_of", "Belle"),
    ("Spike", "gender", "Male"),
    ("Belle", "gender", "Female"),
    ("PEANUTS", "characters", "Snoopy"),
    ("PEANUTS", "characters", "Spike"),
    ("PEANUTS", "characters", "Belle"),
    ("PEANUTS", "characters", "Charlie Brown"),
    ("Charles M. Schulz", "author", "PEANUTS"),
]


def record(graph, q_entity, a_entity, qid="q"):
    return KGQARecord(qid, "question?", list(a_entity), list(q_entity), list(a_entity), list(graph))


def test_snoopy_example_exact():
    rec = record(SNOOPY, ["Snoopy"], ["Spike"])
    b = EvidenceBuilder()
    z3, z2 = Evidence("Snoopy", ("sibling_of",)), Evidence("Snoopy", ("sibling_of",), ("gender", "Male"))
    assert b.ground(rec, z3) == {"Spike", "Belle"} and b.ground(rec, z2) == {"Spike"}
    assert b.score(rec, z3).confidence == 0.5 and b.score(rec, z2).confidence == 0.75
    assert b.mine(rec) == [z3.scored(0.5, 2, 1), z2.scored(0.75, 1, 1)]
    # the sister question: Gender(â, Female) is the kept constraint
    assert b.mine(rec, answers=["Belle"])[1].constraint == ("gender", "Female")


def test_constraint_kept_only_when_it_raises_confidence():
    graph = [("q", "r", x) for x in ("a1", "a2", "b1")] + [
        ("a1", "g", "G"),
        ("a2", "g", "G"),
        ("b1", "g", "G"),  # keeps everything: same confidence, dropped
        ("a1", "h", "H"),  # keeps {a1}: 0.75 > 2.5/4, kept
        ("a1", "k", "K"),
        ("b1", "k", "K"),  # keeps {a1, b1}: 1.5/3 = 0.5 < 0.625, dropped
    ]
    mined = EvidenceBuilder().mine(record(graph, ["q"], ["a1", "a2"]))
    assert [(z.constraint, z.confidence) for z in mined] == [(None, 2.5 / 4), (("h", "H"), 0.75)]
    # every candidate is an answer: no constraint can beat the bare path (2.5/3 vs 1.5/2)
    mined = EvidenceBuilder().mine(record(graph[:2] + graph[3:], ["q"], ["a1", "a2"]))
    assert [z.constraint for z in mined] == [None]


def test_constraint_ranking_cap_and_filters():
    graph = [("q", "r", x) for x in ("a", "b", "c", "d")] + [
        ("a", "p", "P"),  # {a}: 0.75
        ("a", "s", "S"),
        ("b", "s", "S"),  # {a, b}: 0.5
        ("a", "t", "m.0cvt"),  # CVT constant: skipped by default
        ("a", "u", "b"),  # constant b is not an answer here
        ("Award", "won", "a"),  # reverse-direction constraint ~won: {a}
    ]
    rec = record(graph, ["q"], ["a"])
    mined = EvidenceBuilder(max_constraints=10).mine(rec)
    assert mined[0].confidence == pytest.approx(1.5 / 5)
    cons = [(z.constraint, z.confidence) for z in mined[1:]]
    assert cons == [(("p", "P"), 0.75), (("u", "b"), 0.75), (("~won", "Award"), 0.75), (("s", "S"), 0.5)]
    assert [z.constraint for z in EvidenceBuilder(max_constraints=1).mine(rec)[1:]] == [("p", "P")]
    assert len(EvidenceBuilder(max_constraints=0).mine(rec)) == 1
    with_cvt = EvidenceBuilder(max_constraints=10, skip_cvt_constraints=False).mine(rec)
    assert ("t", "m.0cvt") in {z.constraint for z in with_cvt}
    two = record(graph, ["q"], ["a", "b"])
    assert ("u", "b") not in {z.constraint for z in EvidenceBuilder(max_constraints=10).mine(two)}
    allowed = EvidenceBuilder(max_constraints=10, answer_constraints=True).mine(two)
    assert ("u", "b") in {z.constraint for z in allowed}


def test_grounding_reverse_hops_and_parallel_relations():
    graph = [
        ("France", "capital", "Paris"),
        ("France", "largest_city", "Paris"),
        ("Paris", "containedby", "France"),
        ("Lyon", "containedby", "France"),
        ("France", "gov", "m.1"),
        ("m.1", "holder", "Macron"),
    ]
    rec = record(graph, ["France"], ["Paris"])
    b = EvidenceBuilder()
    assert b.ground(rec, Evidence("Paris", ("~capital",))) == {"France"}
    assert b.ground(rec, Evidence("Paris", ("~capital", "~containedby"))) == {"Paris", "Lyon"}
    assert b.ground(rec, Evidence("Macron", ("~holder", "~gov"))) == {"France"}
    assert b.ground(rec, Evidence("France", ("~containedby",), ("~capital", "France"))) == {"Paris"}
    assert b.ground(rec, Evidence("France", ("~containedby",), ("capital", "France"))) == set()
    paths = {z.relations for z in b.mine(rec) if not z.is_constrained}
    assert paths == {("capital",), ("largest_city",), ("~containedby",)}  # parallel relations are kept apart
    assert b.shortest_paths(rec) == {("France", "Paris"): [("capital",), ("largest_city",), ("~containedby",)]}
    # topic None grounds from every topic entity; ground_all shares the walk
    two = record(graph, ["Paris", "Lyon"], ["France"])
    assert b.ground(two, Evidence(None, ("containedby",))) == {"France"}
    assert b.ground_all(two, [Evidence(None, ("containedby", "~containedby")), Evidence("Lyon", ("x",))]) == [
        {"Paris", "Lyon"},
        set(),
    ]
    # a caller's index is used as given: the builder builds none of its own
    fresh = EvidenceBuilder()
    fresh.index = None  # calling it would fail
    kg = KGIndex.from_record(two)
    assert fresh.ground_all(two, [Evidence(None, ("containedby",))], kg) == [{"France"}]


def test_unknown_topic_and_empty_graph_give_no_evidence():
    b = EvidenceBuilder()
    for rec in (record([], ["a"], ["b"]), record(SNOOPY, ["Woodstock"], ["Spike"]), record(SNOOPY, ["Snoopy"], [])):
        assert b.mine(rec) == []
    assert b.ground(record(SNOOPY, ["Woodstock"], ["Spike"]), Evidence(None, ("sibling_of",))) == set()
    assert b.ground(record(SNOOPY, [], ["Spike"]), Evidence(None, ("sibling_of",))) == set()
    empty = record([], ["a"], ["b"])
    assert b.ground(empty, Evidence("a", ("r",), ("s", "c"))) == set()
    assert b.score(empty, Evidence("a", ("r",))).scored(0.5, 0, 0) == b.score(empty, Evidence("a", ("r",)))
    assert b.shortest_paths(empty) == {}
    # topic that is also an answer: the empty path is not evidence
    assert b.mine(record([("a", "r", "b")], ["a"], ["a"])) == []


def test_mining_matches_brute_force():
    b = EvidenceBuilder(max_hops=3, max_constraints=100)
    checked = 0
    for seed, triples in seeded_graphs():
        adj = adjacency(triples)
        topics, answers = ["n0", "n1"], ["n2", "n4", "n5"]
        mined = b.mine(record(triples, topics, answers))
        want = set()
        for q in topics:
            paths = set().union(*(brute_shortest_relation_paths(adj, q, a, 3) for a in answers if a != q))
            for p in paths:
                ground = brute_follow(adj, [q], p)
                hits = len(ground & set(answers))
                base = (0.5 + hits) / (1 + len(ground))
                want.add((q, p, None, round(base, 12), len(ground), hits))
                for cand in {hop for a in ground & set(answers) for hop in adj[a]}:
                    kept = {x for x in ground if cand in adj[x]}
                    h = len(kept & set(answers))
                    conf = (0.5 + h) / (1 + len(kept))
                    if conf > base + 1e-12 and cand[1] not in answers and not cand[1].startswith("m."):
                        want.add((q, p, cand, round(conf, 12), len(kept), h))
        got = [(z.topic, z.relations, z.constraint, round(z.confidence, 12), z.grounded, z.hits) for z in mined]
        assert len(got) == len(set(got)) and set(got) == want, seed
        checked += len(got)
    assert checked > 100


def test_mined_order_is_deterministic_and_grouped():
    rec = record(seeded_graphs(5)[4][1], ["n0", "n1"], ["n2", "n4", "n5"])
    mined = EvidenceBuilder(max_constraints=100).mine(rec)
    assert mined == EvidenceBuilder(max_constraints=100).mine(rec) and any(z.is_constrained for z in mined)
    base = None
    for z in mined:
        if not z.is_constrained:
            base, last = z, 1.0
        else:  # constrained variants follow their path, best first, each better than the bare path
            assert z.path == base.path and base.confidence < z.confidence <= last
            last = z.confidence


def test_init_validation():
    for kwargs in ({"max_hops": 0}, {"alpha": 0}, {"beta": -1.0}, {"max_constraints": -1}, {"max_paths": 0}):
        with pytest.raises(ValueError):
            EvidenceBuilder(**kwargs)


def test_max_paths_caps_each_pair_like_kgindex():
    graph = [("q", r, "a") for r in ("r1", "r2", "r3")] + [("q", "s", "b")]
    rec = record(graph, ["q"], ["a", "b"])
    capped = EvidenceBuilder(max_paths=2).shortest_paths(rec)
    assert capped == {("q", "a"): [("r1",), ("r2",)], ("q", "b"): [("s",)]}
    assert [z.relations for z in EvidenceBuilder(max_paths=1).mine(rec)] == [("r1",), ("s",)]
