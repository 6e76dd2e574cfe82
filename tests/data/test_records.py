"""Validation of the RoG record schema (kglightning.data.records)."""

import copy
import math
import pickle
from dataclasses import replace

import pytest

from kglightning.data import KGQARecord, RecordError


def good(**over):
    rec = {
        "id": "WebQTest-1",
        "question": "what is the capital of france",
        "answer": ["Paris"],
        "q_entity": ["France"],
        "a_entity": ["Paris"],
        "graph": [
            ["France", "location.country.capital", "Paris"],
            ["Paris", "location.location.containedby", "France"],
        ],
    }
    rec.update(over)
    return rec


def error_of(data, **kw) -> RecordError:
    with pytest.raises(RecordError) as info:
        KGQARecord.from_dict(data, source="f.jsonl", line=7, **kw)
    return info.value


def test_valid_record():
    r = KGQARecord.from_dict(good())
    assert r.id == "WebQTest-1" and r.answer == ["Paris"]
    assert r.graph == [
        ("France", "location.country.capital", "Paris"),
        ("Paris", "location.location.containedby", "France"),
    ]
    assert r.prediction is None and r.confidence is None and r.extra == {}


@pytest.mark.parametrize("name", ["id", "question", "answer", "q_entity", "a_entity", "graph"])
def test_missing_field_names_file_line_field(name):
    data = good()
    del data[name]
    e = error_of(data)
    assert (e.source, e.line, e.field) == ("f.jsonl", 7, name)
    assert str(e).startswith("f.jsonl:7:") and name in str(e)


@pytest.mark.parametrize(
    "name,value",
    [
        ("id", ""),
        ("id", None),
        ("id", True),
        ("id", 1.5),
        ("question", ""),
        ("question", "   "),
        ("question", 3),
        ("answer", None),
        ("answer", {"a": 1}),
        ("answer", ["Paris", 3]),
        ("q_entity", [None]),
        ("a_entity", 5),
        ("graph", "France capital Paris"),
        ("prediction", [1, 2]),
    ],
)
def test_wrong_type(name, value):
    assert error_of(good(**{name: value})).field == name


def test_not_an_object():
    e = error_of(["id", "question"])
    assert e.field is None and "JSON object" in str(e)


@pytest.mark.parametrize(
    "triple", [["France", "capital"], ["a", "b", "c", "d"], "abc", ["France", None, "Paris"], ["a", "r", 3], None]
)
def test_bad_triple(triple):
    e = error_of(good(graph=[["x", "r", "y"], triple]))
    assert e.field == "graph" and "triple 1" in str(e)


def test_graph_null_is_empty_and_int_id_is_coerced():
    r = KGQARecord.from_dict(good(graph=None, id=12))
    assert r.graph == [] and r.id == "12"


def test_bare_string_coerced_to_list():
    r = KGQARecord.from_dict(good(answer="Paris", q_entity="France", a_entity="Paris", prediction="Paris"))
    assert r.answer == ["Paris"] and r.q_entity == ["France"] and r.a_entity == ["Paris"] and r.prediction == ["Paris"]


def test_confidence_rules():
    r = KGQARecord.from_dict(good(prediction=["Paris", "Lyon"], confidence=[0.9, 0]))
    assert r.confidence == [0.9, 0.0] and all(isinstance(c, float) for c in r.confidence)
    assert "2 values for 1" in str(error_of(good(prediction=["Paris"], confidence=[0.5, 0.5])))
    assert "without 'prediction'" in str(error_of(good(confidence=[0.5])))
    for bad in (1.5, -0.1, math.nan, math.inf, True, "0.5", None):
        e = error_of(good(prediction=["Paris"], confidence=[bad]))
        assert e.field == "confidence" and "item 0" in str(e)
    assert error_of(good(prediction=["Paris"], confidence=0.5)).field == "confidence"


