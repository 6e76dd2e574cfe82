"""The full embedded KG: uniquely named entities, directed triples, and indexes for path following.

Nodes and relations are integers internally (names in :attr:`KnowledgeGraph.names`); triples are sorted, so the
integer ids are deterministic. A *step* is a relation name, or ``"~" + relation`` to walk it from tail to head.
"""

from __future__ import annotations

from collections.abc import Iterable

from .factset import FactSet
from .names import assign_unique_names, clean, is_qualified


class KnowledgeGraph:
    """A directed multigraph over named entities, built from a :class:`~.factset.FactSet`.

    Args:
        facts: the entities and triples (entity keys); entities that occur in no triple are left out.

    Example:
        >>> fs = FactSet()
        >>> fs.entity("c:PE", "country", ["Peru"]); fs.entity("x:1", "city", ["Lima"])
        >>> fs.add("c:PE", "location.country.capital", "x:1")
        >>> kg = KnowledgeGraph(fs)
        >>> sorted(kg.names[n] for n in kg.follow([kg.index["Lima"]], ["~location.country.capital"]))
        ['Peru']
    """

    def __init__(self, facts: FactSet):
        names = assign_unique_names(list(facts.entities.values()))
        used = {k for h, _, t in facts.triples for k in (h, t)}
        keys = sorted(used, key=lambda k: (names[k], k))
        self.keys: list[str] = keys
        self.names: list[str] = [names[k] for k in keys]
        self.kinds: list[str] = [facts.entities[k].kind for k in keys]
        self.qualified: list[bool] = [
            names[k] != clean(facts.entities[k].candidates[0]) or is_qualified(names[k]) for k in keys
        ]
        self.index: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        by_key = {k: i for i, k in enumerate(keys)}
        self.relations: list[str] = sorted({r for _, r, _ in facts.triples})
        self.rel_index: dict[str, int] = {r: i for i, r in enumerate(self.relations)}
        triples = sorted({(by_key[h], self.rel_index[r], by_key[t]) for h, r, t in facts.triples})
        self._named = [(self.names[h], self.relations[r], self.names[t]) for h, r, t in triples]
        self.heads = [h for h, _, _ in triples]
        self.rels = [r for _, r, _ in triples]
        self.tails = [t for _, _, t in triples]
        self.out_edges: dict[tuple[int, int], list[int]] = {}
        self.in_edges: dict[tuple[int, int], list[int]] = {}
        for tid, (h, r, t) in enumerate(triples):
            self.out_edges.setdefault((h, r), []).append(tid)
            self.in_edges.setdefault((t, r), []).append(tid)
        groups: list[dict[tuple[int, bool], list[int]]] = [{} for _ in keys]
        for (h, r), tids in self.out_edges.items():
            groups[h][(r, True)] = tids
        for (t, r), tids in self.in_edges.items():
            groups[t][(r, False)] = tids
        #: per node, its incident triple ids grouped by (relation, outgoing?) in a fixed order
        self.incident: list[list[list[int]]] = [[g[k] for k in sorted(g)] for g in groups]
        self.degree: list[int] = [sum(len(x) for x in g) for g in self.incident]
        #: what the fact loaders repaired or dropped (see :meth:`FactSet.quality_report`)
        self.quality: dict[str, dict] = facts.quality_report()

    def __len__(self) -> int:
        return len(self.names)

    @property
    def num_triples(self) -> int:
        return len(self.heads)

    def triple(self, tid: int) -> tuple[str, str, str]:
        """Triple ``tid`` as ``(head name, relation, tail name)``."""
        return self._named[tid]

    def parse_step(self, step: str) -> tuple[int, bool]:
        """``(relation id, forward?)`` for a step such as ``"~location.country.capital"``."""
        forward = not step.startswith("~")
        return self.rel_index[step.lstrip("~")], forward

    def step_edges(self, node: int, step: str) -> list[tuple[int, int]]:
        """``(triple id, neighbour)`` pairs reached from ``node`` by one step."""
        rel, forward = self.parse_step(step)
        if forward:
            return [(tid, self.tails[tid]) for tid in self.out_edges.get((node, rel), ())]
        return [(tid, self.heads[tid]) for tid in self.in_edges.get((node, rel), ())]

    def follow(self, starts: Iterable[int], path: Iterable[str]) -> set[int]:
        """All nodes reached from ``starts`` by walking ``path`` (a list of steps)."""
        frontier = set(starts)
        for step in path:
            frontier = {other for node in frontier for _, other in self.step_edges(node, step)}
            if not frontier:
                break
        return frontier

    def has_step(self, node: int, step: str) -> bool:
        """Whether ``node`` has at least one edge for ``step``."""
        rel, forward = self.parse_step(step)
        return bool((self.out_edges if forward else self.in_edges).get((node, rel)))

    def nodes_of_kind(self, kinds: Iterable[str]) -> list[int]:
        """Node ids of the given entity kinds, in id order."""
        wanted = set(kinds)
        return [i for i, k in enumerate(self.kinds) if k in wanted]

    def stats(self) -> dict[str, int]:
        """Entity, relation and triple counts."""
        return {"entities": len(self.names), "relations": len(self.relations), "triples": self.num_triples}
