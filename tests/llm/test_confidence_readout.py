"""The expected-confidence readout: exact candidate probabilities on a token trie, and the rewritten <PATH> text."""

from __future__ import annotations

import math

import pytest
import torch

from kglightning.evidence.format import parse_evidence
from kglightning.llm.confidence_readout import ConfidenceReadout, confidence_grid


@pytest.fixture(scope="module")
def lm(tiny_chat_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_chat_model_dir).eval()
    return model, tokenizer


def _brute_force(model, prefix: list[int], candidates: list[tuple[int, ...]]) -> torch.Tensor:
    """log p(candidate | prefix), one full forward per candidate."""
    scores = []
    with torch.no_grad():
        for c in candidates:
            ids = torch.tensor([prefix + list(c)])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            scores.append(sum(float(logp[len(prefix) - 1 + k, c[k]]) for k in range(len(c))))
    return torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0)


def _rewritten(readout, model, tokenizer, text: str):
    """The prompt's ids, the generated ids of ``text``, and ``readout.rewrite`` of them."""
    prompt = tokenizer.encode("what is the capital of France?", add_special_tokens=False)
    generated = tokenizer.encode(text, add_special_tokens=False)
    return prompt, generated, readout.rewrite(model, prompt, generated)


def _tokens_before(tokenizer, generated, text: str) -> int:
    """How many generated tokens decode to ``text``."""
    return next(k for k in range(len(generated) + 1) if tokenizer.decode(generated[:k]) == text)


def test_grid_and_bad_digits():
    assert confidence_grid(0) == ["0", "1"]
    assert confidence_grid(2)[75] == "0.75"
    with pytest.raises(ValueError, match="digits"):
        confidence_grid(-1)


def test_distribution_is_exact(lm, single_torch_thread):
    model, tokenizer = lm
    readout = ConfidenceReadout(tokenizer, digits=1)
    prefix = tokenizer.encode("what is the capital of France? <PATH confidence=", add_special_tokens=False)
    p = readout.distribution(model, prefix)
    expected = _brute_force(model, prefix, readout.candidates)
    assert p.shape == (11,) and math.isclose(float(p.sum()), 1.0, rel_tol=1e-6)
    torch.testing.assert_close(p.double(), expected, atol=1e-5, rtol=1e-4)
    mean = float((expected * torch.tensor(readout.values, dtype=torch.float64)).sum())
    assert readout.expected(model, prefix) == pytest.approx(mean, abs=1e-5)


def test_rewrite_replaces_only_the_digits(lm, single_torch_thread):
    model, tokenizer = lm
    readout = ConfidenceReadout(tokenizer, digits=2)
    text = "<PATH confidence=0.75>capital</PATH> and <PATH confidence=1.50>borders</PATH>"
    prompt, generated, out = _rewritten(readout, model, tokenizer, text)
    cut = text.index("0.75")
    k = _tokens_before(tokenizer, generated, text[:cut])
    value = readout.expected(model, prompt + generated[:k])
    assert out == text.replace("0.75", f"{value:.2f}", 1)
    assert readout.counts == {"rewritten": 1, "out_of_range": 1}  # 1.50 stays for the parser to report
    parsed = parse_evidence(out, require_confidence=True)
    assert parsed.evidence[0].confidence == pytest.approx(value, abs=0.005)
    assert parsed.issues == ["confidence_out_of_range"]
    readout.reset()
    assert readout.rewrite(model, prompt, tokenizer.encode("no tags", add_special_tokens=False)) == "no tags"
    assert not readout.counts


def test_rewrite_reads_the_trailing_confidence_after_the_path(lm, single_torch_thread):
    model, tokenizer = lm
    readout = ConfidenceReadout(tokenizer, digits=2)
    text = "<PATH>capital</PATH> <CONFIDENCE>0.75</CONFIDENCE>"
    prompt, generated, out = _rewritten(readout, model, tokenizer, text)
    cut = text.index("0.75")
    k = _tokens_before(tokenizer, generated, text[:cut])
    value = readout.expected(model, prompt + generated[:k])  # conditioned on the path written before it
    assert out == text.replace("0.75", f"{value:.2f}") and readout.counts == {"rewritten": 1}
    assert parse_evidence(out, require_confidence=True).evidence[0].confidence == pytest.approx(value, abs=0.005)


