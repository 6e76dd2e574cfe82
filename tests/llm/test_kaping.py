"""KAPING answerer: top triples in the prompt, answers constrained to the subgraph's nodes, abstentions counted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kglightning.data.embeddings import SentenceEncoder
from kglightning.data.records import KGQARecord
from kglightning.llm.backends.base import GenerationParams
from kglightning.llm.backends.local_hf import LocalHFBackend
from kglightning.llm.kaping import KAPINGAnswerer

GRAPH = [("France", "location.country.capital", "Paris"), ("France", "location.country.currency_used", "Euro"),
         ("Paris", "location.location.containedby", "Île-de-France"), ("Germany", "location.country.capital", "Berlin"),
         ("Germany", "location.country.currency_used", "Euro")]  # fmt: skip
RECORDS = [
    KGQARecord("q1", "What is the capital of France?", ["Paris"], ["France"], ["Paris"], GRAPH),
    KGQARecord("q2", "Which currency does Germany use?", ["Euro"], ["Germany"], ["Euro"], GRAPH[3:]),
    KGQARecord("q3", "Who wrote Hamlet?", ["William Shakespeare"], ["Hamlet"], [], []),
]


@pytest.fixture(scope="module")
def encoder():
    return SentenceEncoder(show_progress=False)


def test_facts_are_the_most_similar_triples(encoder, tmp_path):
    answerer = KAPINGAnswerer(backend=None, encoder=encoder, cache_dir=str(tmp_path), top_triples=2)  # type: ignore[arg-type]
    facts = answerer.facts(RECORDS[0])
    assert len(facts) == 2 and facts[0] == ("France", "location country capital", "Paris")
    assert answerer.facts(RECORDS[2]) == []
    assert answerer.choice(RECORDS[1]).names == ("Berlin", "Euro", "Germany")
    content = answerer.messages(RECORDS[0], facts)[0]["content"]
    assert "(France, location country capital, Paris)" in content and content.endswith(RECORDS[0].question)


@pytest.mark.parametrize("seed", range(4))
def test_constrained_answers_are_subgraph_nodes_or_unknown(encoder, tiny_chat_model_dir, tmp_path, seed):
    backend = LocalHFBackend(tiny_chat_model_dir, batch_size=2, show_progress=False, cache_dir=str(tmp_path / "llm"))
    answerer = KAPINGAnswerer(backend, encoder=encoder, cache_dir=str(tmp_path / "emb"), show_progress=False,
                              generation=GenerationParams(max_new_tokens=40, temperature=1.2, seed=seed))  # fmt: skip
    out = answerer.propose(RECORDS)
    for before, after in zip(RECORDS, out):
        nodes = {n for h, _, t in before.graph for n in (h, t)}
        assert set(after.prediction) <= nodes and after.extra["kaping"]["dropped_lines"] == 0
        assert after.extra["kaping"]["unknown"] == (not after.prediction)
    assert out[2].prediction == []  # an empty graph leaves only "unknown"
    c = answerer.counts
    assert c["questions"] == 3 and c["empty_graph"] == 1 and c["unknown"] >= 1
    again = KAPINGAnswerer(backend, encoder=encoder, cache_dir=str(tmp_path / "emb"), show_progress=False,
                           generation=GenerationParams(max_new_tokens=40, temperature=1.2, seed=seed))  # fmt: skip
    assert [r.prediction for r in again.propose(RECORDS)] == [r.prediction for r in out]  # from the response cache


class _Echo:
    """An unconstrained backend that answers with fixed text (what an endpoint might say)."""

    cache_key = "echo"

    def __init__(self, text: str) -> None:
        self.text = text

    def generate_with_params(self, batch, params, choices=None):
        from kglightning.llm.backends.base import Generation, LLMBackend

        if choices is not None:
            return LLMBackend._generate_choices(self, batch, params, choices, None)  # type: ignore[arg-type]
        return [Generation(text=self.text) for _ in batch]


def test_unconstrained_answers_are_matched_and_the_rest_counted(encoder, tmp_path):
    answerer = KAPINGAnswerer(_Echo("paris\nLondon\nEuro"), encoder=encoder, cache_dir=str(tmp_path), constrained=False,
                              show_progress=False)  # type: ignore[arg-type]  # fmt: skip
    (out,) = answerer.propose(RECORDS[:1])
    assert out.prediction == ["Paris", "Euro"] and out.extra["kaping"]["dropped_lines"] == 1
    with pytest.raises(NotImplementedError, match="set constrained: false"):
        KAPINGAnswerer(_Echo("x"), encoder=encoder, cache_dir=str(tmp_path), show_progress=False).propose(RECORDS[:1])  # type: ignore[arg-type]


def test_unconstrained_near_misses_are_grounded_by_faiss(encoder, tmp_path):
    from kglightning.retrieval import FaissGrounder

    text = "the Euro\nPariss\nLondon"  # normalized exact, a near miss, a name far from every node of the graph
    exact = KAPINGAnswerer(_Echo(text), encoder=encoder, cache_dir=str(tmp_path), constrained=False,
                           show_progress=False)  # type: ignore[arg-type]  # fmt: skip
    grounder = FaissGrounder(encoder, cache_dir=str(tmp_path), min_similarity=0.8, device="cpu")
    fuzzy = KAPINGAnswerer(_Echo(text), encoder=encoder, cache_dir=str(tmp_path), constrained=False,
                           grounder=grounder, show_progress=False)  # type: ignore[arg-type]  # fmt: skip
    (a,), (b,) = exact.propose(RECORDS[:1]), fuzzy.propose(RECORDS[:1])
    assert a.prediction == ["Euro"] and a.extra["kaping"]["dropped_lines"] == 2
    assert b.prediction == ["Euro", "Paris"] and b.extra["kaping"]["dropped_lines"] == 1
    assert fuzzy.counts["fuzzy_grounded"] == 1 and (grounder.matched, grounder.unmatched) == (1, 1)
    assert exact.cache_key != fuzzy.cache_key  # the proposals are cached apart
    constrained = KAPINGAnswerer(_Echo(text), encoder=encoder, cache_dir=str(tmp_path), grounder=grounder)  # type: ignore[arg-type]
    assert constrained.cache_key == KAPINGAnswerer(_Echo(text), encoder=encoder, cache_dir=str(tmp_path)).cache_key  # type: ignore[arg-type]


class _Scripted(_Echo):
    """An unconstrained endpoint that answers, explains and cites according to the last request."""

    def __init__(self, answer: str, summary: str, cited: str) -> None:
        self.replies = {"answer": answer, "summary": summary, "cited": cited}

    def generate_with_params(self, batch, params, choices=None):
        from kglightning.llm.backends.base import Generation
        from kglightning.llm.kaping import SUMMARY_REQUEST, TRIPLES_REQUEST

        last = {SUMMARY_REQUEST: "summary", TRIPLES_REQUEST: "cited"}
        return [Generation(text=self.replies[last.get(c[-1]["content"], "answer")]) for c in batch]


def test_reasoning_summary_and_cited_facts_for_the_judges(encoder, tmp_path):
    from kglightning.llm.node_judges import LLMJudge

    backend = _Scripted("Paris", "Paris is the capital of France.",
                        "(France, location country capital, Paris)\n(Paris, is, made up)")  # fmt: skip
    answerer = KAPINGAnswerer(backend, encoder=encoder, cache_dir=str(tmp_path), constrained=False, reasoning=True,
                              show_progress=False)  # type: ignore[arg-type]  # fmt: skip
    q1, q2, q3 = answerer.propose(RECORDS)
    assert q1.extra["reasoning_summary"] == "Paris is the capital of France."
    assert q1.extra["reasoning_triples"] == [["France", "location country capital", "Paris"]]
    assert (
        q2.prediction == [] and "reasoning_summary" not in q2.extra
    )  # "Paris" is not a node of q2: nothing to explain
    assert "reasoning_triples" not in q3.extra
    c = answerer.counts
    assert (c["explained"], c["uncited"], c["dropped_citations"]) == (1, 0, 1)
    prompt = LLMJudge(backend, context="G+RS+RT").messages(q1, "Paris")[0]["content"]  # type: ignore[arg-type]
    assert "Paris is the capital of France." in prompt and "(France, location country capital, Paris)" in prompt
    assert "reasoning" not in KAPINGAnswerer(backend, encoder=encoder, cache_dir=str(tmp_path)).cache_key  # type: ignore[arg-type]
    assert answerer.cache_key != KAPINGAnswerer(backend, encoder=encoder, cache_dir=str(tmp_path)).cache_key  # type: ignore[arg-type]


def test_reasoning_only_for_the_splits_the_judges_read(encoder, tmp_path):
    class Counting(_Scripted):
        requests = 0

        def generate_with_params(self, batch, params, choices=None):
            Counting.requests += len(batch)
            return super().generate_with_params(batch, params, choices)

    backend = Counting("Paris", "Paris is the capital of France.", "(France, location country capital, Paris)")
    answerer = KAPINGAnswerer(backend, encoder=encoder, cache_dir=str(tmp_path), constrained=False, reasoning=True,
                              show_progress=False)  # type: ignore[arg-type]  # fmt: skip
    plain = KAPINGAnswerer(backend, encoder=encoder, cache_dir=str(tmp_path), constrained=False, show_progress=False)  # type: ignore[arg-type]
    assert answerer.for_split("test") is answerer
    train = answerer.for_split("train")
    assert train.cache_key == plain.cache_key and answerer.reasoning  # the answerer itself is unchanged
    (q1, *_) = train.propose(RECORDS)
    assert Counting.requests == 3 and "reasoning_summary" not in q1.extra  # one answer per question, no more
    (r1, *_) = answerer.propose(RECORDS)
    assert r1.prediction == q1.prediction and r1.extra["reasoning_summary"] == "Paris is the capital of France."
    everywhere = KAPINGAnswerer(backend, encoder=encoder, reasoning=True, reasoning_splits=None)  # type: ignore[arg-type]
    assert everywhere.for_split("train") is everywhere


@pytest.mark.parametrize("seed", range(3))
def test_constrained_citations_are_facts_of_the_prompt(encoder, tiny_chat_model_dir, tmp_path, seed):
    backend = LocalHFBackend(tiny_chat_model_dir, batch_size=2, show_progress=False, cache_dir=str(tmp_path / "llm"))
    answerer = KAPINGAnswerer(backend, encoder=encoder, cache_dir=str(tmp_path / "emb"), show_progress=False,
                              reasoning=True, reasoning_tokens=8, max_cited=2,
                              generation=GenerationParams(max_new_tokens=40, temperature=1.2, seed=seed))  # fmt: skip
    out = answerer.propose(RECORDS[:2] * 3)
    explained = [r for r in out if r.prediction]
    assert explained, "no answer to explain: pick other seeds"
    assert answerer.counts["explained"] == len(explained) and answerer.counts["dropped_citations"] == 0
    for r in out:
        if not r.prediction:
            assert "reasoning_triples" not in r.extra
            continue
        facts = [tuple(f) for f in r.extra["kaping"]["facts"]]
        assert isinstance(r.extra["reasoning_summary"], str) and len(r.extra["reasoning_triples"]) <= 2
        assert all(tuple(t) in facts for t in r.extra["reasoning_triples"])


def test_selfcheck_over_malformed_samples_counts_them_and_flags_every_node(encoder, tmp_path):
    from kglightning.llm.node_judges import SelfCheck

    answerer = KAPINGAnswerer(_Echo("** I think:\n- ???"), encoder=encoder, cache_dir=str(tmp_path), constrained=False,
                              show_progress=False)  # type: ignore[arg-type]  # fmt: skip
    record = replace(RECORDS[0], prediction=["Paris", "Euro"])
    assert SelfCheck(answerer, samples=3).score([record]) == [{"Paris": 1.0, "Euro": 1.0}]  # no sample names them
    assert answerer.counts["questions"] == 3 and answerer.counts["unknown"] == 3  # each malformed sample: an abstention
    assert answerer.counts["dropped_lines"] == 6  # two unparsable lines per sample, counted


class _WithLogprobs(_Echo):
    """An unconstrained endpoint that returns its text's tokens and their log-probabilities."""

    def __init__(self, tokens: list[str], logprobs: list[float]) -> None:
        self.tokens, self.logprobs = tokens, logprobs

    def generate_with_params(self, batch, params, choices=None):
        from kglightning.llm.backends.base import Generation

        text = "".join(self.tokens)
        return [Generation(text, token_logprobs=list(self.logprobs), tokens=list(self.tokens)) for _ in batch]


