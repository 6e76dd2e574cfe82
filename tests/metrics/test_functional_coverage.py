"""Empirical coverage and set size, for string sets and membership tensors."""

import math

import pytest
import torch

from kglightning.metrics.functional.coverage import average_set_size, covered, set_coverage, set_sizes

PRED = [{"Paris", "Lyon"}, {"Rome"}, {"Oslo", "Nice", "Bern"}, set()]
GOLD = [["Paris", "Nice"], ["Oslo"], ["Oslo", "Nice"], ["Paris"]]


def test_string_sets():
    assert covered(PRED, GOLD).tolist() == [True, False, True, False]
    assert covered(PRED, GOLD, mode="all").tolist() == [False, False, True, False]
    assert set_coverage(PRED, GOLD).item() == 0.5
    assert set_coverage(PRED, GOLD, mode="all").item() == 0.25
    assert set_sizes(PRED).tolist() == [2, 1, 3, 0]
    assert average_set_size(PRED).item() == 1.5
    assert set_sizes([["a", "a", "b"]]).tolist() == [2]  # distinct members


def test_normalized_strings():
    assert not covered([{"the Paris"}], [["paris"]]).item()
    assert covered([{"the Paris"}], [["paris"]], normalized=True).item()


def test_tensor_sets_match_string_sets():
    cands = ["Paris", "Lyon", "Rome", "Oslo", "Nice", "Bern"]
    pred = torch.tensor([[c in s for c in cands] for s in PRED])
    gold = torch.tensor([[c in g for c in cands] for g in GOLD])
    for mode in ("any", "all"):
        assert covered(pred, gold, mode).tolist() == covered(PRED, GOLD, mode).tolist()
    assert average_set_size(pred).item() == 1.5
    assert set_coverage(pred.long(), gold.long()).item() == 0.5  # 0/1 ints work too


def test_no_gold_and_empty_and_errors():
    assert covered([{"a"}], [[]]).tolist() == [False]  # "any": nothing to cover
    assert covered([{"a"}], [[]], mode="all").tolist() == [True]  # "all": vacuously covered
    assert math.isnan(set_coverage([], []).item())
    assert math.isnan(average_set_size([]).item())
    with pytest.raises(ValueError, match="mode"):
        covered(PRED, GOLD, mode="some")
    with pytest.raises(ValueError):
        covered(PRED, GOLD[:2])
    with pytest.raises(ValueError, match="shape"):
        covered(torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(TypeError):
        covered(["Paris"], [["Paris"]])
