"""KG-Guard refinement loop: control logic with a scripted LLM and a real (hand-wired) detector, the Lightning and
CLI runs with the tiny chat model, and the errors on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch

from kglightning.data import SentenceEncoder
from kglightning.data.records import KGQARecord
from kglightning.datamodules import KGQADataModule
from kglightning.evaluate import evaluate_predictions
from kglightning.llm.backends import Generation, GenerationParams, LLMBackend, LocalHFBackend
from kglightning.modules import HallucinationDetector
from kglightning.nn import GATEncoder, GraphTransformerEncoder
from kglightning.pipelines.refinement import KGGuardRefinement
from kglightning.pipelines.refinement_prompts import FLAGGED_PROMPT, UNMATCHED_PROMPT
from kglightning.pipelines.refinement_report import summarize

ROOT = Path(__file__).resolve().parents[2]
TINY_ENCODER = partial(GraphTransformerEncoder, hidden_channels=16, heads=4)


def topic_echo_detector_ckpt(path: Path, text_dim: int = 32) -> str:
    """A real HallucinationDetector wired by hand to flag exactly the answer nodes that are topic entities.

    Every weight is zero except: the topic mark feeds hidden unit 0 through the input projection (the attention
    layers output zero, LayerNorm keeps its unit scale), and the head reads that unit: logit ``10 * h0 - 5``. A
    topic node gets ``h0 = sqrt(15)`` (probability ~1), any other node ``h0 = 0`` (probability ~0.007).
    """
    det = HallucinationDetector(text_dim=text_dim, encoder=TINY_ENCODER, mark_dim=4, mlp_hidden=8, dropout=0.0)
    net = det.net
    with torch.no_grad():
        for p in det.parameters():
            p.zero_()
        for norm in net.encoder.norms:
            norm.weight.fill_(1.0)
        net.topic_mark.weight[1, 0] = 1.0
        net.encoder.input_proj.weight[0, text_dim] = 1.0  # node features: [text | topic mark | answer mark]
        net.head[0].weight[0, 0] = 1.0
        net.head[3].weight[0, 0] = 10.0
        net.head[3].bias.fill_(-5.0)
    det.threshold.fill_(0.5)
    ckpt = {
        "state_dict": det.state_dict(),
        "hyper_parameters": dict(det.hparams),
        "pytorch-lightning_version": L.__version__,
    }
    torch.save(ckpt, path)
    return str(path)


class ScriptedLLM(LLMBackend):
    """Answers by question and round (the number of assistant turns in the chat); records every batch."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        self.script = script
        self.calls: list[list[list[dict]]] = []

    @property
    def name(self) -> str:
        return "scripted"

    def _generate_uncached(self, batch, params, on_result) -> None:
        self.calls.append([list(m) for m in batch])
        for i, messages in enumerate(batch):
            question = next(q for q in self.script if f"Question: {q}\n" in messages[1]["content"])
            replies = self.script[question]
            step = sum(m["role"] == "assistant" for m in messages)
            on_result(i, Generation(text=replies[min(step, len(replies) - 1)]))


CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima", "Spain": "Madrid", "Kenya": "Nairobi"}
GRAPH = [[c, "location.country.capital", cap] for c, cap in CAPITALS.items()]
GRAPH += [["France", "location.country.currency_used", "Euro"], ["Japan", "location.country.currency_used", "Yen"]]
SCRIPT = {
    "what is the capital of France?": ['{"Paris": 0.9}'],  # right at once: resolved at step 0
    "what is the capital of Japan?": ['{"Japan": 0.8}', '{"Tokyo": 0.9}'],  # topic echoed, fixed in round 1
    "what is the capital of Peru?": ['{"Peru": 0.7}'],  # never fixed: reaches the cap
    "what is the capital of Spain?": ["I don't know."],  # abstention
    "what is the capital of Kenya?": ['{"Atlantis": 0.5}', '{"Nairobi": 0.9}'],  # not in the KG, then fixed
}