@pytest.mark.parametrize(
    ("tokens", "logprobs", "first", "expected"),
    [
        (["Par", "is", ""], [-0.2, -0.4, -0.1], "Paris", (-0.6, 2)),  # an end token writes nothing
        (["Par", "is", "\n", "Euro"], [-0.2, -0.4, -1.5, -3.0], "Paris", (-0.6, 2)),  # the same answer, one more line
        (["London", "\n", "par", "is", "\n"], [-0.1, -0.5, -0.3, -0.2, -2.0], "Paris", (-0.5, 2)),  # its own line
        (["unknown"], [-0.7], None, (-0.7, 1)),  # an abstention: the whole generation
    ],
)
def test_the_answer_is_scored_by_its_own_tokens(encoder, tmp_path, tokens, logprobs, first, expected):
    answerer = KAPINGAnswerer(_WithLogprobs(tokens, logprobs), encoder=encoder, cache_dir=str(tmp_path),
                              constrained=False, show_progress=False,
                              generation=GenerationParams(max_new_tokens=8, logprobs=True))  # type: ignore[arg-type]  # fmt: skip
    (out,) = answerer.propose(RECORDS[:1])
    info = out.extra["kaping"]
    assert (out.prediction or [None])[0] == first
    assert (info["logprob"], info["tokens"]) == (pytest.approx(expected[0]), expected[1])
    assert answerer.counts["logprob_unaligned"] == 0


