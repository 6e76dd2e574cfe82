"""SGIC's input format (Table 1), document truncation and its counter."""

from __future__ import annotations

import pytest

from kglightning.llm.sgic_prompt import SGICPrompt


def test_calibration_prompt_is_table_1_exactly():
    p = SGICPrompt(instruction="Write a short answer.")
    msgs = p.calibration(
        "Which castle is in Dirleton?",
        ["Yellowcraig is a beach.", "Dirleton Castle is a fortress."],
        [73.4, 12.5],
        [("Lord High  Admiral", 73.0), ("Dirleton\nCastle", 51.49)],
    )
    assert msgs == [
        {
            "role": "user",
            "content": "Write a short answer.\n"
            "Document [1]: Yellowcraig is a beach. (Uncertainty Score: 73)\n"
            "Document [2]: Dirleton Castle is a fortress. (Uncertainty Score: 12)\n"
            "Question: Which castle is in Dirleton?\n"
            "Previous Generated Answer:\n"
            "Round 1: Lord High Admiral (Uncertainty Score: 73)\n"
            "Round 2: Dirleton Castle (Uncertainty Score: 51)\n"
            "Answer:",
        }
    ]


def test_plain_prompt_system_turn_and_no_documents():
    p = SGICPrompt(instruction="Answer.", system_prompt="Be brief.")
    msgs = p.plain("Who?", [])
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[1]["content"] == "Answer.\nQuestion: Who?\nAnswer:"


def test_long_documents_are_truncated_and_counted_once(tiny_chat_model_dir):
    p = SGICPrompt(max_document_tokens=4)
    doc = "one two three four five six"
    assert p.plain("q", [doc, doc, "short"])[0]["content"].count("Document [1]: one two three four\n") == 1
    assert p.truncated == 1
    p.plain("q", [doc])
    assert p.truncated == 1  # the same document is counted once
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_model_dir)
    q = SGICPrompt(max_document_tokens=3, tokenizer=tok)
    cut = q.document("The currency of Japan is the yen")
    assert len(tok(cut, add_special_tokens=False)["input_ids"]) <= 3 and q.truncated == 1
    assert SGICPrompt(max_document_tokens=None).document(doc) == doc


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_document_tokens"):
        SGICPrompt(max_document_tokens=0)
    with pytest.raises(ValueError, match="2 documents but 1 document scores"):
        SGICPrompt().calibration("q", ["a", "b"], [1.0], [])