def test_round_trip_keeps_extra_and_optional_fields():
    data = good(prediction=["Paris"], confidence=[0.75], choices=[], meta={"split": "test", "n": [1, 2]})
    r = KGQARecord.from_dict(copy.deepcopy(data))
    assert r.extra == {"choices": [], "meta": {"split": "test", "n": [1, 2]}}
    assert r.to_dict() == data
    assert KGQARecord.from_dict(r.to_dict()) == r


def test_to_dict_omits_unset_optionals():
    d = KGQARecord.from_dict(good()).to_dict()
    assert "prediction" not in d and "confidence" not in d
    assert d["graph"][0] == ["France", "location.country.capital", "Paris"]


def test_record_error_pickles_unchanged():
    e = RecordError("bad", source="f.jsonl", line=3, field="graph")
    e2 = pickle.loads(pickle.dumps(e))
    assert str(e2) == str(e) == "f.jsonl:3: field 'graph' bad"
    assert (e2.source, e2.line, e2.field, e2.reason) == ("f.jsonl", 3, "graph", "bad")
    assert isinstance(e2, ValueError)


PATHS = [[["France", "location.country.capital", "Paris"]], [], [["France", "r", "m.0x", "s", "Lyon"]]]


def test_prediction_paths_round_trip_one_entry_per_prediction():
    data = good(prediction=["Paris", "Paris", "Lyon"], prediction_paths=PATHS)
    r = KGQARecord.from_dict(copy.deepcopy(data))
    assert r.prediction == ["Paris", "Paris", "Lyon"]  # repeats are votes: kept
    assert r.prediction_paths == PATHS and r.extra == {}
    assert r.to_dict() == data and KGQARecord.from_dict(r.to_dict()) == r
    assert list(r.to_dict())[-1] == "prediction_paths"
    assert "prediction_paths" not in KGQARecord.from_dict(good(prediction=["Paris"])).to_dict()
    assert KGQARecord.from_dict(good(prediction=["Paris"], prediction_paths=None)).prediction_paths is None
    tuples = KGQARecord.from_dict(good(prediction=["Paris"], prediction_paths=((("a", "r", "b"),),)))
    assert tuples.prediction_paths == [[["a", "r", "b"]]]


def test_a_copy_whose_prediction_was_replaced_without_its_paths_is_not_written():
    r = KGQARecord.from_dict(good(prediction=["Paris", "Lyon", "Lyon"], prediction_paths=PATHS))
    for stale in (replace(r, prediction=["Nice"]), replace(r, prediction=None)):
        with pytest.raises(RecordError, match="set prediction_paths whenever prediction is replaced") as err:
            stale.to_dict()
        assert err.value.field == "prediction_paths"
    assert replace(r, prediction=["Nice"], prediction_paths=None).to_dict()["prediction"] == ["Nice"]


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"prediction_paths": [[]]}, "without 'prediction'"),
        ({"prediction": ["Paris", "Lyon"], "prediction_paths": [[]]}, "1 entries for 2 predictions"),
        ({"prediction": ["Paris"], "prediction_paths": "France -> r -> Paris"}, "expected a list of path lists"),
        ({"prediction": ["Paris"], "prediction_paths": [None]}, "entry 0 is NoneType"),
        ({"prediction": ["Paris"], "prediction_paths": [["France -> r -> Paris"]]}, "entry 0 path 0 is not a list"),
        ({"prediction": ["Paris"], "prediction_paths": [[["France", "r"]]]}, "entry 0 path 0 has 2 items"),
        ({"prediction": ["Paris"], "prediction_paths": [[["a", "r", "b"], ["a", "r", "b", "s"]]]}, "path 1 has 4"),
        ({"prediction": ["Paris"], "prediction_paths": [[["a", "", "b"]]]}, "non-empty strings"),
        ({"prediction": ["Paris"], "prediction_paths": [[["a", 1, "b"]]]}, "non-empty strings"),
    ],
)
def test_malformed_prediction_paths_name_the_field_and_item(over, needle):
    e = error_of(good(**over))
    assert (e.source, e.line, e.field) == ("f.jsonl", 7, "prediction_paths") and needle in str(e)
