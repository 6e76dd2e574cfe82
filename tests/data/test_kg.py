"""KGIndex: a directed multigraph with explicit reverse hops, checked by hand and against networkx."""

import itertools
import random

import pytest

from kglightning.data import REVERSE_PREFIX, KGIndex, KGQARecord, is_reverse, reverse

nx = pytest.importorskip("networkx")

# France --capital--> Paris (and a parallel relation), Paris --containedby--> France,
# Lyon --containedby--> France, m.cvt is a CVT node: France --gov--> m.cvt --office_holder--> Macron
TRIPLES = [
    ("France", "location.country.capital", "Paris"),
    ("France", "location.country.largest_city", "Paris"),
    ("Paris", "location.location.containedby", "France"),
    ("Lyon", "location.location.containedby", "France"),
    ("France", "government.governmental_jurisdiction.governing_officials", "m.cvt"),
    ("m.cvt", "government.government_position_held.office_holder", "Macron"),
    ("France", "location.country.capital", "Paris"),  # exact duplicate: stored once
]


@pytest.fixture
def kg():
    return KGIndex.from_triples(TRIPLES)


def test_reverse_helpers():
    assert REVERSE_PREFIX == "~"
    assert reverse("r") == "~r" and reverse("~r") == "r" and reverse(reverse("a.b")) == "a.b"
    assert is_reverse("~r") and not is_reverse("r")


def test_basics(kg):
    assert kg.num_entities == 5 and kg.num_edges == 6 and kg.num_relations == 5
    assert kg.entities == sorted(kg.entities) and kg.relations == sorted(kg.relations)
    assert "Paris" in kg and "Berlin" not in kg
    assert kg.entity_id("France") == kg.entities.index("France") and kg.entity_id("Berlin") is None
    assert kg.triples() == sorted(set(TRIPLES))
    assert all(type(x) is str for t in kg.triples() for x in t)
    assert "edges=6" in repr(kg)


def test_parallel_relations_and_reverse_hops(kg):
    assert kg.out_edges("France") == [
        ("government.governmental_jurisdiction.governing_officials", "m.cvt"),
        ("location.country.capital", "Paris"),
        ("location.country.largest_city", "Paris"),
    ]
    assert kg.in_edges("Paris") == [("location.country.capital", "France"), ("location.country.largest_city", "France")]
    assert kg.edges("Paris") == [
        ("location.location.containedby", "France"),
        ("~location.country.capital", "France"),
        ("~location.country.largest_city", "France"),
    ]
    assert kg.edges("Paris", "out") == [("location.location.containedby", "France")]
    assert kg.edges("Paris", "in") == [
        ("~location.country.capital", "France"),
        ("~location.country.largest_city", "France"),
    ]
    assert kg.neighbors("France") == ["Lyon", "Paris", "m.cvt"]
    assert kg.neighbors("France", "out") == ["Paris", "m.cvt"]
    assert kg.neighbors("France", "in") == ["Lyon", "Paris"]
    with pytest.raises(ValueError):
        kg.edges("Paris", "sideways")


def test_unknown_entity_gives_empty_results(kg):
    for method in (kg.out_edges, kg.in_edges, kg.edges, kg.neighbors):
        assert method("Berlin") == []
    assert kg.follow("Berlin", ["location.country.capital"]) == set()
    assert kg.relation_paths("Berlin", 2) == {}
    assert kg.shortest_paths("Berlin", "Paris") == [] and kg.shortest_paths("Paris", "Berlin") == []
    assert kg.shortest_relation_paths("Berlin", "Paris") == []


def test_follow(kg):
    assert kg.follow("France", ["location.country.capital"]) == {"Paris"}
    assert kg.follow("Paris", ["~location.country.capital"]) == {"France"}
    assert kg.follow("Paris", ["location.location.containedby", "~location.location.containedby"]) == {"Paris", "Lyon"}
    assert kg.follow(["Paris", "Lyon"], ["location.location.containedby"]) == {"France"}
    assert kg.follow(
        "France",
        [
            "government.governmental_jurisdiction.governing_officials",
            "government.government_position_held.office_holder",
        ],
    ) == {"Macron"}
    assert kg.follow("France", []) == {"France"}
    assert kg.follow("France", ["no.such.relation"]) == set()
    assert kg.follow("Macron", ["location.country.capital"]) == set()


