"""Per-country attribute facts: official and spoken languages, currencies, time zones, calling codes, TLDs.

Codes are decoded with the tables of :mod:`.codes_languages` and :mod:`.codes_currencies`; values that the two
packages contradict, or that are malformed, withdrawn or not a single language, are dropped and noted.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from . import schema as S
from .codes_currencies import currency_name
from .codes_languages import language_name
from .factset import FactSet
from .names import clean, fold

if TYPE_CHECKING:
    from .facts_geography import Country


_UTC = re.compile(r"^UTC(?:([+-])(\d{2})(?::(\d{2}))?)?$")


def _utc(raw: str) -> str | None:
    m = _UTC.match(clean(raw).replace("\u2212", "-"))
    if not m:
        return None
    sign, hours, minutes = m.group(1) or "+", m.group(2) or "00", m.group(3) or "00"
    return f"UTC{sign}{hours}:{minutes}"


def _calling_codes(c: Country, fs: FactSet) -> list[str]:
    gc_codes = [p.strip().lstrip("+") for p in str(c.gc.get("phone") or "").split(" and ") if p.strip()]
    ci_digits = {re.sub(r"\D", "", str(x)) for x in c.ci.get("callingCodes") or [] if re.sub(r"\D", "", str(x))}
    out = []
    for code in gc_codes:
        digits = re.sub(r"\D", "", code)
        if not re.fullmatch(r"\d+(-\d+)?", code):
            fs.note("calling code: malformed, dropped", f"{c.name}: {code}")
        elif ci_digits and not any(d.startswith(digits) or digits.startswith(d) for d in ci_digits):
            fs.note("calling code: packages disagree, dropped", f"{c.name}: +{code} / {sorted(ci_digits)}")
        else:
            out.append("+" + code)
    return out


def _official_code(code: str, gc_codes: list[str], spoken: list[str | None], c: Country, fs: FactSet) -> str:
    """countryinfo's official-language code, replaced by geonames' longer code when it is a truncation of it.

    countryinfo gives Aruba ``"pa"`` (Punjabi) where geonames has ``"pap"`` (Papiamento): a two-letter code that
    names a language the country's geonames record does not list, while geonames lists a three-letter code that
    starts with it, is taken to be that three-letter code.
    """
    if len(code) != 2 or language_name(code) in spoken:
        return code
    longer = [g for g in gc_codes if len(g) == 3 and g.startswith(code.lower()) and language_name(g)]
    if longer:
        fs.note("language (official): countryinfo code corrected by geonames", f"{c.name}: {code} -> {longer[0]}")
        return longer[0]
    return code


def add_country_attributes(countries: dict[str, Country], fs: FactSet) -> None:
    """Official and spoken languages, currencies, time zones, calling codes and internet TLDs."""

    def link(c: Country, rel: str, kind: str, prefix: str, names: list[str]) -> None:
        for name in sorted(set(names)):
            key = f"{prefix}:{fold(name)}" if kind == "language" else f"{prefix}:{name}"
            fs.entity(key, kind, [name, f"{name} ({kind})"])
            fs.add(c.key, rel, key)

    for c in countries.values():
        gc_codes = [x.strip().split("-")[0].lower() for x in str(c.gc.get("languages") or "").split(",") if x.strip()]
        spoken = [language_name(x) for x in gc_codes]
        official = [language_name(_official_code(str(x), gc_codes, spoken, c, fs)) for x in c.ci.get("languages") or []]
        for issue, values in (("official", official), ("spoken", spoken)):
            if None in values:
                fs.note(f"language ({issue}): code without a single-language name, dropped", c.name,
                        count=values.count(None))  # fmt: skip
        link(c, S.OFFICIAL_LANGUAGE, "language", "language", [x for x in official if x])
        link(c, S.LANGUAGES_SPOKEN, "language", "language", [x for x in spoken if x])
        codes = {str(x).upper() for x in (c.ci.get("currencies") or [])} | {str(c.gc.get("currencycode") or "")}
        codes.discard("")
        dropped = sorted(x for x in codes if currency_name(x) is None)
        if dropped:
            fs.note("currency: withdrawn code or fund, dropped", f"{c.name}: {dropped}", count=len(dropped))
        for cur in sorted(codes - set(dropped)):
            fs.entity(f"currency:{cur}", "currency", [currency_name(cur), f"{currency_name(cur)} ({cur})"])
            fs.add(c.key, S.CURRENCY, f"currency:{cur}")
        zones = [_utc(str(z)) for z in c.ci.get("timezones") or []]
        if None in zones:
            fs.note("time zone: malformed, dropped", c.name)
        link(c, S.TIME_ZONES, "timezone", "tz", [z for z in zones if z])
        link(c, S.CALLING_CODE, "calling_code", "phone", _calling_codes(c, fs))
        tlds = [clean(str(t)).lower() for t in c.ci.get("tld") or []]
        link(c, S.TLD, "tld", "tld", [t for t in tlds if re.fullmatch(r"\.[a-z]{2,}", t)])