def test_an_answer_line_the_tokens_do_not_show_falls_back_to_the_whole_generation_and_is_counted(encoder, tmp_path):
    # a backend whose tokens miss the text's first line (a response prefix): the answer is on line 1 of the text
    class Prefixed(_WithLogprobs):
        def generate_with_params(self, batch, params, choices=None):
            return [replace(g, text="London\n" + g.text) for g in super().generate_with_params(batch, params)]

    answerer = KAPINGAnswerer(Prefixed(["Paris"], [-0.4]), encoder=encoder, cache_dir=str(tmp_path),
                              constrained=False, show_progress=False,
                              generation=GenerationParams(max_new_tokens=8, logprobs=True))  # type: ignore[arg-type]  # fmt: skip
    (out,) = answerer.propose(RECORDS[:1])
    assert out.prediction == ["Paris"] and out.extra["kaping"]["logprob"] == pytest.approx(-0.4)
    assert answerer.counts["logprob_unaligned"] == 1


@pytest.mark.parametrize(
    ("text_head", "tokens", "logprobs"),
    [
        ("Answers:\n", ["Paris", "\n", "Euro"], [-0.1, -0.2, -5.0]),  # a prefix with a line break, not in the tokens
        ("", ["<think>ok", "\n", "Paris"], [-0.01, -0.01, -7.0]),  # tokens of a reasoning the text leaves out
    ],
)
def test_tokens_shifted_against_the_text_never_score_another_line(encoder, tmp_path, text_head, tokens, logprobs):
    class Shifted(_WithLogprobs):
        def generate_with_params(self, batch, params, choices=None):
            text = text_head + "Paris\nEuro" if text_head else "Paris"
            return [replace(g, text=text) for g in super().generate_with_params(batch, params)]

    answerer = KAPINGAnswerer(Shifted(tokens, logprobs), encoder=encoder, cache_dir=str(tmp_path), constrained=False,
                              show_progress=False, generation=GenerationParams(max_new_tokens=8, logprobs=True))  # type: ignore[arg-type]  # fmt: skip
    (out,) = answerer.propose(RECORDS[:1])
    assert out.prediction[0] == "Paris"
    assert out.extra["kaping"]["logprob"] == pytest.approx(sum(logprobs))  # the whole generation, counted
    assert answerer.counts["logprob_unaligned"] == 1


