import pytest
import torch

from kglightning.data.records import KGQARecord
from kglightning.datamodules.detection_graphs import DetectionStats, build_detection_graph, node_texts
from kglightning.nn import EDGE_FORWARD, EDGE_REVERSE, EDGE_VIRTUAL


def _record(**kw) -> KGQARecord:
    base = {
        "id": "q1",
        "question": "capital of France?",
        "answer": ["Paris"],
        "q_entity": ["France"],
        "a_entity": ["Paris"],
        "graph": [
            ["France", "capital", "Paris"],
            ["France", "capital", "Paris"],
            ["France", "currency", "Euro"],
            ["France", "borders", "Spain"],
        ],
        "prediction": ["Paris", "Euro", "unknown", "Atlantis"],
    }
    base.update(kw)
    return KGQARecord.from_dict(base)


def _ids(record):
    return {t: i for i, t in enumerate(dict.fromkeys(node_texts(record)))}


def test_augmented_graph_structure_and_labels():
    rec = _record()
    stats = DetectionStats()
    g = build_detection_graph(rec, _ids(rec), stats)
    # nodes: France, Paris, Euro, Spain + virtual question node
    assert g.num_nodes == 5
    assert g.topic_mask.tolist() == [True, False, False, False, False]
    assert g.answer_mask.tolist() == [False, True, True, False, False]
    assert g.answer_index.tolist() == [1, 2]
    assert g.y.tolist() == [0.0, 1.0]  # Paris is gold, Euro is hallucinated
    assert g.answer_names == ["Paris", "Euro"]
    # duplicate triple stored once: 3 forward + 3 reverse + 1 virtual edge
    kinds = g.edge_kind.tolist()
    assert kinds.count(EDGE_FORWARD) == 3 and kinds.count(EDGE_REVERSE) == 3 and kinds.count(EDGE_VIRTUAL) == 1
    virtual = g.edge_index[:, g.edge_kind == EDGE_VIRTUAL]
    assert virtual.tolist() == [[4], [0]]
    fwd = g.edge_index[:, g.edge_kind == EDGE_FORWARD]
    rev = g.edge_index[:, g.edge_kind == EDGE_REVERSE]
    assert torch.equal(fwd.flip(0), rev)
    # "unknown" is an abstention, "Atlantis" names no node: both excluded and counted
    assert stats.abstained == 1 and stats.unmatched == 1 and stats.instances == 2 and stats.hallucinated == 1


def test_normalised_name_matching_and_no_reverse_edges():
    rec = _record(prediction=["the paris", "PARIS!"])
    stats = DetectionStats()
    g = build_detection_graph(rec, _ids(rec), stats, add_reverse_edges=False)
    assert g.answer_names == ["the paris"]  # both normalise to node "Paris"; one instance
    assert (g.edge_kind != EDGE_REVERSE).all()


def test_graphs_without_instances_are_counted():
    stats = DetectionStats()
    for rec in (_record(prediction=[]), _record(prediction=["none"]), _record(graph=[], prediction=["Paris"])):
        assert build_detection_graph(rec, _ids(rec), stats) is None
    assert stats.no_instance == 3 and stats.graphs == 0 and stats.abstained == 1 and stats.unmatched == 1
    assert stats.dropped == 1 and "3 questions with no answer left" in stats.summary("test")


def test_ungrounded_answers_are_kept_scored_and_counted():
    rec = _record(prediction=["Atlantis", "paris", "Euro", "atlantis!", "Mars", "unknown", "Pariss"])
    stats = DetectionStats()
    near = {"Pariss": "Paris", "Mars": None}.get
    ids = _ids(rec)
    g = build_detection_graph(rec, ids, stats, ungrounded="keep", near_miss=lambda a: near(a))
    # grounded first (prediction order), then ungrounded; "Pariss" is near Paris, which "paris" already names: a vote
    assert g.answer_names == ["paris", "Euro", "Atlantis", "Mars"]
    assert g.answer_grounding.tolist() == [0, 0, 2, 2] and g.answer_index.tolist() == [1, 2]
    assert g.y.tolist() == [0.0, 1.0, 1.0, 1.0]
    assert g.answer_rank.tolist() == pytest.approx([1 / 7, 2 / 7, 0.0, 4 / 7])
    assert g.num_answer_items.tolist() == [4]
    assert g.ungrounded_text.tolist() == [ids["Atlantis"], ids["Mars"]]
    assert g.ungrounded_question_index.tolist() == [4, 4]  # the virtual question node
    assert stats.by_grounding == {"exact": [2, 1], "near_miss": [0, 0], "ungrounded": [2, 2]}
    assert stats.unmatched == 2 and stats.duplicates == 2 and stats.dropped == 0 and stats.abstained == 1
    assert "2 ungrounded (100.0% hallucinated)" in stats.summary("test") and "2 repeats" in stats.summary("test")
    assert g.answer_signals[0, 0].item() == pytest.approx(2 / 7)  # "paris" and "Pariss" vote for Paris


