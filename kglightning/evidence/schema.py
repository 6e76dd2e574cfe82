"""The evidence record: a constrained relational path ``z = P_r ∧ C`` with its Bayesian confidence.

Conventions (DoublyCal §4.1):

* ``relations`` is ``P_r``, the hops from the topic entity ``q`` to the candidate answer ``â``. A hop ``r`` follows
  a triple ``(x, r, y)`` from ``x`` to ``y``; a hop ``~r`` walks it backwards, from ``y`` to ``x`` (the
  :data:`~kglightning.data.kg.REVERSE_PREFIX` of :class:`~kglightning.data.kg.KGIndex`).
* ``constraint`` is ``C = r_c(â, c)``, written ``(r_c, c)`` *from the answer side*, as one more hop that must
  reach the constant entity ``c``: ``("gender", "Male")`` keeps ``â`` with a triple ``(â, gender, Male)``;
  ``("~award_winner", "Oscar")`` keeps ``â`` with a triple ``(Oscar, award_winner, â)``.
* ``topic`` is the entity ``q`` the path starts from, or ``None`` for evidence that names no topic (what a proxy
  model generates); such evidence is grounded from every topic entity of the question.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kglightning.data.kg import REVERSE_PREFIX


def _check_relation(rel: Any, what: str) -> None:
    if not isinstance(rel, str) or not rel or rel == REVERSE_PREFIX:
        raise ValueError(f"{what} must be a non-empty relation name, got {rel!r}")


@dataclass(frozen=True)
class Evidence:
    """A constrained relational path with its grounding statistics and confidence.

    Args:
        topic: the topic entity the path starts from, or ``None`` (ground from every topic entity).
        relations: the relation path ``P_r`` (``~r`` for a reverse hop); a list is stored as a tuple.
        constraint: the optional constraint ``(r_c, c)`` from the answer side (see the module docstring).
        confidence: the Beta-Bernoulli confidence ``p(A | z)``, or ``None`` when not scored.
        grounded: ``|[[z]]|``, the number of grounded candidates, or ``None``.
        hits: ``|[[z]] ∩ A|``, the number of grounded gold answers, or ``None``.

    Raises:
        ValueError: an empty relation path, a relation that is not a non-empty string, a malformed constraint,
            or counts with ``hits > grounded``.

    Example:
        >>> z = Evidence("Snoopy", ["sibling_of"], ("gender", "Male"), 0.75, 1, 1)
        >>> z.relations, z.is_constrained
        (('sibling_of',), True)
        >>> Evidence.from_dict(z.to_dict()) == z
        True
        >>> str(z)
        'Snoopy -> sibling_of [gender Male] (0.75)'
    """

    topic: str | None
    relations: tuple[str, ...]
    constraint: tuple[str, str] | None = None
    confidence: float | None = None
    grounded: int | None = None
    hits: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.relations, str):
            raise ValueError(f"relations must be a sequence of relation names, got the string {self.relations!r}")
        rels = tuple(self.relations)
        if not rels:
            raise ValueError("relations must hold at least one hop")
        for r in rels:
            _check_relation(r, "each relation")
        object.__setattr__(self, "relations", rels)
        if self.topic is not None and not isinstance(self.topic, str):
            raise ValueError(f"topic must be a string or None, got {self.topic!r}")
        if self.constraint is not None:
            c = () if isinstance(self.constraint, str) else tuple(self.constraint)
            if len(c) != 2 or not isinstance(c[1], str):
                raise ValueError(f"constraint must be (relation, entity), got {self.constraint!r}")
            _check_relation(c[0], "the constraint relation")
            object.__setattr__(self, "constraint", c)
        if self.hits is not None and self.grounded is not None and not 0 <= self.hits <= self.grounded:
            raise ValueError(f"need 0 <= hits <= grounded, got hits={self.hits}, grounded={self.grounded}")

    @property
    def is_constrained(self) -> bool:
        """Whether the evidence carries a constraint."""
        return self.constraint is not None

    @property
    def path(self) -> Evidence:
        """The bare relational path ``P_r`` (same topic, no constraint, not scored)."""
        return Evidence(self.topic, self.relations)

    def scored(self, confidence: float, grounded: int, hits: int) -> Evidence:
        """A copy with the given confidence and grounding counts."""
        return replace(self, confidence=float(confidence), grounded=int(grounded), hits=int(hits))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``topic, relations, constraint ([r_c, c] or None), confidence, grounded, hits``."""
        return {
            "topic": self.topic,
            "relations": list(self.relations),
            "constraint": None if self.constraint is None else list(self.constraint),
            "confidence": self.confidence,
            "grounded": self.grounded,
            "hits": self.hits,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evidence:
        """Inverse of :meth:`to_dict`; missing optional keys default to ``None``."""
        constraint = data.get("constraint")
        return cls(
            topic=data.get("topic"),
            relations=tuple(data["relations"]),
            constraint=None if constraint is None else (constraint[0], constraint[1]),
            confidence=None if data.get("confidence") is None else float(data["confidence"]),
            grounded=None if data.get("grounded") is None else int(data["grounded"]),
            hits=None if data.get("hits") is None else int(data["hits"]),
        )

    def __str__(self) -> str:
        head = " -> ".join(([self.topic] if self.topic is not None else []) + list(self.relations))
        tail = "" if self.constraint is None else f" [{self.constraint[0]} {self.constraint[1]}]"
        conf = "" if self.confidence is None else f" ({self.confidence:.4g})"
        return head + tail + conf
