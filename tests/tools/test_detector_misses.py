"""tools/detector_misses.py: kinds of mistake read from the subgraph, and the per-group rates."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kglightning.data.records import KGQARecord

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("detector_misses", ROOT / "tools/detector_misses.py")
misses = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(misses)

GRAPH = [("France", "capital", "Paris"), ("Paris", "river", "Seine"), ("France", "neighbour", "Spain"),
         ("Spain", "capital", "Madrid"), ("Mars", "moon", "Phobos")]  # fmt: skip


def record(hops: int, in_graph: bool = True) -> KGQARecord:
    return KGQARecord("q", "?", ["Seine"], ["France"], ["Seine"], GRAPH,
                      extra={"hops": hops, "answer_in_graph": in_graph, "kind": "compositional"})  # fmt: skip


@pytest.mark.parametrize(
    ("name", "hops", "in_graph", "kind"),
    [
        ("Paris", 2, True, "shorter path"),
        ("Madrid", 1, True, "longer path"),
        ("Madrid", 2, True, "same length, other relations"),
        ("Phobos", 2, True, "unreachable"),
        ("Paris", 2, False, "answer not in subgraph"),
    ],  # fmt: skip
)
def test_mistake_kinds(name, hops, in_graph, kind):
    assert misses.mistake_kind(record(hops, in_graph), name, grounded=True) == kind


def test_mistake_kinds_of_real_answers():
    assert misses.mistake_kind(record(2), "Atlantis", grounded=False) == "not a node"
    no_gold = KGQARecord("q", "?", ["Seine"], ["France"], ["Seine"], GRAPH)  # no gold hops: nothing to compare
    assert misses.mistake_kind(no_gold, "Madrid", grounded=True) == "a graph node (no gold path to compare)"
    assert misses._bucket(1, (1, 3, 10)) == "1" and misses._bucket(3, (1, 3, 10)) == "2-3"
    assert misses._bucket(11, (1, 3, 10)) == ">10"


def test_group_rates():
    rows = [{"hallucinated": True, "flagged": True, "kind": "a", "prob": 0.9, "baseline/s": 0.2},
            {"hallucinated": True, "flagged": False, "kind": "a", "prob": 0.4, "baseline/s": 0.6},
            {"hallucinated": False, "flagged": True, "kind": "a", "prob": 0.7, "baseline/s": 0.1},
            {"hallucinated": False, "flagged": False, "kind": "b", "prob": 0.1, "baseline/s": 0.5}]  # fmt: skip
    a, b = misses.summarize(rows, lambda r: r["kind"], ["s"])
    assert (a["nodes"], a["hallucinated"], a["recall"], a["false_alarms"]) == (3, 2 / 3, 0.5, 1.0)
    assert a["f1"] == pytest.approx(2 * 1 / (2 * 1 + 1 + 1))
    # average precision: the detector ranks 0.9 (h), 0.7 (f), 0.4 (h): (1 + 2/3) / 2; the baseline 0.6 (h), 0.2 (h)
    assert a["auc_pr"] == pytest.approx((1 + 2 / 3) / 2) and a["auc_pr/s"] == pytest.approx(1.0)
    assert b["recall"] != b["recall"] and b["auc_pr"] != b["auc_pr"]  # one class only: nothing to rank
    assert "| b | 1 | 0.0% | – | 0.0% | – | – | – |" in misses.table("g", [a, b])
