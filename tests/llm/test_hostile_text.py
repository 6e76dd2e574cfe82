"""Parsers of model output on hostile text: linear time on long whitespace runs and tag fragments, and never an
exception (issue 28, item 1). ``pytest-timeout`` guards against a hang; the inputs are sized so that the old
backtracking patterns (about n**4 steps for a run of n spaces) would take hours."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kglightning.evidence.format import parse_evidence
from kglightning.llm.node_judges import parse_verdict
from kglightning.llm.parsing import parse_answers
from kglightning.llm.trie.names import NameChoice

RUN = 20_000  # characters of one adversarial run
TAG_RUN = 100_000  # the old tag pattern was quadratic: about a minute for this


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("text", "answers"),
    [
        (" " * RUN + "Paris", {}),
        ("Paris" + " " * RUN + "[Confidence: 0.8]", {"Paris": 0.8}),
        ("a" + " " * RUN + ":" + " " * RUN + "0.5", {"a": 0.5}),
        ("{" + " " * RUN + "Paris" + " " * RUN + ": 0.4}", {"Paris": 0.4}),
        ("\t \n" * RUN + "Lyon: 0.5", {"Lyon": 0.5}),
        ("Answer: x\n" * 3000 + "Confidence: 0.5", {"x": 0.5}),
        ("x" * RUN, {}),
        ('{"Paris": 1' + "0" * 400 + "}", {"Paris": None}),  # an integer too large for a float: no confidence
        ("{" + ", ".join(f"k{i}: v" for i in range(3000)) + ": 0.5}", None),  # many ':' in one lenient key
    ],
    ids=[
        "leading-spaces",
        "spaces-before-confidence",
        "spaces-around-colon",
        "spaces-in-braces",
        "blank-lines",
        "answer-lines",
        "long-word",
        "huge-integer",
        "colons-in-a-key",
    ],
)
def test_answers_on_long_whitespace_runs(text, answers):
    parsed = parse_answers(text)
    assert answers is None or parsed.answers == answers


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("text", "relations"),
    [
        ("<" + " " * TAG_RUN, []),
        ("</" + " " * TAG_RUN, []),
        ("<PATH confidence=" + " " * TAG_RUN + "0.5 >r</PATH>", [("r",)]),
        ("<" * RUN, []),
        ("<PATH>" * 2000 + "r</PATH>", [("r",)]),  # the last block reads; the 1,999 unclosed ones are counted
    ],
    ids=["lt-spaces", "close-spaces", "attribute-spaces", "many-lt", "unclosed-paths"],
)
def test_evidence_tags_on_long_runs(text, relations):
    result = parse_evidence(text)
    assert [z.relations for z in result.evidence] == relations
    assert result.issues.count("unclosed_tag") == (1999 if text.startswith("<PATH><PATH>") else 0)


_FRAGMENTS = st.sampled_from(
    [" ", "\t", "\n", " " * 50, "<", ">", "</", "PATH", "CONSTRAINT", "SEP", "<SEP>", "confidence=", "0.7", "1e9",
     "nan", "{", "}", "[", "]", ":", ",", '"', "'", "%", "->", "Answer:", "Confidence:", "yes", "no", "not",
     "unknown", "Paris", "\u2022", "\ud7ff", "\x00"]
)  # fmt: skip
HOSTILE = st.one_of(st.text(max_size=300), st.lists(_FRAGMENTS, max_size=120).map("".join))


@pytest.mark.timeout(60)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HOSTILE)
def test_answer_parser_returns_a_parse_or_an_abstention(text):
    parsed = parse_answers(text)
    for answer, conf in parsed.answers.items():
        assert answer == answer.strip() and answer
        assert conf is None or (0.0 <= conf <= 1.0 and not math.isnan(conf))
    assert parsed.answers or parsed.issues  # nothing read is a counted abstention


@pytest.mark.timeout(60)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HOSTILE)
def test_evidence_parser_never_raises_and_keeps_confidences_in_range(text):
    result = parse_evidence(text)
    assert all(z.confidence is None or 0.0 <= z.confidence <= 1.0 for z in result.evidence)
    assert result.evidence or result.issues or not text.strip()


@pytest.mark.timeout(60)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HOSTILE)
def test_verdicts_and_name_lists_never_raise(text):
    assert parse_verdict(text) in (True, False, None)
    names, abstained, dropped = NameChoice(("Paris", "Lyon")).parse(text)
    assert set(names) <= {"Paris", "Lyon"} and dropped >= 0 and isinstance(abstained, bool)


_KEYS = [
    "choices",
    "message",
    "content",
    "logprobs",
    "token",
    "logprob",
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "x",
]
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.heavy
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json)
def test_a_chat_completion_body_parses_or_raises_a_response_error(payload):
    from kglightning.llm.backends import Generation, LLMResponseError
    from kglightning.llm.backends.chat_response import parse_chat_completion

    try:
        gen = parse_chat_completion(payload)
    except LLMResponseError:
        return
    assert isinstance(gen, Generation) and isinstance(gen.text, str)
    gen.text.encode("utf-8")  # always writable
    assert gen.token_logprobs is None or all(lp <= 0 for lp in gen.token_logprobs)
