"""Reasoner prompts (DoublyCal App. C): styles x evidence modes, Self-Probing rounds, token counting."""

from __future__ import annotations

import re

import pytest

from kglightning.llm.prompts import (
    CoTPrompt,
    EvidenceLine,
    SelfProbingPrompt,
    UQPrompt,
    VanillaPrompt,
    cot_prompt,
    count_tokens,
    render_evidence,
    self_probing_first_round,
    self_probing_second_round,
    vanilla_prompt,
)

QUESTION = "What is the name of Snoopy's brother?"
EVIDENCE = [("Snoopy -> sibling_of -> Spike", 0.75), ("Snoopy -> sibling_of -> Belle", 0.5)]
UQ = (
    "provide the confidence (0.0 to 1.0) for each answer being correct. Please keep the answer as simple as possible "
    "and return all the possible answers and their confidence as a json string. Output format example: "
    "{<answer_1>: <confidence_1>,...,<answer_k>: <confidence_k>}"
)
CONF_LINE = re.compile(r"\[Confidence: [01]\.\d\d\]$", re.M)
BUILDERS = [vanilla_prompt, cot_prompt, self_probing_first_round]


@pytest.mark.parametrize("builder", BUILDERS)
def test_calibrated_variant_has_confidence_lines(builder):
    (msg,) = builder(QUESTION, EVIDENCE)
    assert msg["role"] == "user"
    content = msg["content"]
    assert content.startswith("Based on the reasoning paths and their confidence scores, please answer")
    assert (
        "Snoopy -> sibling_of -> Spike [Confidence: 0.75]\nSnoopy -> sibling_of -> Belle [Confidence: 0.50]" in content
    )
    assert len(CONF_LINE.findall(content)) == 2
    assert content.endswith(f"Reasoning Paths:\n{render_evidence(EVIDENCE)}\n\nQuestion:\n{QUESTION}")


@pytest.mark.parametrize("builder", BUILDERS)
def test_singlecal_variant_has_evidence_without_confidence(builder):
    (msg,) = builder(QUESTION, EVIDENCE, mode="without_confidence")
    content = msg["content"]
    assert content.startswith("Based on the reasoning paths, please answer")
    assert "Reasoning Paths:\nSnoopy -> sibling_of -> Spike\nSnoopy -> sibling_of -> Belle\n\n" in content
    assert "Confidence:" not in content and "confidence scores" not in content
    assert QUESTION in content


@pytest.mark.parametrize("builder", BUILDERS)
def test_llm_only_variant_has_no_evidence(builder):
    (msg,) = builder(QUESTION, EVIDENCE, mode="none")
    content = msg["content"]
    assert content.startswith("Please answer the")
    assert "Reasoning Paths" not in content and "Snoopy -> " not in content and "[Confidence" not in content
    assert content.endswith(f"\n\nQuestion:\n{QUESTION}")


def test_vanilla_and_cot_wording():
    vanilla = vanilla_prompt(QUESTION, mode="none")[0]["content"]
    assert vanilla == f"Please answer the following questions and {UQ}\n\nQuestion:\n{QUESTION}"
    cot = cot_prompt(QUESTION, EVIDENCE)[0]["content"]
    instruction, context, question = cot.split("\n\n")
    assert instruction.endswith(f"{UQ} Let's think it step by step.")  # before the context
    assert context.startswith("Reasoning Paths:") and question == f"Question:\n{QUESTION}"
    assert "step by step" not in vanilla


def test_self_probing_two_rounds():
    first = self_probing_first_round(QUESTION, EVIDENCE, system="You are a KGQA assistant.")
    assert [m["role"] for m in first] == ["system", "user"]
    assert "return all the possible answers as a list." in first[1]["content"]
    assert "json" not in first[1]["content"] and "(0.0 to 1.0)" not in first[1]["content"]
    reply = "['Spike', 'Belle']\n"
    second = self_probing_second_round(first, reply)
    assert second[:2] == first and second is not first
    assert second[2] == {"role": "assistant", "content": "['Spike', 'Belle']"}
    probe = second[3]
    assert probe["role"] == "user"
    assert probe["content"].startswith(
        "Q: How likely are the above answers to be correct? Analyze the possible answers"
    )
    assert probe["content"].endswith("{<answer_1>: <confidence_1>,...,<answer_k>: <confidence_k>}")
    from_list = self_probing_second_round(first, ["Spike", "Belle"])
    assert from_list[2]["content"] == '["Spike", "Belle"]'
    with pytest.raises(ValueError):
        self_probing_second_round([], "Spike")
    with pytest.raises(ValueError):
        self_probing_second_round(second[:3], "Spike")  # ends with the assistant