def test_near_miss_grounding_and_a_graph_with_only_ungrounded_answers():
    stats = DetectionStats()
    near = {"Pariss": "Paris"}.get
    rec = _record(prediction=["Pariss", "Mars"], confidence=[0.9, 0.2])
    g = build_detection_graph(rec, _ids(rec), stats, ungrounded="keep", near_miss=near)
    assert g.answer_names == ["Pariss", "Mars"] and g.answer_grounding.tolist() == [1, 2]
    assert g.y.tolist() == [0.0, 1.0]  # "Pariss" is the node Paris, a gold answer
    assert g.proposer_confidence.tolist() == pytest.approx([0.9, 0.2])
    # a misspelling never takes the node of a later exact answer: it is a vote for it, not a second answer (found by
    # a review: it was an ungrounded answer, labelled hallucinated by its text while its node is gold)
    rec = _record(prediction=["Pariss", "Paris", "Parris"])
    near = {"Pariss": "Paris", "Parris": "Paris"}.get
    g = build_detection_graph(rec, _ids(rec), stats, ungrounded="keep", near_miss=near)
    assert g.answer_names == ["Paris"] and g.answer_grounding.tolist() == [0] and g.y.tolist() == [0.0]
    assert g.answer_signals[0, 0].item() == pytest.approx(1.0)  # all three entries vote for Paris
    # in drop mode a dropped answer's repeat is a repeat, as in keep mode
    drop = DetectionStats()
    rec = _record(prediction=["Atlantis", "atlantis", "Paris"])
    build_detection_graph(rec, _ids(rec), drop, ungrounded="drop")
    assert (drop.unmatched, drop.duplicates, drop.dropped) == (1, 1, 1)
    # a repeated near miss (any spelling that normalises alike) is one answer with its votes, not a second answer
    stats = DetectionStats()
    rec = _record(prediction=["Pariss", "Pariss", "Euro", "PARISS"])
    g = build_detection_graph(rec, _ids(rec), stats, ungrounded="keep", near_miss=near)
    assert g.answer_names == ["Pariss", "Euro"] and g.answer_grounding.tolist() == [1, 0] and stats.duplicates == 2
    assert g.answer_signals[:, 0].tolist() == pytest.approx([0.75, 0.25])  # votes
    empty = _record(graph=[], prediction=["Paris"])
    g = build_detection_graph(empty, _ids(empty), stats, ungrounded="keep")
    assert g.num_nodes == 1 and g.answer_index.numel() == 0 and g.y.tolist() == [0.0]


def test_unknown_topic_entity_gives_no_virtual_edge():
    rec = _record(q_entity=["Narnia"])
    g = build_detection_graph(rec, _ids(rec), DetectionStats())
    assert not g.topic_mask.any() and (g.edge_kind != EDGE_VIRTUAL).all()


@pytest.mark.parametrize(
    ("view", "texts"),
    [
        ("readable", ["location country capital", "location country currency used"]),
        ("raw", ["location.country.capital", "location.country.currency_used"]),
        ("leaf", ["capital", "currency used"]),
    ],
)
def test_relation_view_sets_the_edge_and_path_texts(view, texts):
    from kglightning.datamodules.detection_graphs import answer_paths

    rec = _record(
        graph=[["France", "location.country.capital", "Paris"], ["France", "location.country.currency_used", "Euro"]]
    )
    ids = {t: i for i, t in enumerate(dict.fromkeys(node_texts(rec, view)))}
    assert all(t in ids for t in texts)
    g = build_detection_graph(rec, ids, DetectionStats(), relation_view=view)
    assert g.edge_text[g.edge_kind == EDGE_FORWARD].tolist() == [ids[t] for t in texts]
    assert [p for _, p in answer_paths(rec, ["Paris", "Euro"], relation_view=view)] == [[texts[0]], [texts[1]]]
    with pytest.raises(KeyError):  # another view's texts are not in this table
        other = "leaf" if view != "leaf" else "raw"
        build_detection_graph(rec, ids, DetectionStats(), relation_view=other)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("reverse", [True, False])
