"""Chemical-element question templates, including chains that cross into geography (discovery countries)."""

from __future__ import annotations

from functools import partial

from . import schema as S
from .templates import Template
from .templates import template as _template

R = "~"
template = partial(_template, source="elements")

SIMPLE: list[Template] = [
    template("symbol", [S.SYMBOL], "element", [
        "what is the chemical symbol of {t}?", "what is the symbol for {t}?",
        "what is the abbreviation of {t} on the periodic table?"], 65),
    template("symbol_element", [R + S.SYMBOL], "symbol", [
        "which element has the symbol {t}?", "what element is {t}?",
        "which chemical element is abbreviated {t}?"], 65),
    template("atomic_number", [S.ATOMIC_NUMBER], "element", [
        "what is the atomic number of {t}?", "how many protons does {t} have?"], 45),
    template("number_element", [R + S.ATOMIC_NUMBER], "atomic_number", [
        "which element has atomic number {t}?", "what element has {t} protons?"], 45),
    template("group", [S.GROUP], "element", [
        "which group of the periodic table is {t} in?", "what group does {t} belong to?"], 45),
    template("group_elements", [R + S.GROUP], "group", [
        "which elements are in {t}?", "what elements belong to {t} of the periodic table?"], 18),
    template("period", [S.PERIOD], "element", [
        "which period is {t} in?", "in what period of the periodic table is {t}?"], 45),
    template("period_elements", [R + S.PERIOD], "period", [
        "which elements are in {t}?", "what elements make up {t} of the periodic table?"], 7),
    template("block", [S.BLOCK], "element", [
        "which block of the periodic table is {t} in?", "is {t} in the s-, p-, d- or f-block?"], 40),
    template("block_elements", [R + S.BLOCK], "block", ["which elements are in the {t}?"], 4),
    template("series", [S.SERIES], "element", [
        "what type of element is {t}?", "which chemical series does {t} belong to?",
        "what kind of element is {t}?"], 65),
    template("series_elements", [R + S.SERIES], "series", [
        "which elements are {t}?", "what elements belong to the {t} series?"], 10),
    template("discoverer", [S.DISCOVERER], "element", [
        "who discovered {t}?", "who was the discoverer of {t}?", "who is credited with discovering {t}?"], 70),
    template("person_elements", [R + S.DISCOVERER], "person", [
        "which elements did {t} discover?", "what elements were discovered by {t}?"], 60),
    template("discovery_year", [S.DISCOVERY_YEAR], "element", [
        "when was {t} discovered?", "in what year was {t} discovered?", "what year was {t} first discovered?"], 65),
    template("year_elements", [R + S.DISCOVERY_YEAR], "year", [
        "which elements were discovered in {t}?", "what elements were first discovered in the year {t}?"], 50),
    template("discovery_location", [S.DISCOVERY_LOCATION], "element", [
        "in which country was {t} discovered?", "where was {t} discovered?"], 65),
    template("country_elements", [R + S.DISCOVERY_LOCATION], "country", [
        "which elements were discovered in {t}?", "what chemical elements were first discovered in {t}?"], 14),
    template("goldschmidt", [S.GOLDSCHMIDT_CLASS], "element", [
        "what is the Goldschmidt classification of {t}?", "which Goldschmidt class does {t} belong to?"], 35),
    template("crystal", [S.CRYSTAL_STRUCTURE], "element", [
        "what is the crystal structure of {t}?", "what lattice structure does solid {t} have?"], 35),
]  # fmt: skip

