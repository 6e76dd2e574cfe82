"""Entity naming: text clean-up, fuzzy keys for matching, and KG-wide unique names.

Every KG node is named by a human-readable string (as Freebase names are in the RoG data). Raw names from the fact
packages clash (a city named like its country, two cities called "Springfield", a province and a city called
"Lima"), so :func:`assign_unique_names` gives each entity the first of its candidate names that no entity of higher
priority has taken. Uniqueness is checked case-insensitively, because answer matching lower-cases names.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u201c": '"', "\u201d": '"', "\u2212": "-"})
_NON_WORD = re.compile(r"[^\w]+")
_SPACES = re.compile(r"\s+")


def clean(text: str) -> str:
    """Normalise a display name: NFC, straight quotes, ASCII minus, single spaces, no outer blanks.

    Example:
        >>> clean("  Saint John\u2019s ")
        "Saint John's"
    """
    text = unicodedata.normalize("NFC", text).translate(_QUOTES)
    return _SPACES.sub(" ", text).strip()


@functools.lru_cache(maxsize=1 << 18)
def fold(text: str) -> str:
    """A matching key: accents stripped, case-folded, punctuation turned into single spaces.

    Example:
        >>> fold("El Aaiún") == fold("el-aaiun")
        True
    """
    text = unicodedata.normalize("NFKD", clean(text))
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).casefold()
    text = _NON_WORD.sub(" ", text).strip()
    text = re.sub(r"\bst\b", "saint", text)
    return re.sub(r"^city of ", "", text)


def has_accents(text: str) -> bool:
    """Whether ``text`` carries combining marks once decomposed (used to prefer "Curaçao" over "Curacao")."""
    return any(unicodedata.combining(ch) for ch in unicodedata.normalize("NFKD", text))


@dataclass(frozen=True)
class EntitySpec:
    """A KG entity before naming.

    Args:
        key: internal id, unique, e.g. ``"country:PE"`` or ``"city:3936456"``.
        kind: entity type, e.g. ``"country"``, ``"city"``, ``"element"``.
        candidates: names to try in order; the first is the plain name, later ones are disambiguated forms.
        rank: sort key within the same priority (lower wins), e.g. ``(-population,)`` for cities.
    """

    key: str
    kind: str
    candidates: tuple[str, ...]
    rank: tuple = ()


#: Which entity types keep a contested plain name first (lower index wins).
KIND_PRIORITY: tuple[str, ...] = (
    "country",
    "region",
    "element",
    "language",
    "currency",
    "state",
    "symbol",
    "city",
    "province",
    "person",
    "atomic_number",
    "year",
    "group",
    "period",
    "block",
    "series",
    "goldschmidt_class",
    "crystal_structure",
    "timezone",
    "calling_code",
    "tld",
)


def _priority(spec: EntitySpec) -> tuple:
    kind_rank = KIND_PRIORITY.index(spec.kind) if spec.kind in KIND_PRIORITY else len(KIND_PRIORITY)
    return (kind_rank, spec.rank, spec.key)


def assign_unique_names(specs: list[EntitySpec]) -> dict[str, str]:
    """Give every entity a name that no other entity has (case-insensitively); deterministic.

    Entities are served by :data:`KIND_PRIORITY`, then ``rank``, then ``key``; each takes its first free candidate.
    When every candidate is taken, ``" #2"``, ``" #3"``, ... is appended to the last candidate.

    Example:
        >>> names = assign_unique_names([
        ...     EntitySpec("city:2", "city", ("Springfield", "Springfield (Missouri)"), (-160000,)),
        ...     EntitySpec("city:1", "city", ("Springfield", "Springfield (Illinois)"), (-114000,)),
        ...     EntitySpec("country:SG", "country", ("Singapore",)),
        ...     EntitySpec("city:3", "city", ("Singapore", "Singapore (city)"), (-5000000,))])
        >>> names["city:2"], names["city:1"], names["city:3"]
        ('Springfield', 'Springfield (Illinois)', 'Singapore (city)')
    """
    taken: set[str] = set()
    out: dict[str, str] = {}
    for spec in sorted(specs, key=_priority):
        cands = [clean(c) for c in spec.candidates if c and clean(c)]
        if not cands:
            raise ValueError(f"entity {spec.key} has no usable name")
        chosen = next((c for c in cands if c.casefold() not in taken), None)
        k = 2
        while chosen is None:
            trial = f"{cands[-1]} #{k}"
            chosen = trial if trial.casefold() not in taken else None
            k += 1
        taken.add(chosen.casefold())
        out[spec.key] = chosen
    return out


def is_qualified(name: str) -> bool:
    """Whether a name carries a disambiguation suffix such as ``" (Illinois)"`` or ``" #2"``.

    Such entities are never used as topic entities: the suffix would often give the answer away.
    """
    return name.endswith(")") and " (" in name or " #" in name