def test_graph_arrays_match_a_direct_reading_of_the_triples(seed, reverse):
    import random

    from kglightning.data.triple_array import TripleArray, Vocab

    rng = random.Random(seed)
    names, rels = [f"n{i}" for i in range(15)], ["a.b", "c.d_e", "f"]
    graph = [(rng.choice(names), rng.choice(rels), rng.choice(names)) for _ in range(60)]
    graph += graph[:7]  # exact repeats
    rec = _record(graph=[list(t) for t in graph], q_entity=[graph[3][0]], prediction=[graph[5][2], "n99"])
    ids = {t: i for i, t in enumerate(sorted(set(node_texts(rec))))}
    for g_in in (rec, _record(graph=TripleArray.from_triples(graph, Vocab()), q_entity=rec.q_entity,
                              prediction=rec.prediction)):  # fmt: skip
        g = build_detection_graph(g_in, ids, DetectionStats(), add_reverse_edges=reverse, ungrounded="keep")
        order = list(dict.fromkeys(n for h, _, t in graph for n in (h, t)))
        distinct = list(dict.fromkeys(graph))
        fwd = [[order.index(h) for h, _, _ in distinct], [order.index(t) for _, _, t in distinct]]
        from kglightning.data.text import relation_text

        rel = [ids[relation_text(r)] for _, r, _ in distinct]
        want_src, want_dst = fwd[0] + (fwd[1] if reverse else []), fwd[1] + (fwd[0] if reverse else [])
        n = len(order)
        assert g.edge_index.tolist() == [want_src + [n], want_dst + [order.index(graph[3][0])]]
        assert g.edge_text.tolist() == rel * (2 if reverse else 1) + [0]
        assert g.node_text.tolist() == [ids[x] for x in order] + [ids[rec.question]]
        assert g.answer_names == [graph[5][2], "n99"] and g.answer_index.tolist() == [order.index(graph[5][2])]


@pytest.mark.parametrize("reverse", [True, False])
def test_compact_graph_round_trips_exactly_in_less_memory(reverse):
    from kglightning.datamodules.graph_forms import compact_graph, expand_graph

    rec = _record()
    g = build_detection_graph(rec, _ids(rec), DetectionStats(), add_reverse_edges=reverse, ungrounded="keep")
    small = compact_graph(g)
    back = expand_graph(small)
    assert set(back.keys()) == set(g.keys())
    for key in g.keys():
        a, b = g[key], back[key]
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
            assert a.dtype == b.dtype, key
        else:
            assert a == b, key

    def size(d):  # the tensors that grow with the graph
        return sum(d[k].numel() * d[k].element_size() for k in ("edge_index", "edge_text", "edge_kind", "node_text"))

    assert size(small) <= size(g) / (3 if reverse else 1.8)
    assert small.edge_index.shape[1] == (3 + 1 if reverse else g.edge_index.shape[1])  # 3 triples + 1 virtual edge
    assert expand_graph(g) is g  # a graph that is not compact is left as it is
    assert compact_graph(small) is small and torch.equal(expand_graph(compact_graph(small)).edge_kind, g.edge_kind)
    huge = g.clone()
    huge.node_text = huge.node_text + 2**31  # rows past int32 stay int64
    assert torch.equal(expand_graph(compact_graph(huge)).node_text, huge.node_text)
    odd = g.clone()
    odd.edge_index = odd.edge_index.flip(1)  # not the layout build_detection_graph writes: nothing is dropped
    assert torch.equal(expand_graph(compact_graph(odd)).edge_index, odd.edge_index)


def _random_graph(seed: int, n: int, m: int, v: int, mirror: bool):
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n - 1, (m,), generator=g), torch.randint(0, n - 1, (m,), generator=g)
    rel, hub = torch.randint(0, 50, (m,), generator=g), torch.full((v,), n - 1)
    topics = torch.randint(0, n - 1, (v,), generator=g)
    both = [src, dst] if mirror else [src]
    kinds = (
        [torch.full((m,), EDGE_FORWARD)] + [torch.full((m,), EDGE_REVERSE)] * mirror + [torch.full((v,), EDGE_VIRTUAL)]
    )
    return Data(num_nodes=n, node_text=torch.randint(0, 99, (n,), generator=g),
                edge_index=torch.stack([torch.cat([*both, hub]), torch.cat([*both[::-1], topics])]),
                edge_text=torch.cat([rel] * (1 + mirror) + [torch.zeros(v, dtype=torch.long)]),
                edge_kind=torch.cat(kinds), qid=f"q{seed}", answer_names=[f"a{seed}"], answer_index=torch.tensor([0]),
                ungrounded_text=torch.zeros(0, dtype=torch.long), question_index=torch.tensor([n - 1]))  # fmt: skip