def test_relation_paths(kg):
    paths = kg.relation_paths("Macron", 3)
    assert paths[("~government.government_position_held.office_holder",)] == {"m.cvt"}
    two = (
        "~government.government_position_held.office_holder",
        "~government.governmental_jurisdiction.governing_officials",
    )
    assert paths[two] == {"France"}
    assert paths[two + ("location.country.capital",)] == {"Paris"}
    assert paths[two + ("~location.location.containedby",)] == {"Paris", "Lyon"}
    assert all(1 <= len(p) <= 3 for p in paths)
    assert [len(p) for p in paths] == sorted(len(p) for p in paths)  # shortest first
    # the start entity is never re-entered
    assert not any("Macron" in ends for ends in paths.values())
    # each value is what follow() reaches, minus the start
    for p, ends in paths.items():
        assert ends <= kg.follow("Macron", p)
    capped = kg.relation_paths("Macron", 3, max_paths=2)
    assert list(capped) == list(paths)[:2]
    assert kg.relation_paths("Macron", 0) == {} and kg.relation_paths("Macron", 3, max_paths=0) == {}


def test_relation_paths_siblings_but_not_start():
    kg = KGIndex.from_triples([("a", "r", "b"), ("c", "r", "b"), ("b", "s", "d")])
    assert kg.relation_paths("a", 2) == {("r",): {"b"}, ("r", "s"): {"d"}, ("r", "~r"): {"c"}}


def test_shortest_paths_parallel_and_reverse(kg):
    paths = kg.shortest_paths("Lyon", "Paris")
    assert paths == [
        [("Lyon", "location.location.containedby", "France"), ("France", "location.country.capital", "Paris")],
        [("Lyon", "location.location.containedby", "France"), ("France", "location.country.largest_city", "Paris")],
        [("Lyon", "location.location.containedby", "France"), ("France", "~location.location.containedby", "Paris")],
    ]
    assert kg.shortest_relation_paths("Lyon", "Paris") == [
        ("location.location.containedby", "location.country.capital"),
        ("location.location.containedby", "location.country.largest_city"),
        ("location.location.containedby", "~location.location.containedby"),
    ]
    assert kg.shortest_paths("Paris", "Lyon")[0] == [
        ("Paris", "location.location.containedby", "France"),
        ("France", "~location.location.containedby", "Lyon"),
    ]
    assert kg.shortest_paths("Macron", "Paris", max_hops=2) == []
    assert len(kg.shortest_paths("Macron", "Paris", max_hops=3)) == 3
    assert kg.shortest_paths("Paris", "Paris") == [[]] and kg.shortest_relation_paths("Paris", "Paris") == [()]
    assert len(kg.shortest_paths("Lyon", "Paris", max_paths=2)) == 2
    assert len(kg.shortest_relation_paths("Lyon", "Paris", max_paths=1)) == 1


def test_disconnected():
    kg = KGIndex.from_triples([("a", "r", "b"), ("c", "r", "d")])
    assert kg.shortest_paths("a", "d") == [] and kg.shortest_relation_paths("a", "d") == []


def test_empty_graph():
    kg = KGIndex.from_triples([])
    assert kg.num_entities == kg.num_edges == 0 and kg.entities == [] and kg.triples() == []
    assert kg.edges("x") == [] and kg.follow("x", ["r"]) == set() and kg.relation_paths("x", 2) == {}
    assert kg.shortest_paths("x", "y") == [] and kg.subgraph(["x"]).num_entities == 0
    rec = KGQARecord.from_dict(
        {"id": "q", "question": "q?", "answer": [], "q_entity": ["x"], "a_entity": [], "graph": []}
    )
    assert KGIndex.from_record(rec).num_edges == 0 and "x" not in KGIndex.from_record(rec)


def test_from_record_and_isolated_entities(kg):
    rec = KGQARecord.from_dict(
        {
            "id": "q",
            "question": "q?",
            "answer": ["Paris"],
            "q_entity": ["France", "Ghost"],
            "a_entity": ["Paris"],
            "graph": [list(t) for t in TRIPLES],
        }
    )
    from_rec = KGIndex.from_record(rec)
    assert from_rec.triples() == kg.triples() and "Ghost" not in from_rec
    iso = KGIndex.from_triples(TRIPLES, entities=["Ghost"])
    assert "Ghost" in iso and iso.edges("Ghost") == [] and iso.num_edges == 6


def test_subgraph(kg):
    sub = kg.subgraph(["France", "Paris", "Macron", "Berlin"])
    assert sub.entities == ["France", "Macron", "Paris"]
    assert sub.triples() == [t for t in kg.triples() if t[0] in {"France", "Paris"} and t[2] in {"France", "Paris"}]
    assert sub.relations == sorted({t[1] for t in sub.triples()})
    assert sub.edges("Macron") == [] and sub.follow("France", ["location.country.capital"]) == {"Paris"}
    assert len(sub.shortest_paths("Paris", "France")) == 3


