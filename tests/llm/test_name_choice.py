"""Structured generation over subgraph node names: the processor's transitions and sampled outputs of a tiny model."""

from __future__ import annotations

import random
import re

import pytest
import torch
from transformers import LogitsProcessorList

from kglightning.llm.trie.names import UNKNOWN, NameChoice, NameListLogitsProcessor, _ChoiceTrie
from kglightning.testing import tiny_bpe_tokenizer, tiny_llama

NAMES = ("Paris", "Paris Saint-Germain", "Lyon", "Marseille", "unknown soldier")
CORPUS = ["Paris Lyon Marseille unknown soldier Berlin Rome Madrid Tokyo question answer capital France"] * 20


@pytest.fixture(scope="module")
def tok():
    return tiny_bpe_tokenizer(CORPUS, vocab_size=320)


def test_transitions(tok):
    eos = [tok.eos_token_id]
    trie = _ChoiceTrie(NameChoice(NAMES, max_answers=2), tok, eos)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    sep = enc("\n")
    first = set(trie.allowed([]))
    assert {enc(n)[0] for n in (*NAMES, UNKNOWN)} == first and eos[0] not in first  # at least one line
    paris = enc("Paris")
    after = set(trie.allowed(paris))  # "Paris" is a name and a prefix of another
    assert eos[0] in after and sep[0] in after and enc("Paris Saint-Germain")[len(paris)] in after
    second = set(trie.allowed(paris + sep))  # a second line: names (not unknown) or the end
    assert eos[0] in second and enc("Lyon")[0] in second
    assert trie.allowed(paris + sep + enc("Lyon")) == eos  # max_answers = 2: no separator after the second
    after_unknown = trie.allowed(enc(UNKNOWN))
    assert eos[0] in after_unknown and sep[0] not in after_unknown  # the only line ("unknown soldier" may go on)
    assert trie.allowed(enc("Berlin")) == eos  # off the trie (not from this processor): end


def test_parse_counts_unfinished_lines():
    choice = NameChoice(NAMES)
    assert choice.parse("Lyon\nParis Saint-Germain\nLyon\n") == (["Lyon", "Paris Saint-Germain"], False, 0)
    assert choice.parse("unknown") == ([], True, 0)
    assert choice.parse("Marse") == ([], False, 1)
    assert NameChoice(("a", "b")).key != NameChoice(("a", "b"), max_answers=2).key
    with pytest.raises(ValueError, match="no name"):
        NameChoice((), allow_unknown=False)


def test_sampled_answers_never_leave_the_set(tok):
    model = tiny_llama(tok, initializer_range=0.5, seed=1).eval()
    choices = [NameChoice(NAMES, max_answers=3), NameChoice(("Lyon", "Marseille"), allow_unknown=False)]
    prompts = ["capital of France?", "question answer"]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    seen, abstained = set(), 0
    for seed in range(12):
        torch.manual_seed(seed)
        proc = NameListLogitsProcessor(choices, tok, [tok.eos_token_id])
        out = model.generate(**enc, do_sample=True, temperature=1.5, top_k=0, max_new_tokens=60,
                             logits_processor=LogitsProcessorList([proc]), pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)  # fmt: skip
        for row, choice in enumerate(choices):
            ids = out[row, enc["input_ids"].shape[1] :].tolist()
            text = tok.decode(ids, skip_special_tokens=True)
            names, unknown, dropped = choice.parse(text)
            assert dropped == 0 and (names or unknown), (seed, text)
            assert len(names) <= choice.max_answers and set(names) <= set(choice.names)
            assert tok.eos_token_id in ids  # every list ended (within 60 tokens)
            seen.update(names)
            abstained += unknown
    assert len(seen) >= 3  # sampling explores the set


def test_local_backend_generates_under_choices_and_caches_them_apart(tiny_chat_model_dir, tmp_path):
    from kglightning.llm.backends.base import GenerationParams
    from kglightning.llm.backends.local_hf import LocalHFBackend

    backend = LocalHFBackend(tiny_chat_model_dir, batch_size=2, show_progress=False, cache_dir=str(tmp_path / "c"))
    convs = [[{"role": "user", "content": q}] for q in ("capital of France?", "largest city?", "river?")]
    choices = [NameChoice(("Paris", "Lyon")), NameChoice(("Marseille",), allow_unknown=False), NameChoice(("Lyon",))]
    for seed in range(5):
        params = GenerationParams(max_new_tokens=40, temperature=1.3, seed=seed)
        gens = backend.generate_with_params(convs, params, choices)
        for gen, choice in zip(gens, choices):
            names, unknown, dropped = choice.parse(gen.text)
            assert dropped == 0 and (names or unknown) and set(names) <= set(choice.names), gen.text
    free = backend.generate_with_params(convs, GenerationParams(max_new_tokens=40, temperature=1.3, seed=4))
    assert not all(g.cached for g in free)  # unconstrained requests are other cache entries
    again = backend.generate_with_params(convs, GenerationParams(max_new_tokens=40, temperature=1.3, seed=4), choices)
    assert all(g.cached for g in again) and [g.text for g in again] == [g.text for g in gens]
    with pytest.raises(ValueError, match="2 choices for 3"):
        backend.generate_with_params(convs, params, choices[:2])


def test_backends_without_structured_generation_say_so():
    from kglightning.llm.backends.base import GenerationParams
    from kglightning.llm.backends.openai_http import OpenAIChatBackend

    backend = OpenAIChatBackend(base_url="http://127.0.0.1:9/v1", model="m")
    with pytest.raises(NotImplementedError, match="OpenAIChatBackend cannot constrain answers"):
        backend.generate_with_params([[{"role": "user", "content": "q"}]], GenerationParams(), [NameChoice(("a",))])


def test_regex_escapes_only_metacharacters():
    rng = random.Random(0)
    alphabet = "ab .-#&~/'\\^$*+?()[]{}|,:"
    drawn = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))).strip() for _ in range(300)}
    names = tuple(sorted(n for n in drawn if n))
    pattern = NameChoice(names, max_answers=2).regex()
    plain = NameChoice(tuple(n for n in names if "\\" not in n)).regex()
    assert "\\ " not in plain and "\\-" not in plain and "\\#" not in plain and "\\&" not in plain
    for name in names:
        assert re.fullmatch(pattern, name), name
        assert not re.fullmatch(pattern, name + "\u00e9")
    assert re.fullmatch(pattern, f"{names[0]}\n{names[1]}")