def test_a_batch_of_compact_graphs_equals_the_batch_of_their_expanded_forms():
    """collate_graphs expands compact graphs once per batch: the batch, its edge order and its per-graph slices are
    those of batching the graphs expanded one by one."""
    from torch_geometric.data import Batch

    from kglightning.datamodules.graph_forms import collate_graphs, compact_graph, expand_graph

    shapes = [(10, 5, 2, True), (4, 0, 1, True), (7, 3, 0, True), (6, 4, 2, False), (3, 0, 0, True), (9, 6, 1, True)]
    compact = [compact_graph(_random_graph(i, *shape)) for i, shape in enumerate(shapes)]
    assert [int(c.compact_reverse) for c in compact] == [5, -1, 3, -1, -1, 6]  # mirrored ones and the others
    want = Batch.from_data_list([expand_graph(c) for c in compact])
    table = torch.randn(99, 4)
    got = collate_graphs(compact, lambda ids: table[ids])
    for key in want.keys():
        a, b = want[key], got[key]
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), key
        else:
            assert a == b, key
    assert "compact_reverse" not in got
    for i in range(len(shapes)):
        one, back = want.get_example(i), got.get_example(i)
        assert torch.equal(one.edge_index, back.edge_index) and torch.equal(one.edge_kind, back.edge_kind)
    torch.testing.assert_close(got.x_text, table[want.node_text])


def test_a_question_without_gold_answers_is_unlabelled_and_not_counted_as_hallucinated():
    rec = _record(answer=[], a_entity=[], prediction=["Paris", "Euro", "Atlantis"])
    stats = DetectionStats()
    g = build_detection_graph(rec, _ids(rec), stats, ungrounded="keep")
    assert g.labelled.tolist() == [False] and g.answer_names == ["Paris", "Euro", "Atlantis"]
    # issue 57: these three answers were counted as 3 hallucinated instances of 3
    assert (stats.instances, stats.hallucinated, stats.unlabelled) == (0, 0, 3)
    assert "3 answers of questions with no gold answer" in stats.summary("train")


def test_answers_that_rog_normalises_to_nothing_are_answers_not_abstentions():
    # a band called "The The" and a blood type "A" are graph nodes; RoG's normalize empties both names
    graph = [["Matt Johnson", "member of", "The The"], ["Matt Johnson", "blood type", "A"], ["Matt Johnson", "x", "B"]]
    rec = _record(question="Which band?", answer=["The The"], a_entity=["The The"], q_entity=["Matt Johnson"],
                  graph=graph, prediction=["The The", "A", "the the", " ", "unknown"])  # fmt: skip
    stats = DetectionStats()
    g = build_detection_graph(rec, _ids(rec), stats, ungrounded="keep")
    assert g.answer_names == ["The The", "A"] and g.answer_grounding.tolist() == [0, 0]
    assert g.y.tolist() == [0.0, 1.0]  # "The The" is the gold answer; "A" is not
    assert (stats.abstained, stats.duplicates) == (2, 1)  # the blank answer and "unknown"; "the the" is a repeat
    # a gold answer "A" labels the answer "A" faithful (it was dropped as an abstention, and its gold matched "")
    rec = _record(question="Blood type?", answer=["A"], a_entity=[], q_entity=["Matt Johnson"], graph=graph,
                  prediction=["A", "B"])  # fmt: skip
    g = build_detection_graph(rec, _ids(rec), DetectionStats(), ungrounded="keep")
    assert g.answer_names == ["A", "B"] and g.y.tolist() == [0.0, 1.0]


def test_unicode_spellings_of_one_name_are_one_answer():
    nfc, nfd = "Z\u00fcrich", "Zu\u0308rich"
    graph = [["Switzerland", "largest city", nfc], ["Switzerland", "capital", "Bern"]]
    # the gold answer in NFD, the node and the prediction in NFC; then the reverse
    rec = _record(question="largest city?", answer=[nfd], a_entity=[], q_entity=["Switzerland"], graph=graph,
                  prediction=[nfc, "Bern"])  # fmt: skip
    g = build_detection_graph(rec, _ids(rec), DetectionStats(), ungrounded="keep")
    assert g.answer_names == [nfc, "Bern"] and g.y.tolist() == [0.0, 1.0]
    rec = _record(question="largest city?", answer=[nfc], a_entity=[nfc], q_entity=["Switzerland"], graph=graph,
                  prediction=[nfd])  # fmt: skip
    g = build_detection_graph(rec, _ids(rec), DetectionStats(), ungrounded="keep")
    assert g.answer_grounding.tolist() == [0] and g.y.tolist() == [0.0]  # grounded on the node, and faithful


def test_punctuation_does_not_split_an_answer_that_rog_normalises_to_nothing():
    """Review of issue 57: 'The The.' was labelled hallucinated against the gold answer 'The The'."""
    graph = [["Matt Johnson", "member of", "The The"], ["Matt Johnson", "blood type", "A"]]
    rec = _record(question="Which band?", answer=["The The"], a_entity=[], q_entity=["Matt Johnson"], graph=graph,
                  prediction=["The The.", "A."])  # fmt: skip
    g = build_detection_graph(rec, _ids(rec), DetectionStats(), ungrounded="keep")
    assert g.answer_grounding.tolist() == [0, 0] and g.y.tolist() == [0.0, 1.0]