def _records() -> list[KGQARecord]:
    return [
        KGQARecord.from_dict(
            {
                "id": country,
                "question": f"what is the capital of {country}?",
                "answer": [capital],
                "q_entity": [country],
                "a_entity": [capital],
                "graph": GRAPH,
            }
        )
        for country, capital in CAPITALS.items()
    ]


@pytest.fixture
def detector_ckpt(tmp_path) -> str:
    return topic_echo_detector_ckpt(tmp_path / "detector.ckpt")


def _module(detector_ckpt, tiny_encoder_dir, tmp_path, reasoner, **kwargs) -> KGGuardRefinement:
    return KGGuardRefinement(
        detector_ckpt=detector_ckpt,
        reasoner=reasoner,
        encoder=TINY_ENCODER,
        text_encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
        cache_dir=str(tmp_path / "cache"),
        output_dir=str(tmp_path / "out"),
        **kwargs,
    )


def test_loop_reprompts_flagged_resolves_clean_and_stops_at_the_cap(detector_ckpt, tiny_encoder_dir, tmp_path):
    llm = ScriptedLLM(SCRIPT)
    module = _module(detector_ckpt, tiny_encoder_dir, tmp_path, llm, max_rounds=3, max_triples=3)
    rows = {r["id"]: r for r in module.refine(_records())}

    # one batched call per round, for the questions still active: all 5, then Japan/Peru/Kenya, then Peru twice
    assert [len(batch) for batch in llm.calls] == [5, 3, 1, 1]
    first = llm.calls[0][0]
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1]["content"].count("\n(") == 3  # the 3 triples most similar to the question
    japan, peru, kenya = llm.calls[1]
    # the chat: system, question + triples, the most recent response, the follow-up with the flagged names
    assert [m["role"] for m in japan] == ["system", "user", "assistant", "user"]
    assert japan[:2] == llm.calls[0][1] and japan[2]["content"] == '{"Japan": 0.8}'
    assert FLAGGED_PROMPT in japan[3]["content"] and '"Japan"' in japan[3]["content"]
    assert UNMATCHED_PROMPT in kenya[3]["content"] and '"Atlantis"' in kenya[3]["content"]
    assert FLAGGED_PROMPT not in kenya[3]["content"]
    assert len(llm.calls[3][0]) == 4 and llm.calls[3][0][2]["content"] == '{"Peru": 0.7}'

    assert rows["France"]["iterations"] == 0 and rows["France"]["prediction"] == ["Paris"]
    assert rows["France"]["confidence"] == [0.9] and rows["France"]["rounds"][0]["scores"]["Paris"] < 0.5
    assert rows["Japan"]["rounds"][0]["scores"]["Japan"] > 0.5 and rows["Japan"]["rounds"][0]["flagged"] == ["Japan"]
    assert rows["Japan"]["iterations"] == 1 and rows["Japan"]["prediction"] == ["Tokyo"] and rows["Japan"]["resolved"]
    assert rows["Peru"]["iterations"] == 3 and not rows["Peru"]["resolved"] and len(rows["Peru"]["rounds"]) == 4
    assert rows["Peru"]["flagged"] == ["Peru"]  # the capped answer is still flagged after the last round
    assert rows["Spain"]["iterations"] == 0 and rows["Spain"]["prediction"] == [] and "confidence" not in rows["Spain"]
    assert rows["Spain"]["rounds"][0]["abstained"] and rows["Spain"]["rounds"][0]["parse_issues"] == ["no_structure"]
    assert rows["Kenya"]["rounds"][0]["unmatched"] == ["Atlantis"] and rows["Kenya"]["rounds"][0]["scores"] == {}
    assert rows["Kenya"]["iterations"] == 1 and rows["Kenya"]["prediction"] == ["Nairobi"]
    assert all(len(r["triples"]) == 3 for r in rows.values())

    summary = summarize(list(rows.values()), 3)
    assert summary["iterations"] == {"0": 2, "1": 2, "2": 0, "3": 1}
    assert [s["metrics"]["em"] for s in summary["steps"]] == pytest.approx([20.0, 60.0, 60.0, 60.0])
    assert [s["metrics"]["strict_f1"] for s in summary["steps"]] == pytest.approx([20.0, 60.0, 60.0, 60.0])
    assert [s["counts"]["prompted"] for s in summary["steps"]] == [5, 3, 1, 1]
    assert [s["counts"]["flagged_examples"] for s in summary["steps"]] == [3, 1, 1, 1]
    assert [s["counts"]["resolved"] for s in summary["steps"]] == [2, 2, 0, 0]
    step0 = summary["steps"][0]["counts"]
    assert step0["abstained"] == 1 and step0["unmatched_answers"] == 1 and step0["parse_issues"]["no_structure"] == 1
    assert summary["totals"]["capped"] == 1 and summary["totals"]["capped_still_flagged"] == 1


