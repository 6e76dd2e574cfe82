"""Text renderings of KG relations and relation paths, used for sentence embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from kglightning.data.kg import is_reverse


@lru_cache(maxsize=65536)
def relation_text(relation: str) -> str:
    """A readable rendering of a (possibly reversed) Freebase-style relation.

    Example:
        >>> relation_text("location.country.capital"), relation_text("~people.person.place_of_birth")
        ('location country capital', 'inverse of people person place of birth')
    """
    if is_reverse(relation):
        return "inverse of " + relation_text(relation[1:])
    return relation.replace(".", " ").replace("_", " ").strip()


def path_text(path: Sequence[str]) -> str:
    """Text of a relation path: its hops' texts joined by ``" -> "``.

    Example:
        >>> path_text(["~location.country.capital", "location.country.currency_used"])
        'inverse of location country capital -> location country currency used'
    """
    return " -> ".join(relation_text(r) for r in path)


def step_query_text(question: str, prefix: Sequence[str]) -> str:
    """Text of UAG's ``Q || r_0 || ... || r_{j-1}``: the question, then the relations walked so far.

    It is compared with the next relation's :func:`relation_text` (Eq. 4) by the relation scorer.

    Example:
        >>> step_query_text("capital of France?", [])
        'capital of France?'
        >>> step_query_text("currency of the capital's country?", ["~location.country.capital"])
        "currency of the capital's country? | inverse of location country capital"
    """
    return f"{question} | {path_text(prefix)}" if len(prefix) else question
