"""DoublyCal's RL reward (Eq. 5, App. B.2) against hand-computed values, and inside trl.GRPOTrainer."""

from __future__ import annotations

import math

import pytest

from kglightning.evidence.rewards import EvidenceReward, evidence_items, gold_target, match_score, squash
from kglightning.evidence.schema import Evidence

GOLD = [
    {"items": ["a", "b"], "confidence": 0.6, "f1": 0.8},
    {"items": ["c"], "confidence": 0.9, "f1": 0.5},
]


def test_match_score_by_hand():
    # {a, c} vs {a, b}: Jaccard 1/3; [a, c] -> [a, b] is one substitution of two: 1/2
    assert match_score(["a", "c"], ["a", "b"]) == pytest.approx(0.5 * (1 / 3) + 0.5 * 0.5)
    assert match_score(["a", "c"], ["a", "b"], jaccard_weight=1.0) == pytest.approx(1 / 3)
    assert match_score(["a", "b", "c"], ["c", "b", "a"], jaccard_weight=0.0) == pytest.approx(1 / 3)  # 2 edits of 3
    assert match_score(["x"], ["a", "b"]) == 0.0
    with pytest.raises(ValueError):
        match_score(["a"], ["a"], jaccard_weight=1.5)


def test_reward_by_hand_takes_the_best_gold_evidence():
    reward = EvidenceReward()
    # vs GOLD[0]: m = 5/12, R_inf = 0.8 m = 1/3, c = 0.6 m = 0.25, R_cal = 1 - 2 |0.4 - 0.25| = 0.7
    #   R = 0.85 / 3 + 0.15 * 0.7 = 0.388333...
    # vs GOLD[1]: m = 0.5 (Jaccard 1/2, Levenshtein 1/2), R_inf = 0.25, c = 0.45, R_cal = 0.9, R = 0.3475
    assert reward.raw(["a", "c"], 0.4, GOLD) == pytest.approx(0.85 / 3 + 0.15 * 0.7)
    expected = 3 / (1 + math.exp(-2 * (0.85 / 3 + 0.15 * 0.7 - 0.5))) - 1
    got = reward(["<PATH confidence=0.4>a<SEP>c</PATH>"], gold_evidence=[GOLD])
    assert got == [pytest.approx(expected)] and got[0] == pytest.approx(0.3332, abs=1e-4)
    assert reward.raw(["a"], 0.5, []) == 0.0  # no gold evidence: R = 0


def test_calibration_term_moves_with_the_stated_confidence():
    reward = EvidenceReward()
    exact = reward(["<PATH confidence=0.6>a<SEP>b</PATH>"], gold_evidence=[GOLD])[0]
    off = reward(["<PATH confidence=0.1>a<SEP>b</PATH>"], gold_evidence=[GOLD])[0]
    # exact match: R = 0.85 * 0.8 + 0.15 * 1; stated 0.1: R_cal = 1 - 2 * 0.5 = 0
    assert exact == pytest.approx(squash(0.85 * 0.8 + 0.15))
    assert off == pytest.approx(squash(0.85 * 0.8))
    lenient = EvidenceReward(tolerance=0.5)(["<PATH confidence=0.1>a<SEP>b</PATH>"], gold_evidence=[GOLD])[0]
    assert lenient == pytest.approx(squash(0.85 * 0.8 + 0.15 * 0.75))


def test_invalid_outputs_get_the_penalty_and_are_counted():
    reward = EvidenceReward()
    bad = ["no tags", "<PATH>a</PATH>", "<PATH confidence=0.5></PATH>", "<PATH confidence=1.7>a</PATH>"]
    assert reward(bad, gold_evidence=[GOLD] * 4) == [-3.0] * 4
    assert reward.invalid == 4
    # conversational completions: the last message is the reply; the first well-formed block counts
    chat = [[{"role": "assistant", "content": "junk <PATH confidence=0.6>a<SEP>b</PATH><PATH confidence=0.9>c</PATH>"}]]
    assert reward(chat, gold_evidence=[GOLD]) == [pytest.approx(squash(0.85 * 0.8 + 0.15))]
    with pytest.raises(ValueError, match="gold_evidence"):
        reward(["x", "y"], gold_evidence=[GOLD])
    with pytest.raises(ValueError):
        EvidenceReward(weight=1.2)


def test_gold_target_from_mined_evidence_and_constraint_items():
    z = Evidence("Snoopy", ("sibling_of", "~r"), ("gender", "Male"), confidence=0.5, grounded=4, hits=2)
    target = gold_target(z, num_answers=2)  # precision 1/2, recall 1
    assert target == {"items": ["sibling_of", "~r", "gender=Male"], "confidence": 0.5, "f1": pytest.approx(2 / 3)}
    assert evidence_items(["r"]) == ["r"]
    with pytest.raises(ValueError, match="mined evidence"):
        gold_target(Evidence("Snoopy", ("r",)), num_answers=1)
    text = "<PATH confidence=0.5>sibling_of<SEP>~r<CONSTRAINT>gender<SEP>Male</CONSTRAINT></PATH>"
    assert EvidenceReward().raw(["sibling_of", "~r", "gender=Male"], 0.5, [target]) == pytest.approx(
        0.85 * (2 / 3) + 0.15 * 1.0
    )
    assert EvidenceReward()([text], gold_evidence=[[target]])[0] == pytest.approx(squash(0.85 * (2 / 3) + 0.15))


@pytest.mark.heavy
def test_one_grpo_step_in_trl(tiny_chat_model_dir, tmp_path, single_torch_thread):
    """The same reward runs inside one real trl.GRPOTrainer step on a tiny local model (no download, CPU).

    The random model writes no valid evidence, so every reward is the penalty; this checks the wiring (signature,
    the ``gold_evidence`` column, the logged name), not learning, which the GRPO module's tests will show."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    reward = EvidenceReward()
    data = Dataset.from_list(
        [{"prompt": f"Write the evidence for question {i}.", "gold_evidence": GOLD} for i in range(4)]
    )
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        learning_rate=1e-3,
        beta=0.01,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    trainer = GRPOTrainer(model=tiny_chat_model_dir, reward_funcs=[reward], args=args, train_dataset=data)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged and logged[0]["reward"] == pytest.approx(-3.0)  # a random model writes no valid <PATH>
    assert reward.invalid == 4  # one group of 4 completions, every one scored
    assert any(k.startswith("rewards/evidence_reward") for k in logged[0])
