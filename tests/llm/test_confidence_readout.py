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
    prompt = tokenizer.encode("what is the capital of France?", add_special_tokens=False)
    text = "<PATH confidence=0.75>capital</PATH> and <PATH confidence=1.50>borders</PATH>"
    generated = tokenizer.encode(text, add_special_tokens=False)
    out = readout.rewrite(model, prompt, generated)
    cut = text.index("0.75")
    k = next(k for k in range(len(generated) + 1) if tokenizer.decode(generated[:k]) == text[:cut])
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
    prompt = tokenizer.encode("what is the capital of France?", add_special_tokens=False)
    text = "<PATH>capital</PATH> <CONFIDENCE>0.75</CONFIDENCE>"
    generated = tokenizer.encode(text, add_special_tokens=False)
    out = readout.rewrite(model, prompt, generated)
    cut = text.index("0.75")
    k = next(k for k in range(len(generated) + 1) if tokenizer.decode(generated[:k]) == text[:cut])
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
