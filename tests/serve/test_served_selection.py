"""The served selection keeps its promise request by request: a stream simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kglightning.serve.guard import verdicts
from kglightning.serve.selection import GROUPED, ServedSelection


def _questions(gen: torch.Generator, n: int) -> list[dict]:
    """Questions of 1 to 4 answers; a hallucinated answer's logit is shifted up by 1.5 (the detector is informative,
    not perfect); about a third of the answers are hallucinated."""
    rows = []
    for i in range(n):
        k = int(torch.randint(1, 5, (1,), generator=gen))
        wrong = (torch.rand(k, generator=gen) < 0.35).tolist()
        logits = (torch.randn(k, generator=gen) + 1.5 * torch.tensor(wrong, dtype=torch.float)).tolist()
        rows.append({"id": f"q{i}", "prediction": [f"a{j}" for j in range(k)], "hallucination_logit": logits,
                     "hallucinated": wrong, "grounding": ["exact"] * k})  # fmt: skip
    return rows


@pytest.mark.heavy
@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_a_stream_of_single_requests_keeps_the_question_rules_promise(tmp_path: Path, alpha: float):
    """Calibrate on 100 questions, then serve 200 questions one request at a time, 300 times over fresh draws: the
    share of served questions that keep a hallucinated answer stays at alpha or under (the promise is marginal over
    calibration and test draws), and the rule keeps something (it is not vacuous)."""
    gen = torch.Generator().manual_seed(int(alpha * 1000))
    violations, kept, served = 0, 0, 0
    for rep in range(300):
        path = tmp_path / f"cal{rep}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _questions(gen, 100)))
        selection = ServedSelection(path, alpha=alpha, group_by="none", digest="sha256:test")
        for row in _questions(gen, 200):
            keep = [selection.keeps(s, g) for s, g in zip(row["hallucination_logit"], row["grounding"])]
            violations += any(k and w for k, w in zip(keep, row["hallucinated"]))
            kept += sum(keep)
            served += 1
    rate = violations / served
    se = (alpha * (1 - alpha) / 300) ** 0.5  # the spread of the per-calibration coverage dominates
    assert rate <= alpha + 3 * se, (rate, alpha)
    assert rate >= alpha - 0.05 and kept > 0  # close to the level: the cut is not needlessly strict


def test_the_response_keeps_by_the_selection_and_names_it(tmp_path: Path):
    path = tmp_path / "cal.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _questions(torch.Generator().manual_seed(0), 60)))
    selection = ServedSelection(path, alpha=0.2, group_by="grounding", digest="sha256:cal")
    cut = selection.cuts["exact"]
    row = {"id": "r", "prediction": ["low", "high", "loose"], "hallucination_prob": [0.1, 0.9, 0.5],
           "hallucination_logit": [cut - 1, cut + 1, -5.0], "grounding": ["exact", "exact", "ungrounded"],
           "prediction_entries": [[0], [1], [2]], "flagged": ["high"], "threshold": 0.5, "ungrounded_threshold": 0.5}  # fmt: skip
    got = verdicts("r", ["low", "high", "loose"], row, 0.5, 0.5, "sha256:ckpt", selection)
    # the ungrounded group had no calibration answers: it keeps nothing, whatever its score
    assert [v["kept"] for v in got["answers"]] == [True, False, False] and got["abstained"] is False
    assert got["selection"]["rule"] == "question" and got["selection"]["calibration"] == "sha256:cal"
    assert verdicts("r", ["low"], None, 0.5, 0.5, "c", selection)["not_scored"][0]["reason"] == "ungrounded_dropped"


def _kept_share(rows: list[dict], kept: list[list[bool]]) -> float:
    """The hallucinated share of the kept answers, each answer weighing one (0 when nothing is kept)."""
    picked = [w for row, keep in zip(rows, kept) for w, k in zip(row["hallucinated"], keep) if k]
    return sum(picked) / len(picked) if picked else 0.0


@pytest.mark.heavy
@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_a_stream_of_batches_keeps_the_top_rules_promise(tmp_path: Path, alpha: float):
    """Calibrate on 100 questions, then serve batches of 50 questions, 300 times over fresh draws: the mean share of
    hallucinated answers among those kept (the FDR) stays at alpha or under, at most one answer is kept per question,
    and the rule keeps something."""
    gen = torch.Generator().manual_seed(int(alpha * 1000) + 1)
    shares, kept_total = [], 0
    for rep in range(300):
        path = tmp_path / f"cal{rep}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _questions(gen, 100)))
        selection = ServedSelection(path, alpha=alpha, group_by="none", digest="sha256:test")
        batch = _questions(gen, 50)
        kept, described = selection.select_batch(batch, "top", [r["id"] for r in batch])
        assert all(sum(k) <= 1 for k in kept) and described["rule"] == "top" and "promise" in described
        shares.append(_kept_share(batch, kept))
        kept_total += sum(map(sum, kept))
    mean = sum(shares) / len(shares)
    spread = (sum((s - mean) ** 2 for s in shares) / (len(shares) - 1)) ** 0.5
    assert mean <= alpha + 3 * spread / len(shares) ** 0.5, (mean, alpha)
    assert kept_total > 300 * 5  # about a fifth of the questions keep their best answer or more


def _kept_rate(rows: list[dict], kept: list[list[bool]]) -> float:
    """What kept_rate bounds, over these questions: each question weighs one, spread over its m answers, so the rate
    is sum(hallucinated kept / m) / sum(kept / m) (0 when nothing is kept)."""
    num = sum(sum(w and k for w, k in zip(r["hallucinated"], keep)) / len(keep) for r, keep in zip(rows, kept) if keep)
    den = sum(sum(keep) / len(keep) for keep in kept if keep)
    return num / den if den else 0.0


@pytest.mark.heavy
def test_a_stream_of_batches_keeps_the_kept_rate_rules_promise(tmp_path: Path):
    """kept_rate at alpha 0.2, delta 0.2: over 200 fresh calibrations, the rate the rule bounds, measured on a large
    batch (400 questions: close to the rate over all questions drawn alike), exceeds alpha in at most about a delta
    share of them, and the rule keeps something. (A small batch's own share scatters more around that rate: the
    promise is the rate's, as the response says.)"""
    alpha, delta, reps = 0.2, 0.2, 200
    gen = torch.Generator().manual_seed(7)
    over, kept_total = 0, 0
    for rep in range(reps):
        path = tmp_path / f"cal{rep}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _questions(gen, 300)))
        selection = ServedSelection(path, alpha=alpha, group_by="none", digest="sha256:test", delta=delta)
        batch = _questions(gen, 400)
        kept, described = selection.select_batch(batch, "kept_rate")
        assert described["delta"] == delta and "in expectation" in described["promise"]
        over += _kept_rate(batch, kept) > alpha
        kept_total += sum(map(sum, kept))
    se = (delta * (1 - delta) / reps) ** 0.5
    assert over / reps <= delta + 3 * se, over / reps
    assert kept_total > 0


def test_a_batch_keeps_what_the_rules_keep(tmp_path: Path):
    """The batch's question rule keeps what single requests keep; top keeps one answer at most per question, what
    AnswerSelector keeps over the same scores and ids; a question with nothing scored keeps nothing; ids must be
    distinct."""
    from kglightning.conformal.scored import ScoredAnswers
    from kglightning.conformal.selection import AnswerSelector

    gen = torch.Generator().manual_seed(3)
    path = tmp_path / "cal.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _questions(gen, 80)))
    selection = ServedSelection(path, alpha=0.2, group_by="none", digest="sha256:cal")
    batch = _questions(gen, 40)
    single, _ = selection.select_batch([*batch, None], "question")
    assert single[:-1] == [[selection.keeps(s, "exact") for s in r["hallucination_logit"]] for r in batch]
    assert single[-1] == []
    ids = [f"mine-{i}" for i in range(40)]
    top, described = selection.select_batch(batch, "top", ids)
    assert (
        all(sum(k) <= 1 for k in top)
        and any(map(any, top))
        and described["groups"]["all"]["answers"] == sum(len(r["prediction"]) for r in batch)
    )
    scores = torch.tensor([s for r in batch for s in r["hallucination_logit"]], dtype=torch.float64)
    question = torch.tensor([i for i, r in enumerate(batch) for _ in r["prediction"]])
    keys = [f"{q}#{j}" for q, r in zip(ids, batch) for j in range(len(r["prediction"]))]
    expected = AnswerSelector("top", alpha=0.2).select(selection._calibration, ScoredAnswers(scores, question, keys=keys),
                                                       check_lengths=False)  # fmt: skip
    assert [k for keep in top for k in keep] == expected.keep.tolist()
    with pytest.raises(ValueError, match="distinct"):
        selection.select_batch(batch, "top", ["same"] * 40)


def test_grouped_rules_say_their_promise_is_per_kind(tmp_path: Path):
    """With group_by grounding, top keeps at most one answer per question and kind (so up to one of each kind), and
    the response's promise says so."""
    gen = torch.Generator().manual_seed(5)
    rows = _questions(gen, 120)
    for i, r in enumerate(rows):  # two kinds, each answer's kind at random
        r["grounding"] = ["exact" if (i + j) % 2 else "near_miss" for j in range(len(r["prediction"]))]
    path = tmp_path / "cal.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:80]))
    selection = ServedSelection(path, alpha=0.3, group_by="grounding", digest="sha256:cal")
    batch = rows[80:]
    for rule in ("top", "question", "kept_rate"):
        kept, described = selection.select_batch(batch, rule)
        assert described["promise"].endswith(GROUPED), (rule, described["promise"])
        if rule == "top":
            for r, keep in zip(batch, kept):
                kinds = [g for g, k in zip(r["grounding"], keep) if k]
                assert len(kinds) == len(set(kinds))
