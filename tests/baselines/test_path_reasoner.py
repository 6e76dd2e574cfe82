"""The path-retrieval baseline with the real bundled MiniLM encoder (loaded from site-packages, no download)."""

from __future__ import annotations

import pytest
import torch

from kglightning.baselines import EmbeddingPathReasoner
from kglightning.data import KGQARecord, SentenceEncoder
from kglightning.data.embeddings import EmbeddingCache

GRAPH = [
    ["France", "location.country.capital", "Paris"],
    ["France", "location.country.currency_used", "Euro"],
    ["France", "location.country.languages_spoken", "French"],
    ["France", "location.country.languages_spoken", "Breton"],
    ["Paris", "location.location.containedby", "Europe"],
    ["Lyon", "location.location.containedby", "France"],
]


def _record(question: str, **kw) -> KGQARecord:
    data = {"id": "q", "question": question, "answer": ["x"], "q_entity": ["France"], "a_entity": [], "graph": GRAPH}
    data.update(kw)
    return KGQARecord.from_dict(data)


@pytest.fixture(scope="module")
def reasoner(tmp_path_factory):
    return EmbeddingPathReasoner(
        SentenceEncoder(show_progress=False),
        cache_dir=str(tmp_path_factory.mktemp("emb")),
        top_k_paths=1,
        show_progress=False,
    )


def test_picks_the_relation_the_question_asks_for(reasoner):
    out = reasoner.propose(
        [
            _record("what is the capital of France?"),
            _record("what languages are spoken in France?"),
            _record("what currency is used in France?"),
        ]
    )
    assert out[0].prediction == ["Paris"]
    assert sorted(out[1].prediction) == ["Breton", "French"]
    assert out[2].prediction == ["Euro"]
    for rec in out:
        assert len(rec.confidence) == len(rec.prediction) and all(0 < c <= 1 for c in rec.confidence)
        assert rec.extra["evidence"][0]["path"]


def test_reverse_and_two_hop_paths_are_candidates(reasoner):
    paths = reasoner.candidate_paths(_record("q?"))
    assert ("~location.location.containedby",) in paths and paths[("~location.location.containedby",)] == {"Lyon"}
    assert ("location.country.capital", "location.location.containedby") in paths
    assert all("France" not in ends for ends in paths.values())  # the topic entity is never an answer


def test_abstains_on_unknown_topic_and_empty_graph(reasoner):
    before = reasoner.num_abstained
    out = reasoner.propose([_record("q?", q_entity=["Narnia"]), _record("q?", graph=[])])
    assert [r.prediction for r in out] == [[], []] and [r.confidence for r in out] == [[], []]
    assert reasoner.num_abstained == before + 2


def test_cache_key_tracks_configuration():
    a = EmbeddingPathReasoner(SentenceEncoder(), max_hops=2)
    assert a.cache_key != EmbeddingPathReasoner(SentenceEncoder(), max_hops=3).cache_key
    with pytest.raises(ValueError):
        EmbeddingPathReasoner(temperature=0)


def test_embedding_cache_persists_and_never_reencodes(tmp_path):
    calls = []

    class Counting:
        dim, cache_key = 2, "counting"

        def encode(self, texts):
            calls.extend(texts)
            return torch.tensor([[float(len(t)), 1.0] for t in texts])

    cache = EmbeddingCache(Counting(), tmp_path)
    first = cache.embed(["a", "bb", "a"])
    assert calls == ["a", "bb"]
    second = EmbeddingCache(Counting(), tmp_path)  # a new process would see the same folder
    assert torch.equal(second.embed(["bb", "a"]), first[[1, 0]])
    assert calls == ["a", "bb"]
    second.embed(["ccc"])
    third = EmbeddingCache(Counting(), tmp_path)
    assert len(third) == 3 and calls == ["a", "bb", "ccc"]


def test_two_live_caches_on_one_folder_share_what_either_encoded(tmp_path):
    """The detector's DataModule and the answer proposer each hold a cache on the same folder: strings one of them
    encoded after the other was created are read from disk, not encoded again."""
    calls = []

    class Counting:
        dim, cache_key = 2, "counting"

        def encode(self, texts):
            calls.extend(texts)
            return torch.tensor([[float(len(t)), 1.0] for t in texts])

    early = EmbeddingCache(Counting(), tmp_path)  # created before anything is on disk
    late = EmbeddingCache(Counting(), tmp_path)
    late.embed(["question one", "a path"])
    assert calls == ["a path", "question one"]
    out = early.embed(["question one", "a node", "a path"])
    assert calls == ["a path", "question one", "a node"]  # only the new string was encoded
    assert out[:, 0].tolist() == [12.0, 6.0, 6.0]
    assert early.refresh() == 0
