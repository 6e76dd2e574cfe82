"""The proxy's ``<PATH>`` evidence format: templates, formatting, and the parser's leniency and strictness."""

from __future__ import annotations

import pytest

from kglightning.evidence.format import (
    Constraint,
    ParseStats,
    PathEvidence,
    format_evidence,
    parse_evidence,
    qa_input,
    qa_target,
    rl_input,
    sft_input,
)


def test_templates_are_the_papers():
    q = "what is the name of snoopy's brother?"
    assert sft_input(q) == (
        "Please generate a valid relation path that can be helpful for answering the following question: " + q
    )
    assert rl_input(q) == (
        "Please generate an enhanced relation path with well-calibrated confidence that can be helpful for "
        "answering the following question: " + q
    )


def test_qa_template_follows_rog_layout():
    text = qa_input("where is paris", ["Paris -> capital_of -> France", "Paris -> ~located_in -> Eiffel Tower"])
    instruction, paths, question = text.split("\n\n")
    assert instruction.startswith("Based on the reasoning paths, please answer the given question.")
    assert paths.splitlines() == [
        "Reasoning Paths:",
        "Paris -> capital_of -> France",
        "Paris -> ~located_in -> Eiffel Tower",
    ]
    assert question == "Question:\nwhere is paris?"
    assert qa_input("where is paris?", []).endswith("Question:\nwhere is paris?")
    assert qa_target(["France", "Île-de-France"]) == "France\nÎle-de-France"


def test_format_exact_target():
    assert (
        format_evidence(["r1", "r2"], ("r_c", "c"), 0.75)
        == "<PATH confidence=0.75>r1<SEP>r2<CONSTRAINT>r_c<SEP>c</CONSTRAINT></PATH>"
    )
    assert format_evidence(["r1"], confidence=0.5) == "<PATH confidence=0.50>r1</PATH>"
    assert format_evidence(["r1"], confidence=1 / 3, digits=4) == "<PATH confidence=0.3333>r1</PATH>"
    assert format_evidence(["r1"], confidence=1.0, digits=0) == "<PATH confidence=1>r1</PATH>"
    assert format_evidence(["r1"]) == "<PATH>r1</PATH>"


@pytest.mark.parametrize(
    "relations, constraint, confidence",
    [
        (["people.person.sibling_s"], None, 0.5),
        (["~film.film.directed_by", "people.person.nationality"], ("people.person.gender", "Male"), 0.75),
        (["~a", "~b", "c", "~d"], ("~award.award_winner", "Academy Award for Best Actor"), 0.0),
        (["sibling of"], ("gender", "Male , female"), 1.0),
        (["r"], None, None),
    ],
)
@pytest.mark.parametrize("position", ["open", "after"])
def test_round_trip(relations, constraint, confidence, position):
    text = format_evidence(relations, constraint, confidence, confidence_position=position)
    result = parse_evidence(f"some prefix {text} and suffix")
    assert result.ok and result.issues == []
    (ev,) = result.evidence
    assert ev.relations == tuple(relations)
    assert ev.constraint == (None if constraint is None else Constraint(*constraint))
    assert ev.confidence == confidence
    assert ev.format(confidence_position=position) == text
    assert ev.span is not None and text == f"some prefix {text} and suffix"[ev.span[0] : ev.span[1]]


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<PATH confidence=0.5>r</PATH><CONFIDENCE>0.7</CONFIDENCE>", "invalid_attribute"),  # two confidences
        ("<PATH>r</PATH><CONFIDENCE>high</CONFIDENCE>", "invalid_confidence"),
        ("<PATH>r</PATH> <CONFIDENCE>1.5</CONFIDENCE>", "confidence_out_of_range"),
        ("<PATH>r</PATH><CONFIDENCE>0.5", "invalid_confidence"),  # the element never closes
        ("<PATH>r</PATH>", "missing_confidence"),
    ],
)
def test_trailing_confidence_errors(text, reason):
    result = parse_evidence(text, require_confidence=True)
    assert not result.evidence and result.issues == [reason]


def test_trailing_confidence_is_lenient_and_belongs_to_its_block():
    r = parse_evidence("<path> a <SEP> b </path>\n < confidence > '0.25' </ CONFIDENCE>  <PATH>c</PATH> x")
    assert [(z.relations, z.confidence) for z in r.evidence] == [(("a", "b"), 0.25), (("c",), None)]
    with pytest.raises(ValueError, match="confidence_position"):
        format_evidence(["r"], confidence=0.5, confidence_position="before")


def test_round_trip_rounds_confidence_to_digits():
    (ev,) = parse_evidence(format_evidence(["r"], confidence=0.12345, digits=3)).evidence
    assert ev.confidence == 0.123


