"""Are generated paths in the KG? The invalid-path rate, with or without a KG-Trie.

A well-formed ``<PATH>`` block (:func:`~kglightning.evidence.format.parse_evidence`) is *valid* when its relation
sequence is walkable from a topic entity of the question and, if it has a constraint ``(r_c, c)``, at least one
entity it reaches has an ``r_c`` hop to ``c``; i.e. when its grounding (as in
:meth:`~kglightning.evidence.builder.EvidenceBuilder.ground`, no distinctness condition on the walk) is not empty.
Malformed blocks (unclosed, empty relation, ...) are counted apart: they are not paths at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from kglightning.data.kg import KGIndex
from kglightning.evidence.format import PathEvidence, parse_evidence
from kglightning.evidence.paths import EMPTY, PathGrounder, constraint_filter, label_id

__all__ = ["PathValidity", "is_walkable", "path_validity"]


@dataclass
class PathValidity:
    """Counts of generated ``<PATH>`` blocks by validity (add two with ``+``).

    Args:
        texts: generations read.
        blocks: well-formed blocks (valid + invalid).
        valid: blocks walkable in the KG.
        invalid: well-formed blocks that are not walkable (hallucinated paths).
        malformed: malformed blocks (:class:`~kglightning.evidence.format.MalformedBlock`).
        no_path: generations without any ``<PATH>`` tag.
    """

    texts: int = 0
    blocks: int = 0
    valid: int = 0
    invalid: int = 0
    malformed: int = 0
    no_path: int = 0

    @property
    def invalid_rate(self) -> float:
        """``invalid / blocks``: the share of well-formed paths absent from the KG (``nan`` without blocks)."""
        return self.invalid / self.blocks if self.blocks else float("nan")

    def __add__(self, other: PathValidity) -> PathValidity:
        return PathValidity(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def is_walkable(kg: KGIndex, topics: str | Iterable[str], evidence: PathEvidence) -> bool:
    """Whether ``evidence`` grounds to at least one entity from ``topics`` in ``kg``.

    Example:
        >>> kg = KGIndex.from_triples([("Snoopy", "sibling_of", "Spike"), ("Spike", "gender", "Male")])
        >>> z = parse_evidence("<PATH confidence=0.7>sibling_of<CONSTRAINT>gender<SEP>Male</CONSTRAINT></PATH>")
        >>> is_walkable(kg, "Snoopy", z.evidence[0]), is_walkable(kg, "Spike", z.evidence[0])
        (True, False)
    """
    topics = [topics] if isinstance(topics, str) else list(topics)
    return _walkable(kg, PathGrounder(kg, kg._ids(topics) if topics else EMPTY), evidence)


def _walkable(kg: KGIndex, grounder: PathGrounder, evidence: PathEvidence) -> bool:
    ids = grounder.ground(evidence.relations)
    if evidence.constraint is not None and ids.size:
        relation, entity = evidence.constraint
        ids = constraint_filter(kg, ids, label_id(kg, relation), kg.entity_id(entity))
    return bool(ids.size)


def path_validity(
    texts: Sequence[str], kg: KGIndex, topics: str | Iterable[str], *, require_confidence: bool = False
) -> PathValidity:
    """Count the valid, invalid and malformed ``<PATH>`` blocks in the generations of one question.

    Args:
        texts: the generated texts (each may hold several blocks).
        kg: the question's graph.
        topics: its topic entity or entities.
        require_confidence: a block without a confidence attribute is malformed.

    Example:
        >>> kg = KGIndex.from_triples([("Snoopy", "sibling_of", "Spike"), ("Spike", "gender", "Male")])
        >>> path_validity(["<PATH confidence=0.7>sibling_of</PATH><PATH confidence=0.2>~sibling_of</PATH>",
        ...                "<PATH confidence=0.7>sibling_of<SEP></PATH>", "no path"], kg, "Snoopy")
        PathValidity(texts=3, blocks=2, valid=1, invalid=1, malformed=1, no_path=1)
    """
    topics = [topics] if isinstance(topics, str) else list(topics)
    grounder = PathGrounder(kg, kg._ids(topics) if topics else EMPTY)
    out = PathValidity(texts=len(texts))
    for text in texts:
        parsed = parse_evidence(text, require_confidence=require_confidence)
        out.malformed += len(parsed.malformed)
        out.no_path += int(parsed.no_path)
        for z in parsed.evidence:
            ok = _walkable(kg, grounder, z)
            out.blocks += 1
            out.valid += int(ok)
            out.invalid += int(not ok)
    return out
