"""Grounded path instances of an evidence and their text (DoublyCal §4.3)."""

from __future__ import annotations

from kglightning.data.kg import KGIndex
from kglightning.evidence.schema import Evidence
from kglightning.evidence.verbalize import path_instances, verbalize_instance

KG = KGIndex.from_triples(
    [
        ("Snoopy", "sibling_of", "Spike"),
        ("Snoopy", "sibling_of", "Belle"),
        ("Snoopy", "sibling_of", "Spike"),  # a repeated triple gives one instance
        ("Spike", "gender", "Male"),
        ("Belle", "gender", "Female"),
        ("Charlie", "owns", "Snoopy"),
        ("Spike", "lives_in", "Needles"),
    ]
)


def test_forward_hops_and_constraint():
    both = path_instances(KG, ["Snoopy"], Evidence(None, ("sibling_of",)))
    assert sorted(both) == [["Snoopy", "sibling_of", "Belle"], ["Snoopy", "sibling_of", "Spike"]]  # no duplicate
    male = path_instances(KG, ["Snoopy"], Evidence(None, ("sibling_of",), ("gender", "Male")))
    assert male == [["Snoopy", "sibling_of", "Spike"]]
    nobody = path_instances(KG, ["Snoopy"], Evidence(None, ("sibling_of",), ("gender", "Other")))
    assert nobody == []


def test_reverse_hop_and_two_hops():
    owner = path_instances(KG, ["Spike"], Evidence(None, ("~sibling_of", "~owns")))
    assert owner == [["Spike", "~sibling_of", "Snoopy", "~owns", "Charlie"]]
    # a reverse constraint: the sibling whose brother Snoopy is owned by Charlie
    owned = path_instances(KG, ["Belle"], Evidence(None, ("~sibling_of",), ("~owns", "Charlie")))
    assert owned == [["Belle", "~sibling_of", "Snoopy"]]


def test_limit_and_topics():
    assert len(path_instances(KG, ["Snoopy"], Evidence(None, ("sibling_of",)), limit=1)) == 1
    assert len(path_instances(KG, ["Snoopy"], Evidence(None, ("sibling_of",)), limit=None)) == 2
    # the evidence's own topic wins over the record's topics; unknown topics are skipped
    own = path_instances(KG, ["Belle"], Evidence("Snoopy", ("sibling_of",), ("gender", "Female")))
    assert own == [["Snoopy", "sibling_of", "Belle"]]
    assert path_instances(KG, ["Woodstock", "Charlie"], Evidence(None, ("owns",))) == [["Charlie", "owns", "Snoopy"]]
    assert path_instances(KG, ["Woodstock"], Evidence(None, ("owns",))) == []
    # duplicated topics do not duplicate instances
    assert path_instances(KG, ["Charlie", "Charlie"], Evidence(None, ("owns",))) == [["Charlie", "owns", "Snoopy"]]


def test_verbalize_instance():
    assert verbalize_instance(["Snoopy"]) == "Snoopy"
    assert verbalize_instance(["Charlie", "owns", "Snoopy", "sibling_of", "Spike"]) == (
        "Charlie -> owns -> Snoopy -> sibling_of -> Spike"
    )
    assert verbalize_instance(["Spike", "~sibling_of", "Snoopy"], ("~owns", "Charlie")) == (
        "Spike <- sibling_of <- Snoopy (owns <- Charlie)"
    )
    assert verbalize_instance(["Snoopy", "sibling_of", "Spike"], ("lives_in", "Needles")) == (
        "Snoopy -> sibling_of -> Spike (lives_in -> Needles)"
    )
