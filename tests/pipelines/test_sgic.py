"""SGIC's rounds on a scripted backend whose answers and probabilities are known, then on a tiny model via the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest

from kglightning.datamodules import SGICDataModule
from kglightning.llm.sgic_prompt import SGICPrompt
from kglightning.llm.uncertainty import MissingLogprobsError
from kglightning.pipelines import SGICPipeline

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def passages_dir(sgic_passages_dir):
    return sgic_passages_dir


@pytest.fixture
def Scripted(scripted_sgic):  # noqa: N802 - a class
    return scripted_sgic


def _run(backend, passages_dir, tmp_path, **kwargs):
    sgic = SGICPipeline(
        backend, rounds=3, prompt=SGICPrompt(instruction="Answer."), output_dir=str(tmp_path / "out"), **kwargs
    )
    dm = SGICDataModule(source="passages", data_dir=passages_dir, batch_size=2)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    rows = [r for batch in trainer.predict(sgic, datamodule=dm) for r in batch]
    return sgic, {r["id"]: r for r in rows}


@pytest.mark.heavy
def test_rounds_scores_and_minimum_uncertainty_selection(Scripted, passages_dir, tmp_path):
    backend = Scripted()
    sgic, rows = _run(backend, passages_dir, tmp_path, samples=2)
    assert sgic.mean == pytest.approx((0.3 + 0.9) / 2)  # s̄: the round-0 confidences of the split
    fr = rows["fr"]
    assert fr["document_scores"] == [0.0, 100.0]  # 1 - [0.9, 0.2], min-max normalised
    # Eq. 2 with s̄ = 0.6: 0.3 -> 75, 0.6 -> 50, 0.8 -> 25, 0.1 -> 91.67
    assert [(r["answer"], r["uncertainty"]) for r in fr["rounds"]] == [
        ("Lyon", 75.0), ("Paris", 50.0), ("Paris", 25.0), ("Marseille", 91.67)
    ]  # fmt: skip
    assert fr["final_round"] == 2 and fr["methods"]["sgic"]["answer"] == "Paris" and fr["methods"]["sgic"]["em"] == 1
    assert fr["methods"]["baseline"] == {"answer": "Lyon", "uncertainty": 75.0, "em": 0.0, "hit": 0.0, "f1": 0.0,
                                         "correct": 0.0}  # fmt: skip
    assert fr["methods"]["k_sampling"]["answer"] == "Paris"  # the higher of 0.5 (Lyon) and 0.7 (Paris)
    assert rows["jp"]["final_round"] == 0  # equal uncertainty every round: the first wins
    # the round-3 prompt of the French question is Table 1 with every earlier round
    last = [p for p in backend.prompts if "Round 3:" in p and "France" in p][0]
    assert "Document [1]: France capital Paris (Uncertainty Score: 0)" in last
    assert "Document [2]: France borders Spain (Uncertainty Score: 100)" in last
    assert last.endswith("Round 1: Lyon (Uncertainty Score: 75)\nRound 2: Paris (Uncertainty Score: 50)\n"
                         "Round 3: Paris (Uncertainty Score: 25)\nAnswer:")  # fmt: skip
    out = tmp_path / "out" / "test"  # the predicted split's folder
    summary = json.loads((out / "sgic_summary.json").read_text())
    assert summary["methods"]["baseline"]["EM"] == 50.0 and summary["methods"]["sgic"]["EM"] == 100.0
    assert summary["per_round"][3]["EM"] == 50.0 and summary["per_round"][2]["chosen"] == 1
    assert summary["transitions"]["incorrect => correct"] == 1 and summary["transitions"]["correct => correct"] == 1
    assert summary["counts"]["unstable"] == 1  # the French answer still changed in the last round
    # cost: round 0 (2 prompts) for the baseline; + 3 document prompts + 3 rounds x 2 for SGIC; 2 x 2 samples
    assert summary["methods"]["baseline"]["prompt_tokens"] == 10.0
    assert summary["methods"]["sgic"]["prompt_tokens"] == (2 + 3 + 6) * 10 / 2
    assert summary["methods"]["k_sampling"]["completion_tokens"] == 2.0
    # per question in comparison.md: France 10 | 10 + 2 x 10 + 3 x 10 | 2 x 10; Japan 10 | 10 + 10 + 30 | 20
    comparison = json.loads((out / "comparison.json").read_text())
    tokens = {m: comparison[m]["input_tokens"] for m in ("baseline", "sgic", "k_sampling")}
    assert summary["comparison"]["sgic"] == {k: comparison["sgic"][k.lower()] for k in ("Hit", "F1", "ECE")}
    assert summary["comparison"]["sgic"]["Hit"] is not None
    assert tokens == {"baseline": 10.0, "sgic": 55.0, "k_sampling": 20.0}
    assert (
        "| sgic | 100.0 |" in (out / "comparison.md").read_text() and "| 55.0 |" in (out / "comparison.md").read_text()
    )
    lines = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and len(lines[0]["rounds"]) == 4
    preds = [json.loads(x) for x in (out / "sgic" / "predictions.jsonl").read_text().splitlines()]
    assert {p["id"]: p["prediction"] for p in preds} == {"fr": ["Paris"], "jp": ["Tokyo"]}
    assert (out / "uncertainty_trajectories.png").stat().st_size > 1000
    assert "| sgic | 100.0 |" in (out / "sgic_summary.md").read_text()
    # the predictions stack: conformalize reads them (here as calibration and test at once)
    from kglightning.cli import main

    pred = str(out / "sgic" / "predictions.jsonl")
    assert main(["conformalize", "--calibration", pred, "--predictions", pred, "--alpha", "0.5"]) == 0


def test_given_mean_no_documents_and_missing_logprobs(Scripted, passages_dir, tmp_path):
    # a given s̄ is used as is; a question with no documents is answered closed-book and counted
    rows = [{"id": "x", "question": "capital of Japan?", "answer": "Tokyo", "context": []}]
    for split in ("train", "validation", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sgic, got = _run(Scripted(), str(tmp_path), tmp_path, answer_mean=0.5, samples=0)
    assert sgic.mean == 0.5 and got["x"]["rounds"][0]["uncertainty"] == pytest.approx(100 * (0.5 - 0.5 * 0.8))
    assert got["x"]["document_scores"] == [] and "k_sampling" not in got["x"]["methods"]
    assert sgic.counts["without_documents"] == 1
    with pytest.raises(MissingLogprobsError, match="backend 'scripted'"):
        _run(Scripted(logprobs=False), passages_dir, tmp_path)


def test_bad_arguments(Scripted):
    with pytest.raises(ValueError, match="rounds"):
        SGICPipeline(Scripted(), rounds=0)
    with pytest.raises(ValueError, match="temperature must be 0"):
        SGICPipeline(Scripted(), generation=__import__("kglightning").llm.GenerationParams(temperature=0.5))
    with pytest.raises(ValueError, match="answer_mean"):
        SGICPipeline(Scripted(), answer_mean=1.0)


def test_kg_documents_from_records(capitals_dir, tiny_encoder_dir, tmp_path):
    from kglightning.data.embeddings import SentenceEncoder
    from kglightning.retrieval import PathDocuments

    docs = PathDocuments(SentenceEncoder(tiny_encoder_dir, show_progress=False), cache_dir=str(tmp_path / "emb"),
                         num_documents=2, max_hops=2, show_progress=False)  # fmt: skip
    dm = SGICDataModule(data_dir=capitals_dir, documents=docs, batch_size=4)
    dm.setup("predict")
    items = [e for batch in dm.predict_dataloader() for e in batch]
    assert len(items) == 6 and all(len(e.documents) == 2 for e in items)
    first = items[0]
    country = first.question.split()[-1].rstrip("?")
    assert f"{country} -> capital -> {first.answer[0]}" in first.documents  # the one-hop answer path is a document
    with pytest.raises(ValueError, match="needs data_dir"):
        SGICDataModule(source="passages")


@pytest.mark.heavy
def test_sgic_config_runs_through_the_cli(tiny_chat_model_dir, passages_dir, tmp_path):
    args = [
        sys.executable, "-m", "kglightning", "predict", "--config", str(ROOT / "configs/sgic.yaml"),
        "--model.init_args.backend.init_args.model", tiny_chat_model_dir,
        "--model.init_args.backend.init_args.show_progress", "false",
        "--model.init_args.rounds", "2", "--model.init_args.generation.max_new_tokens", "4",
        "--data.init_args.source", "passages", "--data.init_args.data_dir", passages_dir,
    ]  # fmt: skip
    env = dict(os.environ, KGLIGHTNING_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((tmp_path / "outputs/sgic/test/sgic_summary.json").read_text())
    assert summary["questions"] == 2 and len(summary["per_round"]) == 3
    assert set(summary["methods"]) == {"baseline", "k_sampling", "sgic"}
    assert (tmp_path / "outputs/sgic/llm_cache/responses.jsonl").exists()
    from kglightning.pipelines.report import comparison_outputs
    from kglightning.pipelines.sgic_report import METHODS

    out = tmp_path / "outputs/sgic/test"
    names = ("rounds.jsonl", "sgic_summary.json", "sgic_summary.md", "uncertainty_trajectories.png")
    expected = {*(out / n for n in names), *comparison_outputs(out, METHODS)}
    assert expected <= {p for p in out.rglob("*") if p.is_file()}  # what a new run clears when it starts
    # on 2 DDP processes: s̄ is all-reduced over both shards and the rows are gathered (answers come from the cache)
    ddp = [*args, "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    proc = subprocess.run(ddp, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "MEMBER: 2/2" in proc.stderr + proc.stdout
    again = json.loads((tmp_path / "outputs/sgic/test/sgic_summary.json").read_text())
    assert again["questions"] == 2 and again["answer_mean"] == pytest.approx(summary["answer_mean"])
    assert again["per_round"] == summary["per_round"]
    # the counters and the token cost are every process's, not rank 0's over every question
    assert again["counts"] == summary["counts"] and again["counts"]["questions"] == 2
    for method in ("baseline", "sgic"):
        assert again["methods"][method]["prompt_tokens"] == summary["methods"][method]["prompt_tokens"] > 0
    assert summary["methods"]["baseline"]["cached_calls"] == 0 < again["methods"]["baseline"]["cached_calls"]
    assert "read from the response cache" in (tmp_path / "outputs/sgic/test/sgic_summary.md").read_text()


def test_a_document_source_is_keyed_by_its_settings():
    from kglightning.retrieval.documents import DocumentSource

    class Fixed(DocumentSource):
        def __init__(self, n: int) -> None:
            self.n = n

        def __call__(self, records):
            return [["doc"] * self.n for _ in records]

    assert Fixed(1).cache_key == Fixed(1).cache_key != Fixed(2).cache_key
    holder = Fixed(1)
    holder.model = object()  # its repr names a memory address: a key from it would change every run
    with pytest.raises(TypeError, match="override cache_key"):
        _ = holder.cache_key


def test_doublycal_evidence_as_documents(tmp_path):
    from kglightning.data.records import KGQARecord, RecordError
    from kglightning.retrieval import EvidenceDocuments

    rows = [
        {"id": "q1", "evidence": [{"paths": ["A -> r -> B", "A -> r -> C"], "confidence": 0.75}, {"paths": []}]},
        {"id": "q2", "evidence": []},
    ]
    path = tmp_path / "evidence.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = EvidenceDocuments(str(path))
    recs = [KGQARecord(i, "q?", ["B"], ["A"], ["B"], [("A", "r", "B")]) for i in ("q1", "q2", "q3")]
    docs = source(recs)
    assert docs[0][0] == "A -> r -> B; A -> r -> C [Confidence: 0.75]" and docs[1:] == [[], []]
    assert source.num_without_documents == 2
    key = source.cache_key
    path.write_text(json.dumps({"id": "q3", "evidence": [{"paths": ["A -> s -> D"]}]}) + "\n")  # a new DoublyCal run
    assert source.cache_key != key and source(recs) == [[], [], ["A -> s -> D"]]
    path.write_text('{"id": "q1", "evidence": [3]}\n')
    with pytest.raises(RecordError, match=r"evidence.jsonl:1: field 'evidence'"):
        EvidenceDocuments(str(path))(recs)
    with pytest.raises(FileNotFoundError, match="no such evidence file"):
        EvidenceDocuments(str(tmp_path / "none.jsonl"))


def test_passages_are_folded_like_records(passages_dir):
    from kglightning.data.folds import KFold

    dm = SGICDataModule(source="passages", data_dir=passages_dir, folds=KFold(k=2, fold=1, validation_fraction=0.5))
    parts = {s: [e.id for e in dm.build_split(s)] for s in ("train", "validation", "test")}
    assert sorted(q for ids in parts.values() for q in ids) == sorted(
        ["train:line-1", "train:line-2", "validation:line-1", "validation:line-2", "fr", "jp"]
    )
    assert [len(parts[s]) for s in ("train", "validation", "test")] == [1, 2, 3]
