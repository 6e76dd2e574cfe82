"""Beta-Bernoulli confidence (DoublyCal Eq. 4), including the paper's Snoopy numbers."""

import numpy as np
import pytest

from kglightning.evidence import (
    JEFFREYS_ALPHA,
    JEFFREYS_BETA,
    beta_bernoulli_confidence,
    beta_bernoulli_confidences,
    set_confidence,
)


def test_jeffreys_default():
    assert JEFFREYS_ALPHA == JEFFREYS_BETA == 0.5
    assert beta_bernoulli_confidence(0, 0) == 0.5  # no candidates: the prior mean
    assert beta_bernoulli_confidence(3, 3) == pytest.approx(3.5 / 4)
    assert beta_bernoulli_confidence(0, 4) == pytest.approx(0.5 / 5)


def test_snoopy_numbers_exact():
    # z3 = SiblingOf(Snoopy, â) grounds {Spike, Belle}; z2 = z3 ∧ Gender(â, Male) grounds {Spike}; A = {Spike}
    assert set_confidence({"Spike", "Belle"}, {"Spike"}) == 0.5
    assert set_confidence({"Spike"}, {"Spike"}) == 0.75


def test_custom_prior_and_vectorized_agree():
    hits, grounded = np.array([0, 1, 2, 5]), np.array([0, 3, 2, 9])
    vec = beta_bernoulli_confidences(hits, grounded, alpha=1.0, beta=2.0)
    scalar = [beta_bernoulli_confidence(h, g, alpha=1.0, beta=2.0) for h, g in zip(hits.tolist(), grounded.tolist())]
    assert vec.tolist() == pytest.approx(scalar)
    assert scalar[0] == pytest.approx(1 / 3)


@pytest.mark.parametrize("hits, grounded", [(2, 1), (-1, 0)])
def test_bad_counts(hits, grounded):
    with pytest.raises(ValueError):
        beta_bernoulli_confidence(hits, grounded)


@pytest.mark.parametrize("alpha, beta", [(0.0, 0.5), (0.5, -1.0)])
def test_bad_prior(alpha, beta):
    with pytest.raises(ValueError):
        beta_bernoulli_confidence(0, 0, alpha, beta)
    with pytest.raises(ValueError):
        beta_bernoulli_confidences(np.array([0]), np.array([0]), alpha, beta)


def test_set_confidence_counts_duplicates_once():
    assert set_confidence(["a", "a", "b"], ["a"]) == set_confidence({"a", "b"}, {"a"})
