"""CLM and LoFreeCP on sampled answers: hand-computed scores and sets, exact thresholds, and coverage over many
seeded splits of a synthetic task (mean coverage >= 1 - alpha - 0.01, or a counted abstention)."""

from __future__ import annotations

import math
import random

import pytest

from kglightning.conformal.clm import CLM, CLMConfig, clm_set
from kglightning.conformal.lofree import LoFreeCP, normalized_entropy
from kglightning.conformal.sampling import SampledAnswers, evaluate_sets, set_covers


def _task(n: int, seed: int, m: int = 10) -> list[SampledAnswers]:
    """Questions whose gold answer has a random sampling probability (sometimes ~0: never sampled), with
    distractors; quality = the noisy probability of the sampled answer (as a sequence likelihood would be)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p_gold = rng.choice([0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0])  # 10% never sampled
        rest = [(1 - p_gold) * w for w in (0.5, 0.3, 0.2)]
        names, probs = ["gold", "d1", "d2", "d3"], [p_gold, *rest]
        samples = tuple(rng.choices(names, probs, k=m))
        quality = tuple(min(1.0, max(0.0, probs[names.index(s)] + rng.gauss(0, 0.1))) for s in samples)
        out.append(SampledAnswers(samples, frozenset({"gold"}), quality, id=f"q{i}"))
    return out


def test_lofree_scores_by_hand():
    q = SampledAnswers(("a", "a", "b", "", "c", "a"), frozenset({"b"}), id="q")
    ne = normalized_entropy(q)  # outcomes a 3/6, b, c, no-answer 1/6 each, over log 6
    h = -(0.5 * math.log(0.5) + 3 * (1 / 6) * math.log(1 / 6))
    assert ne == pytest.approx(h / math.log(6))
    sim = {("b", "a"): 0.8, ("c", "a"): 0.1}
    cp = LoFreeCP(2.0, 0.5, similarity=lambda x, y: sim[(x, y)])
    scores = cp.scores(q)
    assert list(scores) == ["a", "b", "c"]
    assert scores["a"] == pytest.approx(-0.5 + 2 * ne)  # no similarity term for the top answer
    assert scores["b"] == pytest.approx(-1 / 6 + 2 * ne - 0.5 * 0.8)
    assert scores["c"] == pytest.approx(-1 / 6 + 2 * ne - 0.5 * 0.1)
    assert cp.calibration_score(q) == pytest.approx(scores["b"])
    assert cp.calibration_score(SampledAnswers(("a",), frozenset({"z"}))) == math.inf  # never sampled


def test_lofree_threshold_is_the_exact_quantile():
    cal = [SampledAnswers(("g",) * k + ("x",) * (10 - k), frozenset({"g"})) for k in range(1, 10)]  # n = 9
    cp = LoFreeCP(0.0, 0.0).fit(cal, alpha=0.2)  # rank ceil(10 * 0.8) = 8 of the scores -k/10
    assert cp.qhat == pytest.approx(-0.2)
    test = SampledAnswers(("g", "g", "x", "x", "x", "x", "x", "x", "x", "x"), frozenset({"g"}))  # g: -0.2, x: -0.8
    assert cp.member(test) == {"g", "x"}
    assert LoFreeCP(0.0, 0.0).fit(cal, alpha=0.05).abstained  # rank 10 > 9


@pytest.mark.parametrize("alpha", [0.2, 0.3])
def test_lofree_coverage_over_seeded_splits(alpha):
    covered, total, abstained = 0, 0, 0
    for seed in range(60):
        questions = _task(300, seed)
        tuning, cal, test = questions[:100], questions[100:200], questions[200:]
        cp = LoFreeCP.tune(tuning, alpha, (0.0, 1.0), (0.0, 1.0)).fit(cal, alpha)
        abstained += cp.abstained
        covered += sum(set_covers(cp.member(q), q.gold) for q in test)
        total += len(test)
    assert abstained == 0
    assert covered / total >= 1 - alpha - 0.01


def test_clm_sets_by_hand():
    q = SampledAnswers(("a", "b", "a", "c", "d"), frozenset({"c"}), quality=(0.9, 0.2, 0.9, 0.6, 0.7))
    assert clm_set(q, CLMConfig(0.5, math.inf, math.inf)) == ({"a", "c", "d"}, 5)
    assert clm_set(q, CLMConfig(0.5, math.inf, 2), "count") == ({"a", "c"}, 4)
    assert clm_set(q, CLMConfig(0.0, math.inf, 0.9), "max") == ({"a"}, 1)
    near = {frozenset({"d", "c"}): 0.95}
    sim = lambda x, y: near.get(frozenset({x, y}), 0.0)  # noqa: E731
    assert clm_set(q, CLMConfig(0.5, 0.9, math.inf), similarity=sim) == ({"a", "c"}, 5)  # d too close to c


def test_clm_grid_outcomes_with_precomputed_similarities_equal_direct_calls():
    calls = []

    def sim(x: str, y: str) -> float:  # a graded similarity: shared characters
        calls.append((x, y))
        return len(set(x) & set(y)) / len(set(x) | set(y))

    rng = random.Random(0)
    words = ["ab", "abc", "bcd", "xyz", "xy", "abd"]
    questions = [
        SampledAnswers(
            tuple(rng.choice(words) for _ in range(6)),
            frozenset({"abc"}),
            tuple(rng.random() for _ in range(6)),
            id=str(i),
        )  # fmt: skip
        for i in range(12)
    ]
    clm = CLM(similarity=sim, similarity_grid=(0.3, 0.6, math.inf), grid_size=3)
    grid = clm.make_grid(questions)
    losses, sizes = clm._outcomes(questions, grid)
    assert len(calls) <= 12 * 15  # m(m-1)/2 per question, not per configuration too
    for j, config in enumerate(grid):
        for i, q in enumerate(questions):
            members, _ = clm_set(q, config, clm.set_confidence, sim)
            assert sizes[j, i] == len(members)
            assert losses[j, i] == (0.0 if set_covers(members, q.gold, "any") else 1.0)


def test_clm_abstains_when_no_configuration_is_certified():
    never = [SampledAnswers(("x", "y"), frozenset({"gold"}), id=str(i)) for i in range(40)]
    clm = CLM(delta=0.1, grid_size=3).fit(never[:20], never[20:], alpha=0.1)
    assert clm.abstained and clm.summary()["valid_configs"] == 0
    assert clm.member(never[0]) == {"x", "y"}


@pytest.mark.heavy
@pytest.mark.parametrize("alpha", [0.2, 0.3])
def test_clm_coverage_over_seeded_splits(alpha):
    covered, total, abstained, sizes = 0, 0, 0, []
    for seed in range(15):
        questions = _task(400, 1000 + seed)
        cal, sel, test = questions[:150], questions[150:250], questions[250:]
        clm = CLM(delta=0.1, set_confidence="max", grid_size=5).fit(cal, sel, alpha)
        abstained += clm.abstained
        result = evaluate_sets(test, [clm.member(q) for q in test])
        covered += result["ecr"] * len(test)
        total += len(test)
        sizes.append(result["apss"])
    assert abstained == 0
    assert covered / total >= 1 - alpha - 0.01
    assert sum(sizes) / len(sizes) < 4  # smaller than every sampled answer: the rules do something


def test_llm_score_split_cp_and_top_k():
    from kglightning.conformal.sample_cp import SampleSplitCP, SampleTopK

    # gold frequency k/10 for k = 1..9 (n = 9); split CP's rank ceil(10 * 0.8) = 8 of 1 - k/10 -> qhat 0.8
    cal = [SampledAnswers(("g",) * k + ("x",) * (10 - k), frozenset({"g"})) for k in range(1, 10)]
    cp = SampleSplitCP().fit(cal, alpha=0.2)
    assert cp.qhat == pytest.approx(0.8) and not cp.abstained
    assert cp.member(SampledAnswers(("g",) * 3 + ("x",) * 7, frozenset({"g"}))) == {"g", "x"}
    assert cp.member(SampledAnswers(("g",) * 1 + ("x",) * 9, frozenset({"g"}))) == {"x"}  # 1 - 0.1 > 0.8
    assert SampleSplitCP().fit(cal, alpha=0.05).abstained
    # the gold is ranked first for k >= 6 (5 of 9 questions), second otherwise (k = 5 ties: sampled first wins)
    top = SampleTopK().fit(cal, alpha=0.5)  # ceil(0.5 * 9) = 5 questions must be covered: K = 1
    assert top.k == 1 and top.member(cal[0]) == {"x"}
    assert SampleTopK().fit(cal, alpha=0.2).k == 2
    assert SampleTopK().fit([SampledAnswers(("x",), frozenset({"g"}))] * 3, alpha=0.2).abstained
    q = SampledAnswers(("a", "b", "a"), frozenset({"b"}), quality=(0.2, 0.9, 0.3))
    assert SampleTopK("likelihood").fit([q] * 4, alpha=0.2).k == 1  # b is the likeliest


@pytest.mark.parametrize("rank_by", ["frequency", "likelihood"])
def test_llm_score_split_cp_coverage_over_seeded_splits(rank_by):
    from kglightning.conformal.sample_cp import SampleSplitCP

    covered = total = 0
    for seed in range(60):
        questions = _task(200, 500 + seed)
        cp = SampleSplitCP(rank_by).fit(questions[:100], 0.2)
        assert not cp.abstained
        covered += sum(set_covers(cp.member(q), q.gold) for q in questions[100:])
        total += 100
    assert covered / total >= 0.8 - 0.01
