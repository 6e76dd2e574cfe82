"""LLM-as-judge and SelfCheckGPT for answer nodes: lenient verdicts, sample shares, and the detector's test table."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest

from kglightning.data import SentenceEncoder
from kglightning.data.records import KGQARecord
from kglightning.datamodules import DetectionDataModule
from kglightning.llm.backends.base import Generation, GenerationParams, LLMBackend
from kglightning.llm.node_judges import LLMJudge, SelfCheck, parse_verdict
from kglightning.metrics.functional.qa import normalize
from kglightning.modules import HallucinationDetector

GRAPH = [("France", "location.country.capital", "Paris"), ("France", "location.country.second_city", "Lyon")]
RECORD = KGQARecord("q1", "What is the capital of France?", ["Paris"], ["France"], ["Paris"], GRAPH,
                    prediction=["Paris", "Lyon", "Nice"])  # fmt: skip


class Scripted(LLMBackend):
    """Answers a judge prompt from a table ``{(question, answer): reply}``; anything else gets ``"hmm"``."""

    def __init__(self, replies: dict[tuple[str, str], str]) -> None:
        self.replies, self.prompts = replies, []

    @property
    def name(self) -> str:
        return "scripted-judge"

    def _generate_uncached(self, batch, params, on_result):
        for i, messages in enumerate(batch):
            text = messages[-1]["content"]
            self.prompts.append(text)
            question = re.search(r"^Question: (.*)$", text, re.M).group(1)
            answer = re.search(r"^Proposed answer: (.*)$", text, re.M).group(1)
            on_result(i, Generation(text=self.replies.get((question, answer), "hmm")))


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("Yes", True),
        ("no.", False),
        ("The answer is Incorrect.", False),
        ("TRUE", True),
        ("not supported", False),
        ("unsupported claim", False),
        ("Nope", None),
        ("", None),
        ("yesterday", None),
        # negated positives (read as "supported" before)
        ("The proposed answer is not correct.", False),
        ("Not true", False),
        ("It isn't supported by the knowledge graph.", False),
        ("It isn\u2019t supported.", False),
        ("The answer is not entirely correct", False),
        ("That cannot be true", False),
        ("The right answer is Paris", None),
        ("Wrong.", False),
        ("No, the capital is Paris.", False),
        # both words: the first verdict decides
        ("Incorrect. The correct answer is Lyon.", False),
        ("Yes, it is not incorrect", True),
        ("Correct, and it is supported.", True),
        ("It is true.", True),
    ],  # fmt: skip
)
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) is verdict


def test_judge_scores_and_counts_malformed_verdicts():
    q = RECORD.question
    backend = Scripted({(q, "Paris"): "Yes, Paris is the capital.", (q, "Lyon"): "No"})
    judge = LLMJudge(backend, show_progress=False)
    assert judge.score([RECORD]) == [{"Paris": 0.0, "Lyon": 1.0, "Nice": 0.5}]
    assert judge.counts == {"answers": 3, "malformed": 1} and judge.name == "judge_g"
    assert "(France, location country capital, Paris)" in backend.prompts[0]


def test_richer_contexts_read_the_answerers_reasoning():
    rich = replace(RECORD, extra={"reasoning_summary": "France's capital is Paris.",
                                  "reasoning_triples": [["France", "capital", "Paris"]]})  # fmt: skip
    backend = Scripted({})
    judge = LLMJudge(backend, context="G+RS+RT", show_progress=False)
    judge.score([rich])
    assert "France's capital is Paris." in backend.prompts[0] and "(France, capital, Paris)" in backend.prompts[0]
    assert judge.name == "judge_g_rs_rt"
    with pytest.raises(KeyError, match="has no 'reasoning_summary'"):
        LLMJudge(backend, context="G+RS", show_progress=False).score([RECORD])
    with pytest.raises(ValueError, match="context"):
        LLMJudge(backend, context="RS")


class Resampler:
    """A proposer whose k-th sample (seed 1 + k) is fixed: Paris always, Lyon in 2 of 5, Nice never."""

    cache_key = "resampler"

    def __init__(self) -> None:
        self.generation = GenerationParams(max_new_tokens=8)

    def propose(self, records):
        k = self.generation.seed - 1
        assert self.generation.temperature == 1.0
        pred = ["paris"] + (["Lyon"] if k in (0, 3) else [])  # normalised names match: "paris" counts for "Paris"
        return [replace(r, prediction=pred) for r in records]


def test_selfcheck_is_the_share_of_samples_without_the_node():
    answerer = Resampler()
    check = SelfCheck(answerer, samples=5)  # type: ignore[arg-type]
    assert check.score([RECORD]) == [{"Paris": 0.0, "Lyon": 0.6, "Nice": 1.0}]
    assert answerer.generation.temperature == 0.0 and check.name == "selfcheck_n5"  # restored
    with pytest.raises(TypeError, match="GenerationParams"):
        SelfCheck(object())  # type: ignore[arg-type]


def test_the_detector_table_lists_the_llm_baselines(detection_dir, tiny_encoder_dir, tmp_path):
    replies = {}
    for line in (Path(detection_dir) / "test.jsonl").read_text().splitlines():
        r = json.loads(line)
        gold = {normalize(a) for a in [*r["answer"], *r["a_entity"]]}
        for p in r["prediction"]:
            replies[(r["question"], p)] = "no" if normalize(p) not in gold else "yes"  # an oracle judge
    judge = LLMJudge(Scripted(replies), show_progress=False)
    dm = DetectionDataModule(data_dir=detection_dir, encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
                             cache_dir=str(tmp_path / "cache"), batch_size=8, baselines=[judge])  # fmt: skip
    model = HallucinationDetector(text_dim=32, mlp_hidden=16)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, accelerator="cpu", enable_checkpointing=False)  # fmt: skip
    trainer.fit(model, dm)
    (metrics,) = trainer.test(model, dm, verbose=False)
    assert metrics["test/judge_g/f1"] == pytest.approx(1.0) and metrics["test/judge_g/auc_pr"] == pytest.approx(1.0)
    assert "test/f1" in metrics and "test/mostfrequent/f1" in metrics
    with pytest.raises(ValueError, match="distinct"):
        DetectionDataModule(data_dir=detection_dir, baselines=[judge, judge])
