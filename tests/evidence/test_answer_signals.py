"""What an LLM's output says of each answer: votes, first rank, cited paths (in the graph or not)."""

from __future__ import annotations

import math

import pytest

from kglightning.baselines.structural import StructuralBaseline, structural_features
from kglightning.data.records import KGQARecord
from kglightning.evidence.answer_signals import LLM_SIGNALS, SIGNALS, AnswerSignals, path_triples


def _record() -> KGQARecord:
    graph = [("Jamaica", "language", "English"), ("Jamaica", "anthem", "Jamaica, Land We Love"),
             ("English", "family", "Germanic")]  # fmt: skip
    # five beams: English three times (two distinct paths, one of them backwards), Patois twice (a made-up path)
    prediction = ["English", "Patois", "english", "English", "Patois"]
    paths = [
        [["Jamaica", "language", "English"]],
        [["Jamaica", "dialect", "Patois"]],
        [["Germanic", "family", "English"]],  # reverse of a graph triple: in the graph
        [["Jamaica", "language", "English"]],  # the same path again: one distinct path
        [],
    ]
    return KGQARecord("q1", "what do Jamaicans speak?", ["English"], ["Jamaica"], ["English"], graph,
                      prediction=prediction, prediction_paths=paths)  # fmt: skip


def test_signals_by_hand():
    s = AnswerSignals(_record())
    english = dict(zip(SIGNALS, s.values([0, 2, 3], degree=2)))
    assert english["votes"] == pytest.approx(3 / 5) and english["first_rank"] == 0.0
    assert english["log_answers"] == pytest.approx(math.log1p(5))
    assert english["cited_paths"] == pytest.approx(math.log1p(2)) and english["cited_in_graph"] == 1.0
    assert english["log_degree"] == pytest.approx(math.log1p(2))
    assert english["log_graph_size"] == pytest.approx(math.log1p(3))
    patois = dict(zip(SIGNALS, s.values([1, 4], degree=None)))
    assert patois["votes"] == pytest.approx(2 / 5) and patois["first_rank"] == pytest.approx(1 / 5)
    assert patois["cited_paths"] == pytest.approx(math.log1p(1)) and patois["cited_in_graph"] == 0.0
    assert patois["log_degree"] == 0.0


def test_no_citations_and_bad_calls():
    r = _record()
    r.prediction_paths = None
    s = AnswerSignals(r)
    assert s.values([0], degree=1, names=["cited_paths", "cited_in_graph"]) == [0.0, 0.0]
    with pytest.raises(ValueError, match="at least one entry"):
        s.values([], degree=1)
    with pytest.raises(ValueError, match="unknown answer signal 'beams'"):
        s.values([0], degree=1, names=["beams"])  # type: ignore[list-item]
    assert path_triples(["a", "r", "b"]) == [("a", "r", "b")]


def test_the_baseline_groups_answers_as_the_detector_does_and_reads_the_signals():
    r = _record()
    feats = structural_features(r, signals=LLM_SIGNALS)
    assert list(feats) == ["English", "Patois"]  # "english" is the node English: one answer, three votes
    english = dict(zip(LLM_SIGNALS, feats["English"][6:]))
    assert english["votes"] == pytest.approx(3 / 5) and english["cited_in_graph"] == 1.0
    assert feats["Patois"][2] == 0.0  # names no node
    with pytest.raises(ValueError, match="signals must be distinct names"):
        StructuralBaseline(signals=["log_degree"])  # type: ignore[list-item]
    # fitted with the signals, the baseline reads them: votes alone separate these answers
    records = []
    for i in range(20):
        rec = _record()
        rec.id = f"q{i}"
        records.append(rec)
    base = StructuralBaseline(signals=["votes", "cited_in_graph"]).fit(records)
    scores = base.score(records[:1])[0]
    assert scores["Patois"] > scores["English"]
    assert "votes+cited_in_graph" in base.cache_key
