"""The example-level helpers of the proxy's SFT data: mining rows, examples, collation, prompt formats."""

from __future__ import annotations

import pytest
import torch

from kglightning.data.records import KGQARecord
from kglightning.datamodules.sft_examples import (
    IGNORE_INDEX,
    ProxyPrompt,
    collate_prompts,
    collate_sft,
    mine_row,
    row_examples,
)
from kglightning.evidence.builder import EvidenceBuilder

SNOOPY = KGQARecord(
    "q1",
    "Who is Snoopy's brother?",
    ["Spike"],
    ["Snoopy"],
    ["Spike"],
    [("Snoopy", "sibling_of", "Spike"), ("Snoopy", "sibling_of", "Belle"), ("Spike", "gender", "Male")],
)


def test_mine_row_without_evidence_has_no_qa_paths():
    lonely = KGQARecord("q2", "Who owns Lassie?", ["Joe"], ["Lassie"], ["Joe"], [("Lassie", "breed", "Collie")])
    row = mine_row(lonely, EvidenceBuilder())
    assert row["evidence"] == [] and row["qa_paths"] == []
    assert mine_row(SNOOPY, EvidenceBuilder(), qa_max_paths=1)["qa_paths"] == ["Snoopy -> sibling_of -> Spike"]


def test_row_examples_order_limits_and_qa_task():
    row = mine_row(SNOOPY, EvidenceBuilder())
    everything = row_examples(row, max_evidence=None, qa_task=True, digits=3)
    assert [x.task for x in everything] == ["evidence"] * len(row["evidence"]) + ["qa"]
    confidences = [float(x.target.split("confidence=")[1].split(">")[0]) for x in everything[:-1]]
    assert confidences == sorted(confidences, reverse=True)  # best evidence first
    assert "confidence=0.750>" in everything[0].target  # three decimals
    assert everything[-1].target.strip() != "" and "Spike" in everything[-1].target
    assert [x.task for x in row_examples(row, max_evidence=1, qa_task=False)] == ["evidence"]
    no_answer = {**row, "answer": []}
    assert all(x.task == "evidence" for x in row_examples(no_answer, qa_task=True))


def test_collate_sft_masks_prompts_and_gathers_evidence_prompts():
    items = [
        {"input_ids": [5, 6, 7, 8], "prompt_len": 2, "task": "evidence", "id": "a"},
        {"input_ids": [5, 6, 9], "prompt_len": 2, "task": "evidence", "id": "a"},  # same question: one prompt
        {"input_ids": [3, 4, 1, 2, 7], "prompt_len": 3, "task": "qa", "id": "b"},  # QA: no generation prompt
    ]
    batch = collate_sft(items, pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 0], [5, 6, 9, 0, 0], [3, 4, 1, 2, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    i = IGNORE_INDEX
    assert batch["labels"].tolist() == [[i, i, 7, 8, i], [i, i, 9, i, i], [i, i, i, 2, 7]]
    assert batch["prompt"]["id"] == ["a"] and batch["prompt"]["input_ids"].tolist() == [[5, 6]]


def test_collate_prompts_left_pads():
    batch = collate_prompts(
        [{"prompt_ids": [1, 2, 3], "id": "a", "question": "qa"}, {"prompt_ids": [4], "id": "b", "question": "qb"}], 0
    )
    assert batch["input_ids"].tolist() == [[1, 2, 3], [0, 0, 4]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch["answer"] == [[], []] and batch["question"] == ["qa", "qb"]
    empty = collate_prompts([], 0)
    assert empty["input_ids"].shape == (0, 0) and empty["input_ids"].dtype == torch.long


def test_proxy_prompt_formats(tiny_chat_model_dir):
    from kglightning.datamodules.sft_examples import sft_tokenizer

    tok = sft_tokenizer(tiny_chat_model_dir)
    assert ProxyPrompt("plain").render(tok, "Find the paths.") == "Find the paths.\n"
    chat = ProxyPrompt("chat", system_prompt="be brief").render(tok, "Find the paths.")
    assert "be brief" in chat and chat.index("be brief") < chat.index("Find the paths.")
    default = ProxyPrompt().render(tok, "Find the paths.")
    assert "be brief" not in default and "Find the paths." in default
    with pytest.raises(ValueError, match="'chat' or 'plain'"):
        ProxyPrompt("markdown")  # type: ignore[arg-type]


def test_an_evidence_the_format_cannot_write_is_dropped_and_counted():
    row = {"id": "q1", "question": "who is snoopy's brother?", "answer": ["Spike"], "qa_paths": [],
           "evidence": [{"topic": "Snoopy", "relations": ["sibling_of"], "constraint": ["label", "<b>Spike</b>"],
                         "confidence": 0.9},
                        {"topic": "Snoopy", "relations": ["sibling_of"], "confidence": 0.5}]}  # fmt: skip
    dropped: list[str] = []
    out = row_examples(row, qa_task=False, unwritable=dropped)
    assert [x.target for x in out] == ["<PATH confidence=0.50>sibling_of</PATH>"]
    assert dropped == ["q1: '<b>Spike</b>' cannot be written in a <PATH> block"]
    bad = {**row, "evidence": [{"topic": "Snoopy", "relations": ["sibling_of"], "confidence": float("nan")}]}
    with pytest.raises(ValueError, match="confidence"):  # a mining bug is not an unwritable name: it raises
        row_examples(bad, qa_task=False, unwritable=dropped)


def test_a_name_with_a_run_of_spaces_is_written_and_grounds_as_the_kg_writes_it():
    from kglightning.evidence.format import format_evidence, parse_evidence

    record = KGQARecord("q", "where is the statue?", ["Statue"], ["New  York"], ["Statue"],
                        [("New  York", "contains", "Statue"), ("Statue", "kind", "monument")])  # fmt: skip
    target = format_evidence(["contains"], ("kind", "monument"), 0.5)
    (block,) = parse_evidence(target).evidence
    assert EvidenceBuilder().ground(record, block.to_evidence("New  York")) == {"Statue"}
    target = format_evidence(["~contains"], ("contains", "Statue"), 0.5)  # the name inside the block
    (back,) = parse_evidence(target.replace("Statue", "New  York")).evidence
    assert back.constraint == ("contains", "New  York")  # not collapsed to "New York"
