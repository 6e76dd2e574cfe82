"""``kglightning build-subgraphs``: a user's KG and questions in, RoG records with PCST subgraphs out."""

from __future__ import annotations

import json

import pytest

from kglightning.cli import main
from kglightning.data.sources.loaders import read_records

TRIPLES = [("France", "capital", "Paris"), ("Paris", "river", "Seine"), ("France", "currency", "Euro"),
           ("Germany", "capital", "Berlin"), ("Germany", "currency", "Euro"), ("Berlin", "river", "Spree")]  # fmt: skip
QUESTIONS = [
    {"id": "q1", "question": "What is the capital of France?", "q_entity": ["France"], "answer": ["Paris"]},
    {"id": "q2", "question": "Which river flows through Berlin?", "q_entity": "Berlin", "answer": "Spree"},
    {"id": "q3", "question": "Where is Atlantis?", "q_entity": ["Atlantis"], "answer": ["nowhere"]},
]


@pytest.fixture
def user_files(tmp_path):
    kg = tmp_path / "kg.tsv"
    kg.write_text("head\trelation\ttail\n" + "".join("\t".join(t) + "\n" for t in TRIPLES), encoding="utf-8")
    qs = tmp_path / "questions.jsonl"
    qs.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    return kg, qs


def run(tmp_path, tiny_encoder_dir, *args: str) -> int:
    return main(["build-subgraphs", "--encoder", tiny_encoder_dir, "--out", str(tmp_path / "out"), *args])


def test_writes_records_stats_and_times(tmp_path, user_files, tiny_encoder_dir, monkeypatch, capsys):
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    kg, qs = user_files
    assert run(tmp_path, tiny_encoder_dir, "--kg", str(kg), "--questions", f"train={qs}", "--questions", str(qs)) == 0
    out = tmp_path / "out"
    for split in ("train", "test"):
        records = read_records(out / f"{split}.jsonl")
        assert [r.id for r in records] == ["q1", "q2"]  # q3: Atlantis is not in the KG (skipped, counted)
        assert records[0].a_entity == ["Paris"] and records[1].q_entity == ["Berlin"]
        for r in records:
            assert r.graph and set(r.graph) <= set(TRIPLES)
            assert any(r.q_entity[0] in (h, t) for h, _, t in r.graph)
        times = [json.loads(line) for line in (out / f"{split}.times.jsonl").read_text().splitlines()]
        assert [t["id"] for t in times] == ["q1", "q2"] and all(t["seconds"] >= 0 for t in times)
    stats = json.loads((out / "subgraph_stats.json").read_text())
    assert stats["settings"]["topk"] == 3 and stats["splits"]["test"]["missing_topic"] == 1
    assert stats["splits"]["test"]["questions"] == 2
    printed = capsys.readouterr().out
    assert "| test | 2 |" in printed and "avg triples" in printed
    assert list((tmp_path / "cache" / "kg").glob("kg-*.pkl"))  # the index is cached for the next run


def test_bad_input_is_one_line_and_exit_2(tmp_path, user_files, tiny_encoder_dir, capsys):
    kg, qs = user_files
    qs.write_text(json.dumps({"id": "q1", "question": "?"}) + "\n", encoding="utf-8")
    assert run(tmp_path, tiny_encoder_dir, "--kg", str(kg), "--questions", str(qs), "--no-cache") == 2
    assert "questions.jsonl:1: field 'q_entity' missing required field" in capsys.readouterr().err
    qs.write_text(json.dumps(QUESTIONS[2]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'q3': no topic entity"):
        run(tmp_path, tiny_encoder_dir, "--kg", str(kg), "--questions", str(qs), "--no-cache",
            "--on-missing-topic", "error")  # fmt: skip
    with pytest.raises(SystemExit):
        run(tmp_path, tiny_encoder_dir, "--kg", str(kg))  # --questions is required for a user's KG
    assert "--questions is required" in capsys.readouterr().err


def test_embedded_kg(tmp_path, tiny_encoder_dir):
    qs = tmp_path / "q.jsonl"
    qs.write_text(json.dumps({"id": "e1", "question": "What is the capital of Kenya?", "q_entity": ["Kenya"],
                              "answer": ["Nairobi"]}) + "\n", encoding="utf-8")  # fmt: skip
    assert run(tmp_path, tiny_encoder_dir, "--kg", "embedded", "--questions", f"validation={qs}", "--topk", "5",
               "--topk-e", "10") == 0  # fmt: skip
    (record,) = read_records(tmp_path / "out" / "validation.jsonl")
    assert record.graph and any("Kenya" in (h, t) for h, _, t in record.graph)
    assert record.a_entity == ["Nairobi"]
