"""The Evidence record: validation, round trip, helpers."""

import json

import pytest

from kglightning.evidence import Evidence


def test_round_trip_through_json():
    items = [
        Evidence("Snoopy", ("sibling_of",), ("gender", "Male"), 0.75, 1, 1),
        Evidence(None, ["a", "~b", "c"]),
        Evidence("France", ("~location.location.containedby",), ("~capital", "France"), 0.5, 4, 2),
    ]
    for z in items:
        back = Evidence.from_dict(json.loads(json.dumps(z.to_dict())))
        assert back == z and hash(back) == hash(z)
        assert isinstance(back.relations, tuple) and (back.constraint is None or isinstance(back.constraint, tuple))


def test_fields_and_helpers():
    z = Evidence("q", ["r", "~s"], ["c", "e"])
    assert z.relations == ("r", "~s") and z.constraint == ("c", "e") and z.is_constrained
    assert z.path == Evidence("q", ("r", "~s")) and not z.path.is_constrained
    s = z.scored(0.25, 3, 1)
    assert (s.confidence, s.grounded, s.hits) == (0.25, 3, 1) and s.path == z.path
    assert str(s) == "q -> r -> ~s [c e] (0.25)" and str(Evidence(None, ("r",))) == "r"
    with pytest.raises(AttributeError):
        z.topic = "x"  # frozen


@pytest.mark.parametrize(
    "kwargs",
    [
        {"relations": ()},
        {"relations": "r"},
        {"relations": ("r", "")},
        {"relations": ("~",)},
        {"relations": ("r",), "constraint": ("c",)},
        {"relations": ("r",), "constraint": "ce"},
        {"relations": ("r",), "constraint": ("", "e")},
        {"relations": ("r",), "grounded": 1, "hits": 2},
    ],
)
def test_validation(kwargs):
    with pytest.raises(ValueError):
        Evidence("q", **kwargs)


def test_from_dict_minimal():
    assert Evidence.from_dict({"relations": ["r"]}) == Evidence(None, ("r",))
