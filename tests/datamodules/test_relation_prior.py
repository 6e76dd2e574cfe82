"""The relation prior: answers reached the way similar training questions were answered score high."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kglightning.data import SentenceEncoder
from kglightning.datamodules import DetectionDataModule
from kglightning.datamodules.relation_prior import RelationPrior

COUNTRIES = ["France", "Spain", "Italy", "Peru", "Chile", "Japan"]


def _record(split: str, i: int) -> dict:
    c = COUNTRIES[i % len(COUNTRIES)]
    graph = [[c, "location.country.capital", f"{c} City"], [c, "location.location.borders", f"{c} Hills"]]
    return {"id": f"{split}-{i}", "question": f"What is the capital of {c}?", "answer": [f"{c} City"],
            "q_entity": [c], "a_entity": [f"{c} City"], "graph": graph,
            "prediction": [f"{c} Hills", f"{c} City", "Atlantis"]}  # fmt: skip


def test_answers_reached_as_similar_questions_were_answered_score_high(tmp_path: Path, tiny_encoder_dir):
    folder = tmp_path / "data"
    folder.mkdir()
    for split, n in (("train", 6), ("validation", 3), ("test", 3)):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(_record(split, i)) + "\n" for i in range(n)))
    dm = DetectionDataModule(data_dir=str(folder), encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
                             cache_dir=str(tmp_path / "cache"), answer_features=["relation_prior"],
                             prior_neighbours=3)  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    for split in ("train", "validation"):
        for g in dm.datasets[split]:
            # Hills (borders: never a gold path), City (capital: every similar question's), Atlantis (no node)
            assert [n.split()[-1] for n in g.answer_names] == ["Hills", "City", "Atlantis"]
            assert g.answer_features.flatten().tolist() == [0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="prior_neighbours"):
        DetectionDataModule(data_dir=str(folder), prior_neighbours=0)


def test_a_training_question_is_not_its_own_neighbour():
    q = torch.eye(3)
    prior = RelationPrior(neighbours=1).fit(q, [{"a"}, {"b"}, {"c"}], ["x", "y", "z"])
    # the only other questions are orthogonal (weight 0): no evidence, not its own label
    assert prior.score(q[:1], [[{"a"}]], ["x"]) == [[0.0]]
    assert prior.score(q[:1], [[{"a"}]], ["new"]) == [[1.0]]
    with pytest.raises(RuntimeError, match="before fit"):
        RelationPrior().score(q, [[]], ["x"])
    with pytest.raises(ValueError, match="3 questions, 2 path sets"):
        RelationPrior().fit(q, [{"a"}, {"b"}], ["x", "y", "z"])
