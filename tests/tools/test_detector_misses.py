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
    assert misses.mistake_kind(record(hops, in_graph), name) == kind


def test_group_rates():
    rows = [{"hallucinated": True, "flagged": True, "kind": "a"}, {"hallucinated": True, "flagged": False, "kind": "a"},
            {"hallucinated": False, "flagged": True, "kind": "a"}, {"hallucinated": False, "flagged": False, "kind": "b"}]  # fmt: skip
    a, b = misses.summarize(rows, lambda r: r["kind"])
    assert (a["nodes"], a["hallucinated"], a["recall"], a["false_alarms"]) == (3, 2 / 3, 0.5, 1.0)
    assert a["f1"] == pytest.approx(2 * 1 / (2 * 1 + 1 + 1))
    assert b["recall"] != b["recall"] and "| b | 1 | 0.0% | – | 0.0% | – |" in misses.table("g", [a, b])