TWO_HOP: list[Template] = [
    template("symbol_discoverer", [R + S.SYMBOL, S.DISCOVERER], "symbol", [
        "Who discovered the element whose symbol is {t}?",
        "Who discovered the element with the chemical symbol {t}?"], 60),
    template("symbol_year", [R + S.SYMBOL, S.DISCOVERY_YEAR], "symbol", [
        "In what year was the element with the symbol {t} discovered?"], 50),
    template("symbol_series", [R + S.SYMBOL, S.SERIES], "symbol", [
        "Which chemical series does the element with the symbol {t} belong to?"], 50),
    template("symbol_group", [R + S.SYMBOL, S.GROUP], "symbol", [
        "Which group of the periodic table contains the element with the symbol {t}?"], 40),
    template("symbol_number", [R + S.SYMBOL, S.ATOMIC_NUMBER], "symbol", [
        "What is the atomic number of the element with the symbol {t}?"], 40),
    template("number_symbol", [R + S.ATOMIC_NUMBER, S.SYMBOL], "atomic_number", [
        "What is the symbol of the element with atomic number {t}?"], 50),
    template("number_discoverer", [R + S.ATOMIC_NUMBER, S.DISCOVERER], "atomic_number", [
        "Who discovered the element with atomic number {t}?"], 40),
    template("element_discovery_capital", [S.DISCOVERY_LOCATION, S.CAPITAL], "element", [
        "What is the capital of the country where {t} was discovered?"], 60),
    template("element_discovery_neighbours", [S.DISCOVERY_LOCATION, S.ADJOINS], "element", [
        "Which countries border the country where {t} was discovered?"], 50),
    template("person_symbols", [R + S.DISCOVERER, S.SYMBOL], "person", [
        "What are the symbols of the elements discovered by {t}?"], 50),
    template("person_years", [R + S.DISCOVERER, S.DISCOVERY_YEAR], "person", [
        "In which years did {t} discover chemical elements?"], 30),
    template("group_symbols", [R + S.GROUP, S.SYMBOL], "group", [
        "What are the chemical symbols of the elements in {t}?"], 15),
    template("capital_elements", [R + S.CAPITAL, R + S.DISCOVERY_LOCATION], "city", [
        "Which elements were discovered in the country whose capital is {t}?"], 14),
    template("year_series_filter", [R + S.DISCOVERY_YEAR], "year", [
        "Which elements discovered in {t} are {c}?",
        "Which of the elements discovered in {t} belong to the {c} series?"], 40, constraint=S.SERIES, per_topic=2),
    template("country_series_filter", [R + S.DISCOVERY_LOCATION], "country", [
        "Which elements discovered in {t} belong to the {c} series?"], 30, constraint=S.SERIES, per_topic=4),
    template("period_series_filter", [R + S.PERIOD], "period", [
        "Which elements in {t} belong to the {c} series?"], 30, constraint=S.SERIES, per_topic=6),
    template("group_period_filter", [R + S.GROUP], "group", ["Which element of {t} is in {c}?"], 60,
             constraint=S.PERIOD, per_topic=7),
    template("block_period_filter", [R + S.BLOCK], "block", ["Which {t} elements are in {c}?"], 20,
             constraint=S.PERIOD, per_topic=7),
]  # fmt: skip

THREE_HOP: list[Template] = [
    template("symbol_discovery_capital", [R + S.SYMBOL, S.DISCOVERY_LOCATION, S.CAPITAL], "symbol", [
        "What is the capital of the country where the element with the symbol {t} was discovered?"], 60),
    template("number_discovery_capital", [R + S.ATOMIC_NUMBER, S.DISCOVERY_LOCATION, S.CAPITAL], "atomic_number", [
        "What is the capital of the country where the element with atomic number {t} was discovered?"], 50),
    template("capital_element_symbols", [R + S.CAPITAL, R + S.DISCOVERY_LOCATION, S.SYMBOL], "city", [
        "What are the symbols of the elements discovered in the country whose capital is {t}?"], 14),
    template("element_neighbour_capitals", [S.DISCOVERY_LOCATION, S.ADJOINS, S.CAPITAL], "element", [
        "What are the capitals of the countries bordering the country where {t} was discovered?"], 50),
    template("symbol_same_year", [R + S.SYMBOL, S.DISCOVERY_YEAR, R + S.DISCOVERY_YEAR], "symbol", [
        "Which elements were discovered in the same year as the element with the symbol {t}?"], 50),
    template("capital_element_series_filter", [R + S.CAPITAL, R + S.DISCOVERY_LOCATION], "city", [
        "Which elements discovered in the country whose capital is {t} belong to the {c} series?"], 30,
        constraint=S.SERIES, per_topic=4),
]  # fmt: skip

FOUR_HOP: list[Template] = [
    template("symbol_neighbour_capitals", [R + S.SYMBOL, S.DISCOVERY_LOCATION, S.ADJOINS, S.CAPITAL], "symbol", [
        "What are the capitals of the countries that border the country where the element with the symbol {t} "
        "was discovered?"], 60),
    template("number_neighbour_currencies", [R + S.ATOMIC_NUMBER, S.DISCOVERY_LOCATION, S.ADJOINS, S.CURRENCY],
             "atomic_number", [
        "What currencies are used in the countries bordering the country where the element with atomic number {t} "
        "was discovered?"], 50),
    template("capital_neighbour_element_symbols", [R + S.CAPITAL, S.ADJOINS, R + S.DISCOVERY_LOCATION, S.SYMBOL],
             "city", [
        "What are the symbols of the elements discovered in the countries bordering the country whose capital is "
        "{t}?"], 50),
    template("capital_neighbour_element_filter", [R + S.CAPITAL, S.ADJOINS, R + S.DISCOVERY_LOCATION], "city", [
        "Which elements discovered in the countries bordering the country whose capital is {t} belong to the {c} "
        "series?"], 50, constraint=S.SERIES, per_topic=2),
    template("symbol_same_year_filter", [R + S.SYMBOL, S.DISCOVERY_YEAR, R + S.DISCOVERY_YEAR], "symbol", [
        "Which elements discovered in the same year as the element with the symbol {t} belong to the {c} series?"],
        40, constraint=S.SERIES, per_topic=2),
]  # fmt: skip

ELEMENT_TEMPLATES: list[Template] = SIMPLE + TWO_HOP + THREE_HOP + FOUR_HOP