def test_dropped_unmatched_answers_and_early_stop(detector_ckpt, tiny_encoder_dir, tmp_path):
    script = {q: [r[-1]] if "Japan" in q or "Peru" in q else r for q, r in SCRIPT.items()}
    script["what is the capital of Peru?"] = ['{"Lima": 0.6}']
    llm = ScriptedLLM(script)
    module = _module(detector_ckpt, tiny_encoder_dir, tmp_path, llm, unmatched="drop", max_triples=None)
    rows = {r["id"]: r for r in module.refine(_records())}
    assert len(llm.calls) == 1  # nothing flagged: no second round
    kenya = rows["Kenya"]["rounds"][0]
    assert kenya["answers"] == [] and kenya["unmatched"] == ["Atlantis"] and kenya["abstained"]
    assert all(r["iterations"] == 0 for r in rows.values()) and len(rows["France"]["triples"]) == len(GRAPH)
    assert summarize(list(rows.values()), 5)["steps"][5]["metrics"]["em"] == pytest.approx(60.0)


def test_trainer_predict_with_tiny_chat_model_writes_the_report(
    detector_ckpt, tiny_encoder_dir, tiny_chat_model_dir, detection_dir, tmp_path, single_torch_thread
):
    reasoner = LocalHFBackend(tiny_chat_model_dir, batch_size=4, show_progress=False, cache_dir=str(tmp_path / "llm"))
    module = _module(
        detector_ckpt,
        tiny_encoder_dir,
        tmp_path,
        reasoner,
        max_rounds=2,
        max_triples=4,
        generation=GenerationParams(max_new_tokens=6),
    )
    data = KGQADataModule(data_dir=detection_dir, max_records=5, batch_size=2)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    out = trainer.predict(module, datamodule=data)
    assert [len(b) for b in out] == [2, 2, 1]

    folder = tmp_path / "out" / "test"  # the predicted split's folder
    rows = [json.loads(line) for line in (folder / "refinement_predictions.jsonl").open()]
    assert [r["id"] for r in rows] == [f"test-q{i}" for i in range(5)]
    assert all(1 <= len(r["rounds"]) <= 3 and r["rounds"][0]["response"] is not None for r in rows)
    report = json.loads((folder / "refinement_rounds.json").read_text())
    assert [s["step"] for s in report["steps"]] == [0, 1, 2] and sum(report["iterations"].values()) == 5
    assert report["meta"]["threshold"] == 0.5 and set(report["timings"]) >= {"0"}
    assert (folder / "refinement_rounds.md").read_text().startswith("| step |")
    assert (folder / "refinement_rounds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert evaluate_predictions(folder / "refinement_predictions.jsonl", tmp_path / "eval")["n_questions"] == 5

    # the response cache makes a rerun generate nothing new and give the same answers
    cached = len(reasoner.cache)
    again = module.refine(data.split_records("test"))
    assert len(reasoner.cache) == cached and [r["prediction"] for r in again] == [r["prediction"] for r in rows]


def test_bad_inputs(detector_ckpt, tiny_encoder_dir, tmp_path):
    llm = ScriptedLLM(SCRIPT)
    with pytest.raises(FileNotFoundError, match=r"missing\.ckpt.*configs/detector\.yaml"):
        _module(str(tmp_path / "missing.ckpt"), tiny_encoder_dir, tmp_path, llm)
    with pytest.raises(ValueError, match="model.init_args.encoder"):
        KGGuardRefinement(detector_ckpt, llm, encoder=partial(GATEncoder, hidden_channels=16, heads=4))
    with pytest.raises(ValueError, match="max_rounds"):
        _module(detector_ckpt, tiny_encoder_dir, tmp_path, llm, max_rounds=0)
    with pytest.raises(ValueError, match="max_triples"):
        _module(detector_ckpt, tiny_encoder_dir, tmp_path, llm, max_triples=0)
    wide = topic_echo_detector_ckpt(tmp_path / "wide.ckpt", text_dim=48)
    with pytest.raises(ValueError, match="48-d text embeddings"):
        _module(wide, tiny_encoder_dir, tmp_path, llm).check_text_encoder()
    with pytest.raises(RuntimeError, match="predict"):
        _module(detector_ckpt, tiny_encoder_dir, tmp_path, llm).configure_optimizers()
    assert _module(detector_ckpt, tiny_encoder_dir, tmp_path, llm).refine([]) == []


@pytest.mark.e2e
@pytest.mark.parametrize("devices", [1, 2])
def test_cli_predict_runs_the_config(
    devices, detector_ckpt, tiny_encoder_dir, tiny_chat_model_dir, detection_dir, tmp_path
):
    """The config as a user runs it; on 2 DDP processes the rows of both ranks are gathered, without the record
    that the distributed sampler repeats (5 records on 2 ranks)."""
    env = dict(os.environ, KGLIGHTNING_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    args = {
        "--config": str(ROOT / "configs/refinement.yaml"),
        "--model.init_args.detector_ckpt": detector_ckpt,
        "--model.init_args.encoder": "kglightning.nn.GraphTransformerEncoder",
        "--model.init_args.encoder.init_args.hidden_channels": "16",
        "--model.init_args.encoder.init_args.heads": "4",
        "--model.init_args.text_encoder.init_args.model": tiny_encoder_dir,
        "--model.init_args.reasoner.init_args.model": tiny_chat_model_dir,
        "--model.init_args.generation.max_new_tokens": "6",
        "--model.init_args.max_rounds": "2",
        "--data.init_args.data_dir": detection_dir,
        "--data.init_args.max_records": "5",
        "--trainer.enable_progress_bar": "false",
        "--trainer.accelerator": "cpu",
        "--trainer.devices": str(devices),
    }
    if devices > 1:
        args["--trainer.strategy"] = "ddp"
    cmd = [sys.executable, "-m", "kglightning", "predict", *(x for kv in args.items() for x in kv)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    root = tmp_path / "outputs/refinement"
    folder = root / "test"
    rows = [json.loads(line) for line in (folder / "refinement_predictions.jsonl").open()]
    assert sorted(r["id"] for r in rows) == [f"test-q{i}" for i in range(5)]
    assert (folder / "refinement_rounds.png").exists() and (root / "llm_cache/responses.jsonl").exists()
    from kglightning.pipelines.refinement_report import REPORT_FILES

    assert all((folder / name).is_file() for name in REPORT_FILES)  # what a new run clears when it starts
    output = proc.stdout + proc.stderr
    assert output.count("| step |") == 1 and (devices == 1 or "MEMBER: 2/2" in output)
    assert list((root / "logs").glob("version_*/metrics.csv"))
