"""Question templates: a relation path from a topic entity, an optional constraint, and natural phrasings.

A template's gold answers are exactly the nodes reached by walking ``path`` from the topic in the full KG, kept
when they also have the ``constraint`` relation to the constraint entity (CWQ-style conjunction). ``hops`` counts
both: a one-relation path plus a constraint is a 2-hop question.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Template:
    """One question pattern.

    Args:
        name: unique template id.
        path: steps from the topic entity (``"~r"`` walks ``r`` backwards).
        topic: entity kinds allowed as topic.
        phrasings: format strings with ``{t}`` (topic name) and, for constraint templates, ``{c}``.
        quota: how many questions to draw at most.
        constraint: relation that every answer must have towards the constraint entity ``{c}``.
        hop_kinds: per step, the entity kind that every node reached by that step must have (``None``: any);
            a topic whose walk leaves these kinds is skipped, so that the phrasing stays true.
        exclude_topic_step: topics that have this step are skipped (e.g. regions that are also continents).
        source: ``"geography"`` or ``"elements"`` (the fact package family the question is mostly about).
        per_topic: for constraint templates, how many questions (with different constraint entities) one topic
            may give.
    """

    name: str
    path: tuple[str, ...]
    topic: frozenset[str]
    phrasings: tuple[str, ...]
    quota: int
    constraint: str | None = None
    hop_kinds: tuple[str | None, ...] = ()
    exclude_topic_step: str | None = None
    source: str = "geography"
    per_topic: int = 1

    @property
    def hops(self) -> int:
        return len(self.path) + (1 if self.constraint else 0)

    @property
    def kind(self) -> Literal["simple", "compositional"]:
        return "simple" if self.hops == 1 else "compositional"

    @property
    def relation_path(self) -> list[str]:
        return list(self.path)


def template(
    name: str,
    path: list[str] | tuple[str, ...],
    topic: str | tuple[str, ...],
    phrasings: list[str] | tuple[str, ...],
    quota: int,
    *,
    constraint: str | None = None,
    hop_kinds: tuple[str | None, ...] = (),
    exclude_topic_step: str | None = None,
    source: str = "geography",
    per_topic: int = 1,
) -> Template:
    """Build a :class:`Template`, checking that every phrasing names its topic (and its constraint if any)."""
    kinds = frozenset((topic,) if isinstance(topic, str) else topic)
    for p in phrasings:
        if "{t}" not in p or (constraint is not None) != ("{c}" in p):
            raise ValueError(f"template {name}: phrasing {p!r} does not match its slots")
    return Template(name, tuple(path), kinds, tuple(phrasings), quota, constraint, hop_kinds, exclude_topic_step,
                    source, per_topic)  # fmt: skip