def test_the_readout_depends_on_the_prompt(lm, single_torch_thread):
    """Greedy digits are one value per prompt; the expected value moves with the model's distribution."""
    model, tokenizer = lm
    readout = ConfidenceReadout(tokenizer, digits=2)
    values = {
        readout.expected(model, tokenizer.encode(f"{q} <PATH confidence=", add_special_tokens=False))
        for q in ("what is the capital of France?", "which languages are spoken in Peru?", "the currency of Japan")
    }
    assert len(values) == 3 and all(0.0 <= v <= 1.0 for v in values)


@pytest.fixture(scope="module")
def sp_lm():
    """A SentencePiece-style tokenizer (a ``▁`` before the text, as Llama-2's) and a tiny random Llama over it."""
    from kglightning.testing.models import tiny_llama, tiny_sentencepiece_tokenizer

    corpus = [
        "what is the capital of France? <PATH confidence=0.75>capital</PATH> <CONFIDENCE>0.31</CONFIDENCE>",
        "which languages are spoken in Peru? 0 1 2 3 4 5 6 7 8 9 . Paris Lima Tokyo",
    ] * 4
    tokenizer = tiny_sentencepiece_tokenizer(corpus)
    return tiny_llama(tokenizer, initializer_range=0.5).eval(), tokenizer


def test_sentencepiece_values_are_scored_as_written_after_the_tag(sp_lm, single_torch_thread):
    model, tokenizer = sp_lm
    readout = ConfidenceReadout(tokenizer, digits=2)
    alone = tokenizer.encode("0.75", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(alone)[0] == "▁"  # a value on its own starts with a word boundary
    in_text = tokenizer.encode("<PATH confidence=0.75>", add_special_tokens=False)
    tag = tokenizer.encode("<PATH confidence=", add_special_tokens=False)
    assert readout.candidates[75] == tuple(in_text[len(tag) : len(tag) + 4]) == tuple(alone[1:])
    prefix = tokenizer.encode("what is the capital of France? <PATH confidence=", add_special_tokens=False)
    expected = _brute_force(model, prefix, readout.candidates)
    torch.testing.assert_close(readout.distribution(model, prefix).double(), expected, atol=1e-5, rtol=1e-4)
    standalone = _brute_force(
        model, prefix, [tuple(tokenizer.encode(v, add_special_tokens=False)) for v in readout.texts]
    )
    assert (standalone - expected).abs().max() > 1e-3  # scoring "▁0.75" after the tag gives another distribution


def test_sentencepiece_rewrite_reads_both_positions(sp_lm, single_torch_thread):
    model, tokenizer = sp_lm
    readout = ConfidenceReadout(tokenizer, digits=2)
    text = "<PATH confidence=0.75>capital</PATH> and <PATH>Paris</PATH> <CONFIDENCE>0.31</CONFIDENCE>"
    prompt, generated, out = _rewritten(readout, model, tokenizer, text)
    assert readout.counts == {"rewritten": 2}
    values = []
    for stated, tag in (("0.75", "<PATH confidence="), ("0.31", "</PATH> <CONFIDENCE>")):
        cut = text.index(stated)
        k = _tokens_before(tokenizer, generated, text[:cut])
        candidates = readout.candidates_after(tag)
        assert tokenizer.convert_ids_to_tokens(list(candidates[0]))[0] == "0"  # no word-boundary token
        values.append(
            float(
                _brute_force(model, prompt + generated[:k], candidates)
                @ torch.tensor(readout.values, dtype=torch.float64)
            )
        )
    assert out == text.replace("0.75", f"{values[0]:.2f}").replace("0.31", f"{values[1]:.2f}")


def test_a_quoted_value_is_scored_after_the_quote(lm, single_torch_thread):
    model, tokenizer = lm
    readout = ConfidenceReadout(tokenizer, digits=1)
    text = '<PATH confidence="0.7">capital</PATH>'
    prompt, generated, out = _rewritten(readout, model, tokenizer, text)
    k = _tokens_before(tokenizer, generated, '<PATH confidence="')
    value = readout.expected(model, prompt + generated[:k], readout.candidates_after('<PATH confidence="'))
    assert out == f'<PATH confidence="{value:.1f}">capital</PATH>' and readout.counts == {"rewritten": 1}
