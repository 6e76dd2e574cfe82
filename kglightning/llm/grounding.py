"""Ground the reasoner's answer strings to KG entities by normalized name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from kglightning.llm.parsing import ParsedAnswers, ParseStats

UNMATCHED_ANSWER = "unmatched_answer"  #: no entity has the answer's normalized name
AMBIGUOUS_ANSWER = "ambiguous_answer"  #: several entities share the answer's normalized name (all get it)


@dataclass
class GroundedAnswers:
    """Answers mapped to KG entities.

    Args:
        entities: entity -> confidence (the highest among the answers that name it).
        unmatched: answers that name no entity, with their confidence (left for a fuzzier grounding, e.g. faiss).
        issues: ``unmatched_answer`` / ``ambiguous_answer`` occurrences.
    """

    entities: dict[str, float | None] = field(default_factory=dict)
    unmatched: dict[str, float | None] = field(default_factory=dict)
    issues: list[str] = field(default_factory=list)


class NearMissGrounder(Protocol):
    """Grounds the answers exact matching left unmatched (e.g. :class:`~kglightning.retrieval.FaissGrounder`)."""

    def ground(self, grounded: GroundedAnswers, entity_names: Iterable[str] | Mapping[str, str]) -> GroundedAnswers:
        """``grounded`` with what it can ground of ``grounded.unmatched`` moved to ``grounded.entities``."""


def ground_answers(
    answers: Mapping[str, float | None] | ParsedAnswers,
    entity_names: Iterable[str] | Mapping[str, str],
    stats: ParseStats | None = None,
    near_miss: NearMissGrounder | None = None,
) -> GroundedAnswers:
    """Map answer strings to KG entities whose name is equal after RoG normalization.

    Matching is equality of :func:`kglightning.metrics.functional.qa.normalize` (lowercase, no punctuation, no
    articles), not RoG's substring test: ``"The Beatles"`` grounds to ``"Beatles"``, ``"Paris"`` does not ground to
    ``"Paris, Texas"``. An answer that normalizes to ``""`` matches nothing. An answer matching several entities
    gives its confidence to each (counted as ambiguous); several answers naming one entity keep the highest.

    Args:
        answers: answer -> confidence (or a :class:`ParsedAnswers`).
        entity_names: entity names, or a mapping entity id -> name (e.g. for ``m.xxx`` CVT ids).
        stats: if given, the result is recorded into it.
        near_miss: if given, grounds the answers left unmatched (their nearest name above its floor), before the
            result is recorded.

    Example:
        >>> g = ground_answers({"the Beatles": 0.9, "U.S.": 0.4, "Mars": 0.1}, ["Beatles", "US", "Paris"])
        >>> g.entities, g.unmatched, g.issues
        ({'Beatles': 0.9, 'US': 0.4}, {'Mars': 0.1}, ['unmatched_answer'])
        >>> ground_answers({"Atlanta": 0.8}, {"m.013yq": "Atlanta", "m.0x": "atlanta"}).entities
        {'m.013yq': 0.8, 'm.0x': 0.8}
    """
    from kglightning.metrics.functional.qa import normalize

    if isinstance(answers, ParsedAnswers):
        answers = answers.answers
    if not isinstance(entity_names, Mapping):
        entity_names = list(entity_names)  # read twice with ``near_miss``
    items = entity_names.items() if isinstance(entity_names, Mapping) else ((n, n) for n in entity_names)
    by_name: dict[str, list[str]] = {}
    for entity, name in items:
        key = normalize(str(name))
        if key and entity not in by_name.setdefault(key, []):
            by_name[key].append(entity)
    out = GroundedAnswers()
    for answer, conf in answers.items():
        matches = by_name.get(normalize(answer), []) if normalize(answer) else []
        if not matches:
            out.unmatched[answer] = conf
            out.issues.append(UNMATCHED_ANSWER)
            continue
        if len(matches) > 1:
            out.issues.append(AMBIGUOUS_ANSWER)
        for entity in matches:
            old = out.entities.get(entity)
            out.entities[entity] = conf if old is None else old if conf is None else max(old, conf)
    if near_miss is not None and out.unmatched:
        out = near_miss.ground(out, entity_names)
    if stats is not None:
        stats.record(out)
    return out
