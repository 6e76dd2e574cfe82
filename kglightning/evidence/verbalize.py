"""Grounded reasoning paths of an evidence, written as text for the LLM reasoner (DoublyCal §4.3).

Each evidence ``z = P_r ∧ C`` is grounded in the question's graph: every walk from a topic entity along ``P_r`` whose
end satisfies the constraint is one *path instance*. Instances are written like RoG's reasoning paths, entities and
relations alternating (``Snoopy -> sibling_of -> Spike``); a reverse hop ``~r`` is written ``x <- r <- y`` (the
triple is ``(y, r, x)``), and a constraint ``(r_c, c)`` follows the answer in parentheses
(``Snoopy -> sibling_of -> Spike (gender -> Male)``). All instances of one evidence share its confidence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kglightning.data.kg import KGIndex, is_reverse
from kglightning.data.text import prompt_name
from kglightning.evidence.schema import Evidence

__all__ = ["path_instances", "verbalize_instance"]


def _hop(kg: KGIndex, entity: str, relation: str) -> list[str]:
    """Neighbours of ``entity`` over one hop of ``relation`` (``~r``: against the triple's direction)."""
    if is_reverse(relation):
        name = relation[1:]
        return [h for r, h in kg.in_edges(entity) if r == name]
    return [t for r, t in kg.out_edges(entity) if r == relation]


def _satisfies(kg: KGIndex, entity: str, constraint: tuple[str, str] | None) -> bool:
    if constraint is None:
        return True
    rel, const = constraint
    return const in _hop(kg, entity, rel)


def path_instances(kg: KGIndex, topics: Iterable[str], evidence: Evidence, limit: int | None = 10) -> list[list[str]]:
    """Walks that ground ``evidence``: ``[topic, r1, e1, ..., rk, ek]``, depth first, at most ``limit``.

    Args:
        kg: the question's graph.
        topics: start entities (used when ``evidence.topic`` is ``None``).
        evidence: the relation path and optional constraint.
        limit: most instances returned (``None``: all).

    Example:
        >>> kg = KGIndex.from_triples([("Snoopy", "sibling_of", "Spike"), ("Snoopy", "sibling_of", "Belle"),
        ...     ("Spike", "gender", "Male"), ("Belle", "gender", "Female")])
        >>> path_instances(kg, ["Snoopy"], Evidence(None, ("sibling_of",), ("gender", "Male")))
        [['Snoopy', 'sibling_of', 'Spike']]
        >>> path_instances(kg, ["Spike"], Evidence(None, ("~sibling_of", "sibling_of")))
        [['Spike', '~sibling_of', 'Snoopy', 'sibling_of', 'Belle'], ['Spike', '~sibling_of', 'Snoopy', 'sibling_of', 'Spike']]
    """
    starts = [evidence.topic] if evidence.topic is not None else list(dict.fromkeys(topics))
    out: list[list[str]] = []
    relations = evidence.relations

    def walk(path: list[str], depth: int) -> bool:  # True when the limit is reached
        if depth == len(relations):
            if _satisfies(kg, path[-1], evidence.constraint):
                out.append(list(path))
            return limit is not None and len(out) >= limit
        for nxt in dict.fromkeys(_hop(kg, path[-1], relations[depth])):
            path += [relations[depth], nxt]
            stop = walk(path, depth + 1)
            del path[-2:]
            if stop:
                return True
        return False

    for topic in starts:
        if topic in kg and walk([topic], 0):
            break
    return out


def verbalize_instance(instance: Sequence[str], constraint: tuple[str, str] | None = None) -> str:
    """One path instance as text (see the module docstring).

    Example:
        >>> verbalize_instance(["Snoopy", "sibling_of", "Spike"], ("gender", "Male"))
        'Snoopy -> sibling_of -> Spike (gender -> Male)'
        >>> verbalize_instance(["Spike", "~sibling_of", "Snoopy"], ("~pet_of", "Charlie"))
        'Spike <- sibling_of <- Snoopy (pet_of <- Charlie)'
    """
    parts = [prompt_name(instance[0])]
    for k in range(1, len(instance) - 1, 2):
        rel, nxt = prompt_name(instance[k]), prompt_name(instance[k + 1])
        parts.append(f"<- {rel[1:]} <- {nxt}" if is_reverse(rel) else f"-> {rel} -> {nxt}")
    text = " ".join(parts)
    if constraint is not None:
        rel, const = prompt_name(constraint[0]), prompt_name(constraint[1])
        text += f" ({rel[1:]} <- {const})" if is_reverse(rel) else f" ({rel} -> {const})"
    return text
