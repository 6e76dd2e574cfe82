"""The served selection keeps its promise request by request: a stream simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kglightning.serve.guard import verdicts
from kglightning.serve.selection import ServedSelection


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
