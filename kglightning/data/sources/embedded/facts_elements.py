"""Chemical-element facts from the SQLite database shipped inside ``mendeleev``.

The database is read directly with :mod:`sqlite3` (read-only), which avoids importing mendeleev's SQLAlchemy models
(seconds) for 118 rows. Discovery places are linked to the country entities of the geography part, so the two
domains share nodes (``Oxygen -> discovery_location -> Sweden``).
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sqlite3
from pathlib import Path
from typing import Any

from . import schema as S
from .codes_elements import DISCOVERER_ALIASES, GOLDSCHMIDT_NAMES, LATTICE_NAMES, LOCATION_ALIASES
from .factset import FactSet
from .names import EntitySpec, clean, fold

_COLUMNS = ("atomic_number", "symbol", "name", "group_id", "period", "block", "series_id", "discoverers",
            "discovery_year", "discovery_location", "goldschmidt_class", "lattice_structure")  # fmt: skip


@functools.lru_cache(maxsize=1)
def load_element_rows() -> tuple[dict[str, Any], ...]:
    """The element rows (with the series name joined in), read once from mendeleev's ``elements.db``."""
    spec = importlib.util.find_spec("mendeleev")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the fact package 'mendeleev' is not installed (pip install mendeleev)")
    db = Path(next(iter(spec.submodule_search_locations))) / "elements.db"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        series = dict(con.execute("SELECT id, name FROM series").fetchall())
        rows = con.execute(f"SELECT {', '.join(_COLUMNS)} FROM elements ORDER BY atomic_number").fetchall()
    finally:
        con.close()
    out = []
    for row in rows:
        record = dict(zip(_COLUMNS, row))
        record["series"] = series.get(record.pop("series_id"))
        out.append(record)
    return tuple(out)


def parse_discoverers(raw: str | None, fs: FactSet | None = None) -> list[str]:
    """Canonical discoverer names from mendeleev's free text.

    Example:
        >>> parse_discoverers("Pierre and Marie Curie")
        ['Pierre Curie', 'Marie Curie']
        >>> parse_discoverers("Sir William Ramsay; M. W. Travers")
        ['William Ramsay', 'Morris Travers']
        >>> parse_discoverers("Known to the ancients.")
        []
    """
    if not raw or clean(raw).lower().startswith("known to the ancients"):
        return []
    out: list[str] = []
    for piece in re.split(r"[;,/]", raw):
        piece = clean(piece)
        if not piece:
            continue
        names = DISCOVERER_ALIASES.get(piece, (piece,))
        if fs is not None and names != (piece,):
            fs.note("element: discoverer spelling repaired or merged", f"{piece} -> {', '.join(names) or '(none)'}")
        for name in names:
            if name not in out:
                out.append(name)
    return out


def parse_locations(raw: str | None, countries: dict[str, EntitySpec], fs: FactSet) -> list[str]:
    """Country keys for a discovery place such as ``"England/Sweden"``; unknown places are noted and dropped."""
    keys: list[str] = []
    for piece in (clean(p) for p in (raw or "").split("/")):
        if not piece:
            continue
        target = LOCATION_ALIASES.get(piece, piece)
        if target is None or fold(target) not in countries:
            fs.note("element: discovery place is not a current country, dropped", piece)
            continue
        if target != piece:
            fs.note("element: discovery place mapped to today's country", f"{piece} -> {target}")
        key = countries[fold(target)].key
        fs.entities.setdefault(key, countries[fold(target)])
        if key not in keys:
            keys.append(key)
    return keys


def load_elements(countries: dict[str, EntitySpec]) -> FactSet:
    """Element facts; ``countries`` maps folded country names to the country entities of the geography facts."""
    fs = FactSet()

    def value(kind: str, name: str, suffix: str) -> str:
        key = f"{kind}:{name}"
        fs.entity(key, kind, [name, f"{name} ({suffix})"])
        return key

    for row in load_element_rows():
        number = int(row["atomic_number"])
        element = f"element:{number}"
        fs.entity(element, "element", [clean(row["name"]), f"{clean(row['name'])} (element)"], (number,))
        fs.add(element, S.SYMBOL, value("symbol", clean(row["symbol"]), "symbol"))
        fs.add(element, S.ATOMIC_NUMBER, value("atomic_number", str(number), "atomic number"))
        if row["group_id"]:
            fs.add(element, S.GROUP, value("group", f"Group {int(row['group_id'])}", "periodic table"))
        if row["period"]:
            fs.add(element, S.PERIOD, value("period", f"Period {int(row['period'])}", "periodic table"))
        if row["block"]:
            fs.add(element, S.BLOCK, value("block", f"{row['block'].strip().lower()}-block", "periodic table"))
        if row["series"]:
            fs.add(element, S.SERIES, value("series", clean(row["series"]), "chemical series"))
        for person in parse_discoverers(row["discoverers"], fs):
            fs.add(element, S.DISCOVERER, value("person", person, "discoverer"))
        if row["discovery_year"]:
            fs.add(element, S.DISCOVERY_YEAR, value("year", str(int(row["discovery_year"])), "year"))
        for country in parse_locations(row["discovery_location"], countries, fs):
            fs.add(element, S.DISCOVERY_LOCATION, country)
        klass = GOLDSCHMIDT_NAMES.get(str(row["goldschmidt_class"] or "").lower())
        if row["goldschmidt_class"] and klass is None:
            fs.note("element: unknown Goldschmidt class, dropped", str(row["goldschmidt_class"]))
        if klass:
            fs.add(element, S.GOLDSCHMIDT_CLASS, value("goldschmidt_class", klass, "Goldschmidt class"))
        lattice = LATTICE_NAMES.get(str(row["lattice_structure"] or "").upper())
        if lattice:
            fs.add(element, S.CRYSTAL_STRUCTURE, value("crystal_structure", lattice, "crystal structure"))
    return fs
