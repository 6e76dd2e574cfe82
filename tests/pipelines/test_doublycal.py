"""The DoublyCal pipeline: evidence grounding, the four variants, prompts, and the written comparison."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import lightning as L
import pytest
from torch.utils.data import DataLoader

from kglightning.data.records import KGQARecord
from kglightning.llm.backends.base import Generation, GenerationParams, LLMBackend
from kglightning.llm.prompts import SelfProbingPrompt
from kglightning.llm.trie import TrieConfig
from kglightning.pipelines.doublycal import DoublyCalPipeline

SNOOPY = KGQARecord(
    "s1",
    "Who is Snoopy's brother?",
    ["Spike"],
    ["Snoopy"],
    ["Spike"],
    [
        ("Snoopy", "sibling_of", "Spike"),
        ("Snoopy", "sibling_of", "Belle"),
        ("Spike", "gender", "Male"),
        ("Belle", "gender", "Female"),
        ("Snoopy", "owner", "Charlie Brown"),
    ],
)


class ScriptedBackend(LLMBackend):
    """A deterministic endpoint double: answers from a function of the conversation, and records every call."""

    def __init__(self, reply: Callable[[list[dict[str, str]]], str]) -> None:
        self.reply = reply
        self.calls: list[list[list[dict[str, str]]]] = []

    @property
    def name(self) -> str:
        return "scripted"

    def _generate_uncached(self, batch, params: GenerationParams, on_result) -> None:
        self.calls.append([list(m) for m in batch])
        for i, messages in enumerate(batch):
            on_result(i, Generation(text=self.reply(messages), prompt_tokens=10 * len(messages)))


@pytest.fixture(scope="module")
def tiny_proxy(tiny_chat_model_dir):
    from kglightning.modules.proxy_sft import EvidenceGeneration, ProxySFT

    return ProxySFT(
        model=tiny_chat_model_dir, generation=EvidenceGeneration(num_evidence=2, decoding="beam", max_new_tokens=24)
    )


def _pipeline(proxy, backend: LLMBackend, tmp_path, **kwargs) -> DoublyCalPipeline:
    return DoublyCalPipeline(proxy, backend, output_dir=str(tmp_path / "out"), **kwargs)


def test_ground_evidence_dedupes_grounds_and_counts(tiny_proxy, tmp_path):
    pipe = _pipeline(tiny_proxy, ScriptedBackend(lambda m: "{}"), tmp_path)
    texts = [
        "<PATH confidence=0.75>sibling_of<CONSTRAINT>gender<SEP>Male</CONSTRAINT></PATH>",
        "<PATH confidence=0.5>sibling_of</PATH> <PATH confidence=0.9>sibling_of<CONSTRAINT>gender<SEP>Male</CONSTRAINT>"
        "</PATH>",
        "<PATH confidence=0.4>married_to</PATH><PATH>owner</PATH> junk <PATH confidence=0.3>owner",
    ]
    evidence = pipe.ground_evidence(SNOOPY, texts)
    assert [(z["relations"], z["constraint"], z["confidence"], z["rank"]) for z in evidence] == [
        (["sibling_of"], ["gender", "Male"], 0.75, 0),  # the rank-1 duplicate (0.9) is dropped
        (["sibling_of"], None, 0.5, 1),
    ]
    assert evidence[0]["answers"] == ["Spike"] and evidence[1]["answers"] == ["Belle", "Spike"]
    assert evidence[0]["paths"] == ["Snoopy -> sibling_of -> Spike (gender -> Male)"]
    assert pipe.counts["ungrounded_evidence"] == 1  # married_to is not in the graph
    assert pipe.evidence_stats.total == 3 and pipe.evidence_stats.clean == 2
    assert pipe.evidence_stats.count("missing_confidence") == 1 and pipe.evidence_stats.count("unclosed_tag") == 1


def _confident_reply(messages: list[dict[str, str]]) -> str:
    text = messages[-1]["content"]
    if "[Confidence:" in text:
        return '```json\n{"Spike": 0.8, "Belle": "30%"}\n```'
    if "Reasoning Paths" in text and "Snoopy ->" in text:
        return "{Spike: 1.0, Belle: 0.9}"
    return "I am not sure."


def test_variants_prompts_and_report(tiny_proxy, tmp_path):
    backend = ScriptedBackend(_confident_reply)
    pipe = _pipeline(tiny_proxy, backend, tmp_path, trie=None)
    evidence = [pipe.ground_evidence(SNOOPY, ["<PATH confidence=0.5>sibling_of</PATH>"])]
    from kglightning.data.kg import KGIndex

    out = pipe.reason([SNOOPY], evidence, [KGIndex.from_record(SNOOPY)])[0]
    (call,) = backend.calls  # every LLM variant of the batch in one backend call
    assert len(call) == 3
    doubly, single, llm = (c[-1]["content"] for c in call)
    assert "Snoopy -> sibling_of -> Belle [Confidence: 0.50]" in doubly
    assert "Snoopy -> sibling_of -> Belle" in single and "Confidence: 0.5" not in single
    assert "Snoopy" not in llm.split("Question:")[0]
    assert out["doublycal"]["prediction"] == ["Spike", "Belle"] and out["doublycal"]["confidence"] == [0.8, 0.3]
    assert out["singlecal"]["confidence"] == [1.0, 0.9]
    assert out["llm_only"]["prediction"] == [] and out["llm_only"]["issues"] == ["no_structure"]
    assert out["evidence_only"] == {"prediction": ["Belle", "Spike"], "confidence": [0.5, 0.5], "input_tokens": 0}
    assert out["doublycal"]["entities"] == ["Belle", "Spike"] and out["doublycal"]["input_tokens"] == 10


def test_self_probing_runs_two_rounds(tiny_proxy, tmp_path):
    def reply(messages):
        return "[Spike, Belle]" if len(messages) == 1 else "{Spike: 0.7}"

    backend = ScriptedBackend(reply)
    pipe = _pipeline(tiny_proxy, backend, tmp_path, prompt=SelfProbingPrompt(), variants=["singlecal"])
    out = pipe.reason([SNOOPY], [[]], [__import__("kglightning.data.kg").data.kg.KGIndex.from_record(SNOOPY)])[0]
    assert [len(c[0]) for c in backend.calls] == [1, 3]  # round 2 holds the first prompt, answer and probe
    assert backend.calls[1][0][1] == {"role": "assistant", "content": "[Spike, Belle]"}
    assert out["singlecal"]["prediction"] == ["Spike"] and out["singlecal"]["input_tokens"] == 10 + 30


def test_bad_arguments(tiny_proxy, tmp_path):
    backend = ScriptedBackend(lambda m: "{}")
    with pytest.raises(ValueError, match="unknown variants"):
        _pipeline(tiny_proxy, backend, tmp_path, variants=["triplecal"])
    with pytest.raises(ValueError, match="missing_confidence"):
        _pipeline(tiny_proxy, backend, tmp_path, missing_confidence=2.0)


def _walkable(rows: Sequence[dict], records: Sequence[KGQARecord]) -> bool:
    from kglightning.evidence.schema import Evidence
    from kglightning.llm.trie import is_walkable

    for row in rows:
        rec = next(r for r in records if r.id == row["id"])
        for z in row["evidence"]:
            from kglightning.data.kg import KGIndex

            ev = Evidence(None, z["relations"], None if z["constraint"] is None else tuple(z["constraint"]))
            if not is_walkable(KGIndex.from_record(rec), rec.q_entity, ev):
                return False
    return True


@pytest.mark.heavy
def test_predict_with_tiny_models_writes_the_comparison(
    tiny_proxy, tiny_chat_model_dir, detection_records, tmp_path, single_torch_thread
):
    from kglightning.llm.backends.local_hf import LocalHFBackend

    backend = LocalHFBackend(tiny_chat_model_dir, batch_size=8, show_progress=False)
    pipe = _pipeline(
        tiny_proxy, backend, tmp_path, generation=GenerationParams(max_new_tokens=16), trie=TrieConfig(max_hops=2)
    )
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    records = [KGQARecord.from_dict(r) for r in detection_records(6, 3)]
    loader = DataLoader(records, batch_size=3, collate_fn=list)
    rows = [r for batch in trainer.predict(pipe, loader) for r in batch]
    assert [r["id"] for r in rows] == [f"q{i}" for i in range(6)]
    out = tmp_path / "out" / "predict"  # a plain dataloader names no split
    assert pipe.run_dir() == out
    for variant in ("doublycal", "singlecal", "evidence_only", "llm_only"):
        lines = (out / variant / "predictions.jsonl").read_text().splitlines()
        assert len(lines) == 6
        assert (out / variant / "eval_result.txt").exists()
    table = (out / "comparison.md").read_text()
    assert table.count("\n") == 6 and "| evidence_only |" in table
    results = json.loads((out / "comparison.json").read_text())
    assert results["evidence_only"]["input_tokens"] == 0 and results["doublycal"]["input_tokens"] > 0
    assert (out / "reliability_comparison.png").read_bytes()[:4] == b"\x89PNG"
    stats = json.loads((out / "run_stats.json").read_text())
    assert stats["questions"] == 6 and stats["ungrounded_evidence"] == 0  # the KG-Trie keeps paths in the graph
    assert _walkable(rows, records)


@pytest.mark.e2e
def test_doublycal_config_runs_through_the_cli(tiny_proxy, tiny_chat_model_dir, detection_dir, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    tiny_proxy.save_adapter(str(tmp_path / "adapter"))
    args = [
        "predict",
        "--config",
        str(root / "configs/doublycal.yaml"),
        "--model.init_args.proxy.init_args.model",
        tiny_chat_model_dir,
        "--model.init_args.proxy.init_args.adapter_path",
        str(tmp_path / "adapter"),
        "--model.init_args.reasoner.init_args.model",
        tiny_chat_model_dir,
        "--model.init_args.reasoner.init_args.show_progress",
        "false",
        "--model.init_args.trie.max_hops",
        "2",
        "--model.init_args.generation.max_new_tokens",
        "8",
        "--data.init_args.data_dir",
        detection_dir,
        "--data.init_args.max_records",
        "4",
    ]
    env = dict(os.environ, KGLIGHTNING_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", PYTHONPATH=str(root))
    run = [sys.executable, "-m", "kglightning", *args]
    proc = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    root = tmp_path / "outputs/doublycal"
    out = root / "test"  # the predicted split's folder; the caches are the run's
    results = json.loads((out / "comparison.json").read_text())
    assert list(results) == ["doublycal", "singlecal", "evidence_only", "llm_only"]
    assert all(r["n_questions"] == 4 for r in results.values())
    cache = (root / "llm_cache" / "responses.jsonl").read_text()
    from kglightning.pipelines.report import comparison_outputs

    expected = {out / "evidence.jsonl", out / "run_stats.json", *comparison_outputs(out, list(results))}
    expected = {p for p in expected if p.name != "reliability.png"}  # drawn only when some answer has a confidence
    assert expected <= {p for p in out.rglob("*") if p.is_file()}  # what a new run clears when it starts
    proxy_cache = (root / "proxy_cache" / "responses.jsonl").read_text()
    assert len(proxy_cache.splitlines()) == 4  # the proxy's evidence of each question
    evidence = (out / "evidence.jsonl").read_text()
    single = json.loads((out / "run_stats.json").read_text())
    assert single["cached_evidence"] == 0
    # a re-run on 2 DDP processes: the ranks' rows are gathered, and every answer comes back from the cache
    ddp = [*run, "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    proc = subprocess.run(ddp, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "MEMBER: 2/2" in proc.stderr + proc.stdout
    assert (root / "llm_cache" / "responses.jsonl").read_text() == cache  # nothing was generated again
    assert json.loads((out / "comparison.json").read_text()) == results
    assert (root / "proxy_cache" / "responses.jsonl").read_text() == proxy_cache  # no evidence generated again
    assert sorted((out / "evidence.jsonl").read_text().splitlines()) == sorted(evidence.splitlines())
    double = json.loads((out / "run_stats.json").read_text())  # every process's counters, not rank 0's
    assert double["cached_evidence"] == 4
    assert {k: double[k] for k in ("questions", "evidence", "evidence_parse")} == {
        k: single[k] for k in ("questions", "evidence", "evidence_parse")
    }


@pytest.mark.heavy
def test_write_comparison_scores_each_variant_exactly(tmp_path):
    from kglightning.pipelines.report import write_comparison

    rows = [
        {
            "id": "a",
            "question": "q a",
            "answer": ["Spike"],
            "variants": {
                "doublycal": {"prediction": ["Spike", "Belle"], "confidence": [0.8, 0.2], "input_tokens": 100},
                "llm_only": {"prediction": [], "confidence": [], "input_tokens": 40},
            },
        },
        {
            "id": "b",
            "question": "q b",
            "answer": ["Paris"],
            "variants": {
                "doublycal": {"prediction": ["Lyon"], "confidence": [0.6], "input_tokens": 120},
                "llm_only": {"prediction": ["Paris"], "confidence": [1.0], "input_tokens": 60},
            },
        },
    ]
    results = write_comparison(rows, ["doublycal", "llm_only"], tmp_path)
    dc, llm = results["doublycal"], results["llm_only"]
    assert dc["hit"] == 50.0 and llm["hit"] == 50.0 and llm["abstained"] == 1 and dc["abstained"] == 0
    # doublycal answers: (0.8, right), (0.2, wrong), (0.6, wrong) in 10 bins -> ECE = (0.2 + 0.2 + 0.6) / 3
    assert dc["ece"] == pytest.approx(100 / 3)
    assert llm["ece"] == pytest.approx(0.0) and llm["n_confidences"] == 1
    assert dc["input_tokens"] == 110 and llm["input_tokens"] == 50
    table = (tmp_path / "comparison.md").read_text().splitlines()
    assert table[2].startswith("| doublycal | 50.0 |") and "| 33.3 |" in table[2]
    assert json.loads((tmp_path / "doublycal" / "predictions.jsonl").read_text().splitlines()[1])["prediction"] == [
        "Lyon"
    ]


def test_reasoner_behind_an_openai_compatible_endpoint(tiny_proxy, tiny_chat_model_dir, tmp_path, single_torch_thread):
    """The pipeline's reasoner over real HTTP (loopback server on the tiny model) answers like the local backend."""
    from kglightning.data.kg import KGIndex
    from kglightning.llm.backends import ChatCompletionServer, LocalHFBackend, OpenAIChatBackend

    local = LocalHFBackend(tiny_chat_model_dir, batch_size=4, show_progress=False)
    records, kgs = [SNOOPY, SNOOPY], [KGIndex.from_record(SNOOPY)] * 2
    grounded = _pipeline(tiny_proxy, local, tmp_path).ground_evidence(
        SNOOPY, ["<PATH confidence=0.5>sibling_of</PATH>"]
    )
    evidence = [[], grounded]
    expected = _pipeline(tiny_proxy, local, tmp_path, generation=GenerationParams(max_new_tokens=12)).reason(
        records, evidence, kgs
    )
    with ChatCompletionServer(local, port=0, model_name="tiny") as server:
        remote = OpenAIChatBackend(base_url=server.url, model="tiny", show_progress=False)
        got = _pipeline(tiny_proxy, remote, tmp_path, generation=GenerationParams(max_new_tokens=12)).reason(
            records, evidence, kgs
        )
        assert server.request_count == 6  # 3 LLM variants x 2 questions
    for e, g in zip(expected, got):
        for v in ("doublycal", "singlecal", "llm_only"):
            assert g[v]["raw"] == e[v]["raw"] and g[v]["prediction"] == e[v]["prediction"]


def test_faiss_grounder_grounds_near_miss_answers(tiny_proxy, tmp_path):
    from kglightning.data.embeddings import SentenceEncoder
    from kglightning.retrieval import FaissGrounder

    grounder = FaissGrounder(SentenceEncoder(show_progress=False), cache_dir=str(tmp_path / "emb"), min_similarity=0.8)
    pipe = _pipeline(tiny_proxy, ScriptedBackend(lambda m: ""), tmp_path, grounder=grounder)
    out = pipe._answer("doublycal", "{Charlie Browne: 0.8, Spike: 0.6, Jupiter: 0.3}", ["Spike", "Charlie Brown"])
    assert out["entities"] == ["Charlie Brown", "Spike"]
    assert pipe._grounder_counts() == {"faiss_grounding": {"matched": 1, "unmatched": 1}}
    plain = _pipeline(tiny_proxy, ScriptedBackend(lambda m: ""), tmp_path)
    assert plain._answer("doublycal", "{Charlie Browne: 0.8}", ["Charlie Brown"])["entities"] == []
