"""SGIC's scores (Eq. 1-3) against hand-computed values and against a tiny model's own token probabilities."""

from __future__ import annotations

import math

import pytest
import torch

from kglightning.llm.backends.base import Generation
from kglightning.llm.uncertainty import (
    GeometricMeanProb,
    MaxProbProduct,
    MissingLogprobsError,
    answer_uncertainty,
    document_uncertainty,
)


def test_answer_uncertainty_eq2_both_branches():
    # below the mean: s_hat = (s - m) / m; above: (s - m) / (1 - m); uncertainty = 100 * (0.5 - 0.5 * s_hat)
    assert answer_uncertainty(0.1, 0.4) == pytest.approx(100 * (0.5 - 0.5 * (0.1 - 0.4) / 0.4))  # 87.5
    assert answer_uncertainty(0.7, 0.4) == pytest.approx(100 * (0.5 - 0.5 * (0.7 - 0.4) / 0.6))  # 25.0
    assert answer_uncertainty(0.4, 0.4) == 50.0
    assert answer_uncertainty(0.0, 0.9) == 100.0 and answer_uncertainty(1.0, 0.9) == 0.0
    # monotone: a more confident answer is never more uncertain
    values = [answer_uncertainty(c / 20, 0.3) for c in range(21)]
    assert values == sorted(values, reverse=True)


def test_answer_uncertainty_rejects_bad_values():
    with pytest.raises(ValueError, match="confidence"):
        answer_uncertainty(1.2, 0.5)
    with pytest.raises(ValueError, match="mean"):
        answer_uncertainty(0.5, 0.0)


def test_document_uncertainty_eq3():
    # 1 - [0.8, 0.2, 0.5] = [0.2, 0.8, 0.5] -> min-max to 0..100
    assert document_uncertainty([0.8, 0.2, 0.5]) == [0.0, 100.0, 50.0]
    assert document_uncertainty([0.3, 0.3]) == [0.0, 0.0]
    assert document_uncertainty([]) == []


def test_estimators_and_missing_logprobs():
    gen = Generation("x", token_logprobs=[math.log(0.5), math.log(0.8)], tokens=["a", "b"])
    assert MaxProbProduct()(gen) == pytest.approx(0.4)
    assert GeometricMeanProb()(gen) == pytest.approx(math.sqrt(0.4))
    assert MaxProbProduct()(Generation("", token_logprobs=[])) == 0.0
    with pytest.raises(MissingLogprobsError, match="backend 'remote'.*log-probabilities"):
        MaxProbProduct()(Generation("x"), backend="backend 'remote'")


def test_max_prob_product_matches_the_tiny_models_own_probabilities(tiny_chat_model_dir, single_torch_thread):
    """Eq. 1 on a greedy generation equals the product of max softmax probabilities from a plain forward pass."""
    from kglightning.llm.backends.local_hf import LocalHFBackend

    backend = LocalHFBackend(tiny_chat_model_dir, batch_size=2, show_progress=False)
    messages = [{"role": "user", "content": "what is the capital of France?"}]
    gen = backend.generate([messages], max_new_tokens=6, logprobs=True)[0]
    assert gen.token_logprobs and len(gen.token_logprobs) == gen.completion_tokens
    tok, model = backend.tokenizer, backend.model
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    expected = 1.0
    with torch.no_grad():
        for _ in range(gen.completion_tokens):
            probs = torch.softmax(model(ids).logits[0, -1].double(), -1)
            expected *= float(probs.max())
            ids = torch.cat([ids, probs.argmax().view(1, 1)], dim=1)
    assert MaxProbProduct()(gen) == pytest.approx(expected, rel=1e-4)
