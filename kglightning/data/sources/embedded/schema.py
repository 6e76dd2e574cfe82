"""Relation names of the embedded KG, Freebase style (``domain.type.property``).

Every relation is single-direction: a question that walks a relation against its direction writes it with a ``~``
prefix in ``relation_path`` (``"~location.country.capital"`` goes from a capital city to its country).
"""

from __future__ import annotations

# geography
CAPITAL = "location.country.capital"  # country -> city
CONTAINED_BY = "location.location.containedby"  # city -> country, country -> (sub)region, region -> region
STATE = "location.citytown.state"  # US city -> US state
DIVISION_OF = "location.administrative_division.country"  # province / state -> country
ADJOINS = "location.location.adjoin_s"  # country -> neighbouring country (stored in both directions)
OFFICIAL_LANGUAGE = "location.country.official_language"  # country -> language (countryinfo)
LANGUAGES_SPOKEN = "location.country.languages_spoken"  # country -> language (geonames)
CURRENCY = "location.country.currency_used"  # country -> currency
CONTINENT = "base.locations.countries.continent"  # country -> continent
TIME_ZONES = "location.location.time_zones"  # country -> UTC offset
CALLING_CODE = "location.country.calling_code"  # country -> "+51"
TLD = "location.country.internet_tld"  # country -> ".pe"

# chemistry
SYMBOL = "chemistry.chemical_element.atomic_symbol"  # element -> "Fe"
ATOMIC_NUMBER = "chemistry.chemical_element.atomic_number"  # element -> "26"
GROUP = "chemistry.chemical_element.periodic_table_group"  # element -> "Group 8"
PERIOD = "chemistry.chemical_element.periodic_table_period"  # element -> "Period 4"
BLOCK = "chemistry.chemical_element.periodic_table_block"  # element -> "d-block"
SERIES = "chemistry.chemical_element.chemical_series"  # element -> "Transition metals"
DISCOVERER = "chemistry.chemical_element.discoverer"  # element -> person or laboratory
DISCOVERY_YEAR = "chemistry.chemical_element.discovery_year"  # element -> "1774"
DISCOVERY_LOCATION = "chemistry.chemical_element.discovery_location"  # element -> country
GOLDSCHMIDT_CLASS = "chemistry.chemical_element.goldschmidt_class"  # element -> "Siderophile"
CRYSTAL_STRUCTURE = "chemistry.chemical_element.crystal_structure"  # element -> "Body-centered cubic"

#: Relations stored in both directions because they are symmetric.
SYMMETRIC = frozenset({ADJOINS})


def inverse(step: str) -> str:
    """The same hop walked the other way: ``"r"`` <-> ``"~r"``.

    Example:
        >>> inverse(CAPITAL), inverse("~" + CAPITAL)
        ('~location.country.capital', 'location.country.capital')
    """
    return step[1:] if step.startswith("~") else "~" + step