def test_format_strips_names_keeps_their_inner_whitespace_and_rejects_bad_fields():
    assert format_evidence(["  people.person.\n  gender "], confidence=0.5) == (
        "<PATH confidence=0.50>people.person.\n  gender</PATH>"
    )
    for bad in ([], [""], ["  "], ["~"], ["a<SEP>b"], ["a>b"]):
        with pytest.raises(ValueError):
            format_evidence(bad, confidence=0.5)
    with pytest.raises(TypeError):
        format_evidence("r1", confidence=0.5)
    with pytest.raises(ValueError):
        format_evidence(["r"], ("g",), 0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        format_evidence(["r"], ("g", ""), 0.5)
    for conf in (-0.01, 1.01, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            format_evidence(["r"], confidence=conf)
    with pytest.raises(ValueError):
        format_evidence(["r"], confidence=0.5, digits=-1)


@pytest.mark.parametrize(
    "text",
    [
        "<PATH confidence=0.75>sibling_of<CONSTRAINT>gender<SEP>male</CONSTRAINT></PATH>",
        "<PATH confidence=0.75>sibling_of <CONSTRAINT>gender<SEP>male </CONSTRAINT></PATH>",  # the paper's example
        "<PATH confidence = 0.75 >\n  sibling_of\n<CONSTRAINT>\n gender <SEP> male\n</CONSTRAINT>\n</PATH>",
        '<PATH confidence="0.75">sibling_of<CONSTRAINT>gender<SEP>male</CONSTRAINT></PATH>',
        "<PATH confidence='.75'>sibling_of<CONSTRAINT>gender<SEP>male</CONSTRAINT></PATH>",
        "< PATH confidence=7.5e-1>sibling_of< CONSTRAINT >gender< SEP >male</ CONSTRAINT ></ PATH >",
        "<path confidence=0.75>sibling_of<constraint>gender<sep>male</constraint></path>",
    ],
)
def test_whitespace_quote_and_case_leniency(text):
    result = parse_evidence(text)
    assert result.issues == []
    assert result.evidence == [PathEvidence(("sibling_of",), Constraint("gender", "male"), 0.75)]


def test_reverse_relations_kept_verbatim():
    (ev,) = parse_evidence(
        "<PATH confidence=0.5>~location.country.capital <SEP> ~people.person.nationality</PATH>"
    ).evidence
    assert ev.relations == ("~location.country.capital", "~people.person.nationality")


def test_several_blocks_in_order_with_text_between():
    text = (
        "Here are paths:\n<PATH confidence=0.9>a<SEP>b</PATH>\n2) <PATH confidence=0.1>c</PATH>"
        " junk <SEP> outside is ignored <PATH>d</PATH>"
    )
    result = parse_evidence(text)
    assert [e.relations for e in result.evidence] == [("a", "b"), ("c",), ("d",)]
    assert [e.confidence for e in result.evidence] == [0.9, 0.1, None]
    assert result.ok


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<PATH confidence=0.5>r1<SEP>r2", "unclosed_tag"),
        ("<PATH confidence=0.5>a<PATH confidence=0.3>b</PATH></PATH>", "nested_tags"),
        ("r1<SEP>r2</PATH>", "unbalanced_tags"),
        ("<PATH confidence=0.5>r1<CONSTRAINT>g<SEP>m</PATH>", "unbalanced_tags"),
        ("<PATH confidence=0.5>r1</CONSTRAINT></PATH>", "unbalanced_tags"),
        ("<PATH confidence=0.5>r<CONSTRAINT>a<CONSTRAINT>b<SEP>c</CONSTRAINT></CONSTRAINT></PATH>", "nested_tags"),
        (
            "<PATH confidence=0.5>r<CONSTRAINT>g<SEP>m</CONSTRAINT><CONSTRAINT>g<SEP>m</CONSTRAINT></PATH>",
            "invalid_structure",
        ),
        ("<PATH confidence=0.5>r<CONSTRAINT>g<SEP>m</CONSTRAINT>r2</PATH>", "invalid_structure"),
        ("<PATH confidence=0.5>r1</SEP>r2</PATH>", "invalid_structure"),
        ("<PATH confidence=0.5>r1<SEP x>r2</PATH>", "invalid_structure"),
        ("<PATH confidence=0.5>r1</PATH x>", "invalid_structure"),
        ("<PATH confidence=0.5></PATH>", "empty_relation"),
        ("<PATH confidence=0.5>   \n </PATH>", "empty_relation"),
        ("<PATH confidence=0.5>r1<SEP></PATH>", "empty_relation"),
        ("<PATH confidence=0.5><SEP>r1</PATH>", "empty_relation"),
        ("<PATH confidence=0.5>r1<SEP> <SEP>r2</PATH>", "empty_relation"),
        ("<PATH confidence=0.5>~</PATH>", "empty_relation"),
        ("<PATH confidence=0.5><CONSTRAINT>g<SEP>m</CONSTRAINT></PATH>", "empty_relation"),
        ("<PATH confidence=0.5>r<CONSTRAINT>g</CONSTRAINT></PATH>", "invalid_constraint"),
        ("<PATH confidence=0.5>r<CONSTRAINT>g<SEP>m<SEP>x</CONSTRAINT></PATH>", "invalid_constraint"),
        ("<PATH confidence=0.5>r<CONSTRAINT>g<SEP> </CONSTRAINT></PATH>", "invalid_constraint"),
        ("<PATH confidence=0.5>r<CONSTRAINT><SEP>m</CONSTRAINT></PATH>", "invalid_constraint"),
        ("<PATH confidence=0.5>r<CONSTRAINT></CONSTRAINT></PATH>", "invalid_constraint"),
        ("<PATH confidence=0.5>r1<FOO>r2</PATH>", "stray_markup"),
        ("<PATH confidence=0.5>r1 -> r2</PATH>", "stray_markup"),
        ("<PATH conf=0.5>r</PATH>", "invalid_attribute"),
        ("<PATH 0.5>r</PATH>", "invalid_attribute"),
        ("<PATH confidence=high>r</PATH>", "invalid_confidence"),
        ("<PATH confidence=>r</PATH>", "invalid_confidence"),
        ("<PATH confidence=75%>r</PATH>", "invalid_confidence"),
        ('<PATH confidence="0.5>r</PATH>', "invalid_confidence"),
        ("<PATH confidence=0.5 source=kg>r</PATH>", "invalid_confidence"),
        ("<PATH confidence=0.5.1>r</PATH>", "invalid_confidence"),
        ("<PATH confidence=1.5>r</PATH>", "confidence_out_of_range"),
        ("<PATH confidence=-0.1>r</PATH>", "confidence_out_of_range"),
        ("<PATH confidence=nan>r</PATH>", "confidence_out_of_range"),
        ("<PATH confidence=inf>r</PATH>", "confidence_out_of_range"),
    ],
)
def test_malformed_blocks_are_counted_with_their_reason(text, reason):
    result = parse_evidence(text)
    assert result.evidence == []
    assert [m.reason for m in result.malformed] == [reason]
    assert result.issues == [reason] and not result.ok
    m = result.malformed[0]
    assert text[m.span[0] : m.span[1]] == m.text and m.text


