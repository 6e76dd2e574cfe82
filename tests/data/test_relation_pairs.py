"""Relation-scorer pairs: exact pairs on a hand-made 2-hop question, negatives, determinism, the DataModule."""

from __future__ import annotations

import json
import random

import pytest
import torch

from kglightning.data import RelationPair, mine_relation_pairs
from kglightning.data.kg import KGIndex
from kglightning.data.records import KGQARecord
from kglightning.data.relation_pairs import gold_relation_paths
from kglightning.data.text import path_text, relation_text, step_query_text
from kglightning.datamodules import RelationPairDataModule

QUESTION = "what currency is used in the country whose capital is Paris?"


def _record(**kwargs) -> KGQARecord:
    """Paris -(~capital)-> France -(currency)-> Euro: a 2-hop answer, plus distractors at both steps."""
    fields = dict(
        id="q1",
        question=QUESTION,
        answer=["Euro"],
        q_entity=["Paris"],
        a_entity=["Euro"],
        graph=[
            ["France", "capital", "Paris"],
            ["Paris", "population", "2M"],
            ["Paris", "twin", "Rome"],
            ["Seine", "flows_through", "Paris"],
            ["France", "currency", "Euro"],
            ["France", "language", "French"],
            ["France", "borders", "Spain"],
            ["Germany", "borders", "France"],
            ["Spain", "currency", "Euro"],
        ],
    )
    fields.update(kwargs)
    return KGQARecord(**fields)


def test_gold_paths_of_a_two_hop_question():
    assert gold_relation_paths(_record()) == [("~capital", "currency")]
    assert gold_relation_paths(_record(), max_hops=1) == []


def test_exact_pairs_with_all_negatives():
    pairs = mine_relation_pairs(_record(), negatives=10)
    q0, q1 = QUESTION, step_query_text(QUESTION, ["~capital"])
    assert q1 == QUESTION + " | inverse of capital"
    assert all(isinstance(p, RelationPair) and p.question_id == "q1" for p in pairs)
    assert [(p.query, p.relation, p.label) for p in pairs if p.label == 1.0] == [(q0, "inverse of capital", 1.0),
                                                                                 (q1, "currency", 1.0)]  # fmt: skip
    # negatives leave the entities reached by the prefix, both directions, minus the gold next relation
    neg0 = {p.relation for p in pairs if p.query == q0 and p.label == 0.0}
    neg1 = {p.relation for p in pairs if p.query == q1 and p.label == 0.0}
    assert neg0 == {relation_text(r) for r in ["population", "twin", "~flows_through"]}
    assert neg1 == {relation_text(r) for r in ["capital", "language", "borders", "~borders"]}
    # order: a prefix's positives first, then its negatives
    assert [p.query for p in pairs] == [q0] * 4 + [q1] * 5
    assert [p.label for p in pairs][:2] == [1.0, 0.0]


def test_negatives_are_capped_and_exclude_every_gold_relation_of_the_prefix():
    # a second gold path with the same first hop: Paris -(~capital)-> France -(~borders)-> Germany
    rec = _record(answer=["Euro", "Germany"], a_entity=["Euro", "Germany"])
    assert gold_relation_paths(rec) == [("~capital", "currency"), ("~capital", "~borders")]
    pairs = mine_relation_pairs(rec, negatives=1)
    q1 = step_query_text(QUESTION, ["~capital"])
    at_q1 = [p for p in pairs if p.query == q1]
    assert {p.relation for p in at_q1 if p.label == 1.0} == {"currency", "inverse of borders"}
    negs = [p.relation for p in at_q1 if p.label == 0.0]
    assert len(negs) == 2  # one per positive at that prefix, sampled without replacement
    assert len(set(negs)) == 2 and set(negs) <= {"capital", "language", "borders"}
    # the first step's single positive gets exactly one negative
    assert sum(p.label == 0.0 for p in pairs if p.query == QUESTION) == 1


def test_seeded_sampling_is_deterministic():
    rec = _record()
    a = mine_relation_pairs(rec, negatives=2, rng=random.Random(7))
    b = mine_relation_pairs(rec, negatives=2, rng=random.Random(7))
    assert a == b
    assert mine_relation_pairs(rec, negatives=2) == mine_relation_pairs(rec, negatives=2)  # seeded by record id
    draws = {tuple(p.relation for p in mine_relation_pairs(rec, negatives=2, rng=random.Random(s))) for s in range(20)}
    assert len(draws) > 1


def test_question_without_a_path_gives_no_pairs():
    assert mine_relation_pairs(_record(a_entity=["Atlantis"])) == []
    assert mine_relation_pairs(_record(q_entity=["Nowhere"])) == []
    assert mine_relation_pairs(_record(), max_hops=1) == []
    assert [p.label for p in mine_relation_pairs(_record(), negatives=0)] == [1.0, 1.0]


@pytest.fixture
def pairs_dir(tmp_path) -> str:
    for split in ("train", "validation", "test"):
        rows = [_record(id=f"{split}-{i}") for i in range(3)] + [_record(id=f"{split}-none", a_entity=["Atlantis"])]
        text = "".join(json.dumps({k: getattr(r, k) for k in ("id", "question", "answer", "q_entity", "a_entity",
                                                                 "graph")}) + "\n" for r in rows)  # fmt: skip
        (tmp_path / f"{split}.jsonl").write_text(text)
    return str(tmp_path)


def test_datamodule_batches_and_logs(pairs_dir, caplog):
    dm = RelationPairDataModule(data_dir=pairs_dir, negatives=2, batch_size=4, max_records={"validation": 2})
    with caplog.at_level("INFO", logger="kglightning.datamodules.relation_pairs"):
        dm.setup("fit")
    assert "1 questions have no gold path" in caplog.text
    assert len(dm.split_pairs("train")) == 3 * (2 + 2 + 2)
    assert {p.question_id for p in dm.split_pairs("validation")} == {"validation-0", "validation-1"}
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"query", "relation", "label"}
    assert isinstance(batch["query"], list) and len(batch["relation"]) == 4
    assert batch["label"].dtype == torch.float32 and batch["label"].shape == (4,)
    # the shuffle is seeded: two data modules give the same first batch
    again = RelationPairDataModule(data_dir=pairs_dir, negatives=2, batch_size=4)
    assert next(iter(again.train_dataloader()))["query"] == batch["query"]
    # pairs do not depend on how many records are read
    capped = RelationPairDataModule(data_dir=pairs_dir, negatives=2, max_records={"train": 1})
    assert capped.split_pairs("train") == dm.split_pairs("train")[:6]


def test_whole_path_pairs_for_eq5():
    step_only = mine_relation_pairs(_record(), negatives=10)
    pairs = mine_relation_pairs(_record(), negatives=10, path_negatives=100)
    assert pairs[: len(step_only)] == step_only  # the step pairs are unchanged
    extra = pairs[len(step_only) :]
    assert all(p.query == QUESTION for p in extra)
    assert [(p.relation, p.label) for p in extra if p.label == 1.0] == [("inverse of capital -> currency", 1.0)]
    # negatives: every other 2-hop relation path from Paris (the walk never re-enters the topic entity)
    kg = KGIndex.from_record(_record())
    two_hop = {p for p in kg.relation_paths(["Paris"], 2) if len(p) == 2} - {("~capital", "currency")}
    assert {p.relation for p in extra if p.label == 0.0} == {path_text(p) for p in two_hop}
    capped = mine_relation_pairs(_record(), negatives=0, path_negatives=1)
    assert [p.label for p in capped] == [1.0, 1.0, 1.0, 0.0]
