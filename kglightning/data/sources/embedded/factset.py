"""A growing bag of entities and facts keyed by internal ids, plus a data-quality log.

The fact loaders (:mod:`.facts_geography`, :mod:`.facts_elements`) write into a :class:`FactSet`; the KG
(:mod:`.kg`) then names the entities and indexes the triples.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .names import EntitySpec


@dataclass
class FactSet:
    """Entities (by key), triples between keys, and counters of what the loaders had to repair or drop.

    Example:
        >>> fs = FactSet()
        >>> fs.entity("country:PE", "country", ["Peru"])
        >>> fs.entity("city:1", "city", ["Lima"])
        >>> fs.add("country:PE", "location.country.capital", "city:1")
        >>> fs.note("capital: both sources agree")
        >>> len(fs.triples), fs.quality["capital: both sources agree"]
        (1, 1)
    """

    entities: dict[str, EntitySpec] = field(default_factory=dict)
    triples: set[tuple[str, str, str]] = field(default_factory=set)
    quality: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def entity(self, key: str, kind: str, candidates: list[str] | tuple[str, ...], rank: tuple = ()) -> None:
        """Register an entity; a key registered twice keeps its first definition."""
        if key not in self.entities:
            self.entities[key] = EntitySpec(key, kind, tuple(candidates), rank)

    def add(self, head: str, relation: str, tail: str) -> None:
        """Add a fact between two registered entities."""
        if head not in self.entities or tail not in self.entities:
            raise KeyError(f"fact ({head}, {relation}, {tail}) names an unregistered entity")
        if head != tail:
            self.triples.add((head, relation, tail))

    def note(self, issue: str, example: str | None = None, count: int = 1) -> None:
        """Count a data-quality event; keep up to five examples of it."""
        self.quality[issue] += count
        if example is not None:
            bucket = self.examples.setdefault(issue, [])
            if len(bucket) < 5:
                bucket.append(example)

    def merge(self, other: FactSet) -> FactSet:
        """Add ``other``'s entities, triples and notes to this set and return it."""
        for key, spec in other.entities.items():
            self.entities.setdefault(key, spec)
        self.triples |= other.triples
        self.quality.update(other.quality)
        for issue, items in other.examples.items():
            bucket = self.examples.setdefault(issue, [])
            bucket.extend(items[: max(0, 5 - len(bucket))])
        return self

    def quality_report(self) -> dict[str, dict]:
        """The notes as a sorted JSON-ready dict ``{issue: {"count": n, "examples": [...]}}``."""
        return {k: {"count": int(self.quality[k]), "examples": self.examples.get(k, [])} for k in sorted(self.quality)}