@pytest.mark.parametrize(
    "change",
    [
        {"generation": GenerationParams(max_new_tokens=48, top_p=0.9)},
        {"generation": GenerationParams(max_new_tokens=48, stop=("\n\n",))},
        {"generation": GenerationParams(max_new_tokens=48, logprobs=True)},
        {"generation": GenerationParams(max_new_tokens=32)},
        {"generation": GenerationParams(max_new_tokens=48, temperature=0.7)},
        {"generation": GenerationParams(max_new_tokens=48, seed=1)},
        {"instruction": "Answer with node names."},
        {"top_triples": 3},
        {"max_answers": 2},
        {"constrained": False},
        {"reasoning": True},
    ],
)
def test_every_setting_that_changes_a_proposal_is_in_its_cache_key(encoder, tmp_path, change):
    base = KAPINGAnswerer(_Echo("x"), encoder=encoder, cache_dir=str(tmp_path))  # type: ignore[arg-type]
    assert KAPINGAnswerer(_Echo("x"), encoder=encoder, cache_dir=str(tmp_path), **change).cache_key != base.cache_key  # type: ignore[arg-type]


def test_reasoning_settings_are_in_the_key_and_display_settings_are_not(encoder, tmp_path):
    def key(**kw):
        return KAPINGAnswerer(_Echo("x"), encoder=encoder, **{"cache_dir": str(tmp_path), **kw}).cache_key  # type: ignore[arg-type]

    assert key(reasoning=True) != key(reasoning=True, reasoning_tokens=32) != key(reasoning=True, max_cited=1)
    assert key() == key(show_progress=False) == key(cache_dir=str(tmp_path / "other"))
