"""StructuralBaseline: logistic regression on per-answer structural counts, fitted on the training split."""

from __future__ import annotations

import random

import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from kglightning.baselines import StructuralBaseline
from kglightning.baselines.structural import structural_features
from kglightning.data.records import KGQARecord
from kglightning.metrics.functional.qa import normalize


def _records(n: int, seed: int) -> list[KGQARecord]:
    """Right answers are one hop from the topic; wrong ones are two hops away or name no node."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t, a, far = f"T{i}", f"A{i}", f"F{i}"
        graph = [(t, "r", a), (a, "s", far), (far, "u", f"G{i}")]
        wrong = far if rng.random() < 0.5 else f"made up {i}"
        preds = [a, wrong] if rng.random() < 0.5 else [wrong, a]
        out.append(KGQARecord(f"q{i}", f"question {i}?", [a], [t], [a], graph, prediction=preds))
    return out


def test_fitted_on_train_it_separates_test_answers():
    baseline = StructuralBaseline().fit(_records(40, 0))
    test = _records(20, 1)
    scores = baseline.score(test)
    probs, labels = [], []
    for r, s in zip(test, scores):
        assert set(s) == set(r.prediction)
        for answer, p in s.items():
            probs.append(p)
            labels.append(int(normalize(answer) not in {normalize(x) for x in r.answer}))
    assert binary_auroc(torch.tensor(probs), torch.tensor(labels)).item() > 0.95
    assert all(0.0 <= p <= 1.0 for p in probs)


def test_it_must_be_fitted_and_abstentions_are_not_scored():
    with pytest.raises(RuntimeError, match="before fit"):
        StructuralBaseline().score(_records(1, 0))
    r = KGQARecord("q", "?", ["X"], ["T"], ["X"], [("T", "r", "X")], prediction=["unknown", "X", "X"])
    assert list(structural_features(r)) == ["X"]
    with pytest.raises(ValueError, match="no proposed answer"):
        StructuralBaseline().fit([KGQARecord("q", "?", ["X"], ["T"], ["X"], [], prediction=[])])