def test_invalid_triples():
    with pytest.raises(ValueError, match="three strings"):
        KGIndex.from_triples([("a", "r")])
    with pytest.raises(ValueError, match="three strings"):
        KGIndex.from_triples([("a", "r", 3)])
    with pytest.raises(ValueError, match="three strings"):
        KGIndex.from_triples([("a", "r", "b"), "abc"])
    with pytest.raises(ValueError, match="three strings"):
        KGIndex.from_triples([("a", "r", "b"), 5])
    assert KGIndex.from_triples(iter([["a", "r", "b"]])).triples() == [("a", "r", "b")]
    with pytest.raises(ValueError, match="marks reverse"):
        KGIndex.from_triples([("a", "~r", "b")])


# ------------------------------------------------------------------------------------------ against networkx
def random_triples(seed: int, n_nodes: int, n_edges: int, n_rels: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    nodes = [f"n{i}" for i in range(n_nodes)]
    return [(rng.choice(nodes), f"r{rng.randrange(n_rels)}", rng.choice(nodes)) for _ in range(n_edges)]


def brute_force_shortest_paths(triples, source, target, max_hops):
    """All shortest hop sequences via networkx: node paths on the undirected view, expanded over every label."""
    g = nx.MultiDiGraph()
    for h, r, t in set(triples):
        g.add_edge(h, t, key=r)
    if source not in g or target not in g:
        return []
    und = g.to_undirected(as_view=True)
    if not nx.has_path(und, source, target):
        return []
    if source == target:
        return [[]]
    out = []
    for nodes in nx.all_shortest_paths(und, source, target):
        if len(nodes) - 1 > max_hops:
            return []
        hop_options = []
        for u, v in zip(nodes, nodes[1:]):
            labels = [(u, k, v) for k in g.get_edge_data(u, v, default={})]
            labels += [(u, "~" + k, v) for k in g.get_edge_data(v, u, default={})]
            hop_options.append(labels)
        out.extend(list(p) for p in itertools.product(*hop_options))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_shortest_paths_match_networkx(seed):
    triples = random_triples(seed, n_nodes=12 + seed, n_edges=18 + 3 * seed, n_rels=3)
    kg = KGIndex.from_triples(triples)
    rng = random.Random(100 + seed)
    nodes = sorted({x for h, _, t in triples for x in (h, t)})
    pairs = [(rng.choice(nodes), rng.choice(nodes)) for _ in range(25)] + [(nodes[0], "missing")]
    for s, t in pairs:
        for max_hops in (2, 4):
            ours = kg.shortest_paths(s, t, max_hops=max_hops, max_paths=10**6)
            expected = brute_force_shortest_paths(triples, s, t, max_hops)
            assert sorted(ours) == sorted(expected), (seed, s, t, max_hops)
            assert len(ours) == len({tuple(p) for p in ours})  # no duplicates
            label_id = {r: i for i, r in enumerate(kg.relations + ["~" + r for r in kg.relations])}
            assert ours == sorted(ours, key=lambda p: [(label_id[r], kg.entity_id(b)) for _, r, b in p])
            rel_paths = kg.shortest_relation_paths(s, t, max_hops=max_hops)
            assert rel_paths == list(dict.fromkeys(tuple(r for _, r, _ in p) for p in ours))
            for p in ours:  # every hop exists in the graph in the stated direction
                for a, r, b in p:
                    assert (b, r[1:], a) in kg.triples() if r.startswith("~") else (a, r, b) in kg.triples()
                if p:
                    assert t in kg.follow(s, [r for _, r, _ in p])


@pytest.mark.parametrize("seed", range(3))
def test_relation_paths_match_follow(seed):
    triples = random_triples(seed, n_nodes=10, n_edges=20, n_rels=2)
    kg = KGIndex.from_triples(triples)
    start = triples[0][0]
    paths = kg.relation_paths(start, 3)
    # brute force: every label sequence, walked set by set, never re-entering the start
    labels = kg.relations + ["~" + r for r in kg.relations]
    expected = {}
    for k in range(1, 4):
        for seq in itertools.product(labels, repeat=k):
            frontier = {start}
            for r in seq:
                frontier = kg.follow(frontier, [r]) - {start}
            if frontier:
                expected[seq] = frontier
    assert paths == expected
