import numpy as np
import pytest
import torch

from kglightning.data.records import KGQARecord
from kglightning.data.text import relation_text
from kglightning.data.triple_array import Vocab
from kglightning.datamodules.detection_graphs import DetectionStats, build_detection_graph, node_texts
from kglightning.datamodules.text_rows import TextRows
from kglightning.metrics.functional.qa import normalize


class _Counting(dict):
    """A string -> row map that counts its lookups."""

    lookups = 0

    def get(self, key, default=None):
        self.lookups += 1
        return super().get(key, default)


def test_rows_are_looked_up_once_per_string_and_follow_a_growing_vocabulary():
    vocab = Vocab(["Paris", "people.person.nationality", "France"])
    text_id = _Counting({"Paris": 4, "France": 9, "people person nationality": 2, "Lyon": 1})
    rows = TextRows(text_id)
    assert rows.nodes(vocab, np.array([0, 2, 0])).tolist() == [4, 9, 4]
    assert rows.nodes(vocab, np.array([2, 0])).tolist() == [9, 4] and text_id.lookups == 2  # memoised
    assert rows.relations(vocab, np.array([1])).tolist() == [2]
    vocab.ids(["Lyon"])  # the vocabulary grows after its array was made
    assert rows.nodes(vocab, np.array([3, 0])).tolist() == [1, 4] and text_id.lookups == 4
    with pytest.raises(KeyError, match="'Mars' has no row"):
        rows.nodes(Vocab(["Mars"]), np.array([0]))
    assert rows.normal_forms(vocab, np.array([0, 1])) == ["paris", "peoplepersonnationality"]
    plain = TextRows(text_id, memo=False)  # no arrays: the same answers
    assert plain.nodes(vocab, np.array([3, 0])).tolist() == [1, 4] and plain.relations(vocab, [1]).tolist() == [2]
    assert plain.normal_forms(vocab, np.array([0])) == ["paris"] and not plain._memo


def test_least_recently_used_vocabularies_are_dropped():
    rows = TextRows({"a": 0}, max_vocabs=2)
    vocabs = [Vocab(["a"]) for _ in range(3)]
    for v in vocabs:
        rows.nodes(v, np.array([0]))
    assert [entry[0] for entry in rows._memo.values()] == vocabs[1:]


def test_a_shared_map_builds_the_graphs_a_plain_dict_builds():
    """One TextRows over the records of a split (one vocabulary) gives every graph exactly as a dict does, with
    answers matched by exact name, by normal form, and a relation view other than the default."""
    vocab = Vocab()
    recs = [
        KGQARecord.from_dict(
            {
                "id": f"q{i}",
                "question": f"where {i}?",
                "answer": ["Paris"],
                "q_entity": ["France"],
                "a_entity": ["Paris"],
                "prediction": ["paris", "The Euro", "Spain", "Mars"],
                "graph": [
                    ["France", "location.country.capital", "Paris"],
                    ["France", "finance.currency", "Euro"],
                    ["Spain", "location.adjoins", "France"],
                    [f"m.0{i}", "common.topic", "France"],
                ],
            },
            vocab=vocab,
        )  # fmt: skip
        for i in range(3)
    ]
    texts = list(dict.fromkeys(t for r in recs for t in node_texts(r, "leaf")))
    text_id = {t: 100 + i for i, t in enumerate(texts)}
    shared = TextRows(text_id)
    for r in recs:
        a = build_detection_graph(r, text_id, DetectionStats(), ungrounded="keep", relation_view="leaf")
        b = build_detection_graph(r, shared, DetectionStats(), ungrounded="keep", relation_view="leaf")
        for key in a.keys():
            va, vb = a[key], b[key]
            if isinstance(va, torch.Tensor):
                torch.testing.assert_close(va, vb, rtol=0, atol=0, equal_nan=True)
            else:
                assert va == vb, key
        assert a.answer_names == ["paris", "The Euro", "Spain", "Mars"] and a.answer_grounding.tolist() == [0, 0, 0, 2]
        assert text_id[relation_text("location.adjoins", "leaf")] in b.edge_text.tolist()
    assert normalize("The Euro") == "euro"