def test_no_path_and_missing_confidence():
    for text in ("", "I cannot answer.", "r1<SEP>r2"):
        result = parse_evidence(text)
        assert result.no_path and result.issues == ["no_path"] and not result.ok
    assert parse_evidence("<PATH>r</PATH>").ok
    strict = parse_evidence("<PATH>r</PATH>", require_confidence=True)
    assert strict.issues == ["missing_confidence"] and strict.evidence == []


def test_malformed_blocks_do_not_hide_good_ones():
    text = (
        "</PATH>"  # stray close
        "<PATH confidence=0.5>r1<SEP>r2"  # never closed: malformed up to the next <PATH>
        "<PATH confidence=0.3>r3</PATH>"
        "<PATH confidence=2>r4</PATH>"
        "<PATH confidence=0.8>r5<SEP>~r6</PATH>"
        "<PATH confidence=0.1>r7"  # truncated generation
    )
    result = parse_evidence(text)
    assert [e.relations for e in result.evidence] == [("r3",), ("r5", "~r6")]
    assert result.issues == ["unbalanced_tags", "unclosed_tag", "confidence_out_of_range", "unclosed_tag"]
    assert result.malformed[1].text == "<PATH confidence=0.5>r1<SEP>r2"
    assert result.malformed[-1].text == "<PATH confidence=0.1>r7"


def test_balanced_nesting_is_one_malformed_block():
    text = "<PATH confidence=0.5>r1<PATH confidence=0.3>r3</PATH><PATH confidence=0.2>r4</PATH></PATH> <PATH>ok</PATH>"
    result = parse_evidence(text)
    assert result.issues == ["nested_tags"] and [e.relations for e in result.evidence] == [("ok",)]
    assert result.malformed[0].text == text[: text.index(" <PATH>ok")]


def test_parse_stats_accumulate_over_a_run():
    stats = ParseStats()
    outputs = [
        format_evidence(["a"], confidence=0.5),
        "<PATH confidence=0.5>a</PATH><PATH confidence=x>b</PATH>",
        "nothing",
        "<PATH confidence=0.5>a<SEP></PATH><PATH confidence=0.5>",
    ]
    results = [parse_evidence(o, stats=stats) for o in outputs]
    assert stats.total == 4 and stats.clean == 1
    assert stats.reasons == {"invalid_confidence": 1, "no_path": 1, "empty_relation": 1, "unclosed_tag": 1}
    assert sum(len(r.evidence) for r in results) == 2
    other = ParseStats()
    other.record(parse_evidence("<PATH confidence=0.5>a</PATH></PATH>"))
    merged = stats + other
    assert merged.total == 5 and merged.count("unbalanced_tags") == 1 and stats.total == 4


def test_to_evidence_record():
    (ev,) = parse_evidence(format_evidence(["~r1", "r2"], ("g", "Male"), 0.75)).evidence
    record = ev.to_evidence()
    assert record.topic is None and record.relations == ("~r1", "r2")
    assert record.constraint == ("g", "Male") and record.confidence == 0.75