def test_evidence_inputs_and_validation():
    lines = [EvidenceLine(["Snoopy", "~children", "Charles"], 0.3), "Snoopy -> r -> Spike"]
    assert render_evidence(lines, mode="without_confidence") == "Snoopy -> ~children -> Charles\nSnoopy -> r -> Spike"
    assert render_evidence([("p", 0.123)], digits=1) == "p [Confidence: 0.1]"
    with pytest.raises(ValueError, match="needs a confidence"):
        render_evidence(lines)  # the string line has no confidence
    with pytest.raises(ValueError):
        render_evidence([("p", 1.5)])
    assert render_evidence(lines, mode="none") == ""
    empty = vanilla_prompt(QUESTION)[0]["content"]  # DoublyCal with no grounded path: an empty section, as RoG
    assert "Reasoning Paths:\n\n\nQuestion:" in empty
    with pytest.raises(ValueError):
        vanilla_prompt(QUESTION, mode="calibrated")  # type: ignore[arg-type]


def test_prompt_style_classes():
    for style, builder in zip((VanillaPrompt(), CoTPrompt(), SelfProbingPrompt()), BUILDERS):
        assert style.first_round(QUESTION, EVIDENCE) == builder(QUESTION, EVIDENCE)
    prompt = CoTPrompt(system_prompt="sys")
    assert not prompt.two_rounds
    assert prompt.first_round(QUESTION, EVIDENCE, "without_confidence") == cot_prompt(
        QUESTION, EVIDENCE, mode="without_confidence", system="sys"
    )
    with pytest.raises(ValueError):
        prompt.second_round(prompt.first_round(QUESTION), "Spike")
    probing = SelfProbingPrompt(confidence_digits=1)
    first = probing.first_round(QUESTION, EVIDENCE)
    assert "[Confidence: 0.8]" in first[0]["content"]
    assert probing.second_round(first, "Spike")[-1]["content"].startswith("Q: How likely")
    with pytest.raises(ValueError):
        VanillaPrompt(confidence_digits=-1)
    with pytest.raises(TypeError):
        UQPrompt()  # type: ignore[abstract]


def test_a_new_style_is_a_subclass():
    class Hedged(UQPrompt):
        def instruction(self) -> str:
            return "Give every answer with a probability. {a: p}"

    msgs = Hedged(system_prompt="be brief").first_round(QUESTION, EVIDENCE, "without_confidence")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[1]["content"].startswith("Based on the reasoning paths, give every answer with a probability.")
    assert "Snoopy -> sibling_of -> Spike\n" in msgs[1]["content"] and "[Confidence" not in msgs[1]["content"]


def test_count_tokens_heuristic():
    msgs = vanilla_prompt(QUESTION, EVIDENCE)
    n = count_tokens(msgs)
    chars = len(msgs[0]["content"])
    assert n == -(-chars // 4) + 4 + 3
    assert count_tokens([]) == 3
    assert count_tokens([{"role": "user", "content": "a b c d e f"}]) == 6 + 4 + 3  # words beat chars / 4
    assert count_tokens(self_probing_second_round(msgs, "Spike")) > n


def test_count_tokens_with_tokenizers(tiny_chat_model_dir):
    from transformers import AutoTokenizer

    from kglightning.data.embeddings import bundled_minilm_path

    msgs = vanilla_prompt(QUESTION, EVIDENCE, system="You are helpful.")
    chat_tok = AutoTokenizer.from_pretrained(tiny_chat_model_dir)  # ChatML template
    templated = chat_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert count_tokens(msgs, chat_tok) == len(chat_tok(templated, add_special_tokens=False)["input_ids"])
    plain_tok = AutoTokenizer.from_pretrained(bundled_minilm_path())  # no chat template: encode the contents
    assert not getattr(plain_tok, "chat_template", None)
    expected = sum(len(plain_tok.encode(m["content"], add_special_tokens=False)) for m in msgs)
    assert count_tokens(msgs, plain_tok) == expected
