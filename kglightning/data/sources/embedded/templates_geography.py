"""Geography question templates: WebQSP-like one-relation questions and CWQ-like chains and conjunctions."""

from __future__ import annotations

from . import schema as S
from .templates import Template, template

R = "~"  # walk a relation backwards
_REGION_WALK = (S.CONTAINED_BY, S.CONTAINED_BY, R + S.CONTAINED_BY)  # city -> country -> region -> its countries
_SAME_REGION = "the countries in the same region as the country where {t} is located"

SIMPLE: list[Template] = [
    template("capital", [S.CAPITAL], "country", [
        "what is the capital of {t}?", "what is the capital city of {t}?", "which city is the capital of {t}?",
        "what city is the capital of {t}?"], 160),
    template("capital_of", [R + S.CAPITAL], "city", [
        "{t} is the capital of which country?", "what country is {t} the capital of?",
        "which country has {t} as its capital?"], 95),
    template("borders", [S.ADJOINS], "country", [
        "which countries border {t}?", "what countries share a border with {t}?",
        "what are the neighboring countries of {t}?", "{t} is bordered by which countries?"], 120),
    template("official_language", [S.OFFICIAL_LANGUAGE], "country", [
        "what is the official language of {t}?", "what are the official languages of {t}?",
        "which languages are official in {t}?"], 130),
    template("languages_spoken", [S.LANGUAGES_SPOKEN], "country", [
        "what languages do they speak in {t}?", "what languages are spoken in {t}?",
        "what language do people in {t} speak?"], 130),
    template("currency", [S.CURRENCY], "country", [
        "what currency is used in {t}?", "what is the currency of {t}?", "what money do they use in {t}?",
        "what kind of currency does {t} have?"], 130),
    template("continent", [S.CONTINENT], "country", [
        "which continent is {t} in?", "what continent is {t} located on?", "{t} is part of which continent?"], 85),
    template("region", [S.CONTAINED_BY], "country", [
        "what region of the world is {t} in?", "which world region does {t} belong to?",
        "in which region is {t} located?"], 75),
    template("time_zones", [S.TIME_ZONES], "country", [
        "what time zone is {t} in?", "what time zones does {t} use?", "which UTC offsets are used in {t}?"], 75),
    template("calling_code", [S.CALLING_CODE], "country", [
        "what is the calling code of {t}?", "what is the international dialing code for {t}?",
        "what phone code does {t} use?"], 70),
    template("tld", [S.TLD], "country", [
        "what is the internet domain of {t}?", "what is the top-level domain of {t}?"], 40),
    template("divisions", [R + S.DIVISION_OF], "country", [
        "what are the provinces of {t}?", "what are the first-level administrative divisions of {t}?",
        "which states or provinces does {t} have?"], 70),
    template("city_country", [S.CONTAINED_BY], "city", [
        "which country is {t} in?", "{t} is located in what country?", "what country is the city of {t} in?",
        "in which country is {t}?"], 185),
    template("city_state", [S.STATE], "city", [
        "which state is {t} in?", "what state is {t} located in?", "{t} is a city in which U.S. state?"], 85),
    template("state_cities", [R + S.STATE], "state", [
        "what are the major cities in {t}?", "which large cities are in {t}?"], 35),
    template("country_cities", [R + S.CONTAINED_BY], "country", [
        "what are the major cities of {t}?", "which big cities are in {t}?", "what are the main cities in {t}?"],
        70, hop_kinds=("city",)),
    template("official_language_of", [R + S.OFFICIAL_LANGUAGE], "language", [
        "in which countries is {t} an official language?", "where is {t} an official language?",
        "which countries have {t} as an official language?"], 50),
    template("spoken_in", [R + S.LANGUAGES_SPOKEN], "language", [
        "where is {t} spoken?", "which countries speak {t}?", "in what countries do people speak {t}?"], 50),
    template("currency_users", [R + S.CURRENCY], "currency", [
        "which countries use the {t}?", "where is the {t} used?", "in which countries can you pay with the {t}?"],
        60),
    template("region_countries", [R + S.CONTAINED_BY], "region", [
        "which countries are in {t}?", "what countries make up {t}?", "which countries belong to {t}?"],
        20, hop_kinds=("country",), exclude_topic_step=R + S.CONTINENT),
    template("timezone_countries", [R + S.TIME_ZONES], "timezone", [
        "which countries are in the {t} time zone?", "which countries use the time zone {t}?"], 25),
    template("calling_code_country", [R + S.CALLING_CODE], "calling_code", [
        "which country has the calling code {t}?", "which country uses the dialing code {t}?"], 40),
    template("tld_country", [R + S.TLD], "tld", [
        "which country has the internet domain {t}?", "{t} is the top-level domain of which country?"], 30),
    template("province_country", [S.DIVISION_OF], "province", [
        "{t} is a province of which country?", "which country is {t} a first-level division of?",
        "in which country is the province of {t}?"], 95),
]  # fmt: skip

TWO_HOP: list[Template] = [
    template("capital_official_language", [R + S.CAPITAL, S.OFFICIAL_LANGUAGE], "city", [
        "What is the official language of the country whose capital is {t}?",
        "Which languages are official in the country with the capital {t}?"], 90),
    template("capital_languages_spoken", [R + S.CAPITAL, S.LANGUAGES_SPOKEN], "city", [
        "What languages are spoken in the country whose capital is {t}?",
        "What languages do people speak in the country that has {t} as its capital?"], 90),
    template("capital_currency", [R + S.CAPITAL, S.CURRENCY], "city", [
        "What currency is used in the country whose capital is {t}?",
        "What money is used in the country with the capital {t}?"], 90),
    template("capital_borders", [R + S.CAPITAL, S.ADJOINS], "city", [
        "Which countries border the country whose capital is {t}?",
        "What are the neighbours of the country with the capital {t}?"], 90),
    template("capital_continent", [R + S.CAPITAL, S.CONTINENT], "city", [
        "On which continent is the country whose capital is {t}?",
        "Which continent is the country with the capital {t} in?"], 60),
    template("capital_time_zones", [R + S.CAPITAL, S.TIME_ZONES], "city", [
        "What time zones are used in the country whose capital is {t}?"], 45),
    template("capital_calling_code", [R + S.CAPITAL, S.CALLING_CODE], "city", [
        "What is the calling code of the country whose capital is {t}?"], 45),
    template("neighbour_capitals", [S.ADJOINS, S.CAPITAL], "country", [
        "What are the capitals of the countries that border {t}?",
        "Which cities are the capitals of the countries neighbouring {t}?"], 90),
    template("neighbour_currencies", [S.ADJOINS, S.CURRENCY], "country", [
        "What currencies are used in the countries bordering {t}?",
        "Which currencies do the neighbours of {t} use?"], 70),
    template("neighbour_languages", [S.ADJOINS, S.OFFICIAL_LANGUAGE], "country", [
        "What are the official languages of the countries that border {t}?"], 70),
    template("city_capital", [S.CONTAINED_BY, S.CAPITAL], "city", [
        "What is the capital of the country where {t} is located?",
        "Which city is the capital of the country that contains {t}?"], 110),
    template("city_currency", [S.CONTAINED_BY, S.CURRENCY], "city", [
        "What currency is used in the country where {t} is?",
        "What money do they use in the country where the city of {t} is located?"], 90),
    template("city_official_language", [S.CONTAINED_BY, S.OFFICIAL_LANGUAGE], "city", [
        "What is the official language of the country where {t} is located?"], 90),
    template("city_continent", [S.CONTAINED_BY, S.CONTINENT], "city", [
        "On which continent is the country that {t} is in?"], 70),
    template("city_neighbours", [S.CONTAINED_BY, S.ADJOINS], "city", [
        "Which countries border the country where {t} is located?"], 90),
    template("currency_capitals", [R + S.CURRENCY, S.CAPITAL], "currency", [
        "What are the capitals of the countries that use the {t}?"], 45),
    template("language_capitals", [R + S.OFFICIAL_LANGUAGE, S.CAPITAL], "language", [
        "What are the capitals of the countries where {t} is an official language?"], 45),
    template("calling_code_capital", [R + S.CALLING_CODE, S.CAPITAL], "calling_code", [
        "What is the capital of the country whose calling code is {t}?"], 45),
    template("province_capital", [S.DIVISION_OF, S.CAPITAL], "province", [
        "What is the capital of the country that has a province named {t}?",
        "Which city is the capital of the country to which the province of {t} belongs?"], 70),
    template("region_capitals", [R + S.CONTAINED_BY, S.CAPITAL], "region", [
        "What are the capitals of the countries in {t}?"], 20,
        hop_kinds=("country", None), exclude_topic_step=R + S.CONTINENT),
    template("continent_currency_filter", [R + S.CONTINENT], "region", [
        "Which countries in {t} use the {c}?", "Which countries on the continent of {t} have the {c} as currency?"],
        50, constraint=S.CURRENCY, per_topic=10),
    template("continent_language_filter", [R + S.CONTINENT], "region", [
        "Which countries in {t} have {c} as an official language?"], 50, constraint=S.OFFICIAL_LANGUAGE, per_topic=10),
    template("neighbour_currency_filter", [S.ADJOINS], "country", [
        "Which countries that border {t} use the {c}?", "Which of the neighbours of {t} use the {c} as currency?"],
        70, constraint=S.CURRENCY),
    template("neighbour_language_filter", [S.ADJOINS], "country", [
        "Which countries bordering {t} have {c} as an official language?"], 70, constraint=S.OFFICIAL_LANGUAGE),
    template("region_spoken_filter", [R + S.CONTAINED_BY], "region", [
        "Which countries in {t} speak {c}?"], 40, constraint=S.LANGUAGES_SPOKEN, hop_kinds=("country",),
        exclude_topic_step=R + S.CONTINENT, per_topic=2),
    template("language_currency_filter", [R + S.OFFICIAL_LANGUAGE], "language", [
        "Which countries where {t} is an official language use the {c}?"], 40, constraint=S.CURRENCY, per_topic=2),
]  # fmt: skip

THREE_HOP: list[Template] = [
    template("capital_neighbour_capitals", [R + S.CAPITAL, S.ADJOINS, S.CAPITAL], "city", [
        "What are the capitals of the countries that border the country whose capital is {t}?"], 110),
    template("capital_neighbour_currencies", [R + S.CAPITAL, S.ADJOINS, S.CURRENCY], "city", [
        "What currencies are used in the countries bordering the country whose capital is {t}?",
        "What currency is used in the countries bordering the country whose capital is {t}?"], 80),
    template("capital_neighbour_languages", [R + S.CAPITAL, S.ADJOINS, S.OFFICIAL_LANGUAGE], "city", [
        "What are the official languages of the countries that border the country whose capital is {t}?"], 80),
    template("city_neighbour_capitals", [S.CONTAINED_BY, S.ADJOINS, S.CAPITAL], "city", [
        "What are the capitals of the countries that border the country where {t} is located?"], 130),
    template("city_neighbour_languages", [S.CONTAINED_BY, S.ADJOINS, S.OFFICIAL_LANGUAGE], "city", [
        "What are the official languages of the countries that border the country where {t} is located?"], 80),
    template("province_neighbour_currencies", [S.DIVISION_OF, S.ADJOINS, S.CURRENCY], "province", [
        "What currencies are used in the countries bordering the country that has the province {t}?"], 60),
    template("capital_region_countries", [R + S.CAPITAL, S.CONTAINED_BY, R + S.CONTAINED_BY], "city", [
        "Which countries are in the same region as the country whose capital is {t}?"], 60,
        hop_kinds=("country", "region", "country")),
    template("city_neighbour_spoken_filter", [S.CONTAINED_BY, S.ADJOINS], "city", [
        "Which countries bordering the country where {t} is located speak {c}?"], 60, constraint=S.LANGUAGES_SPOKEN),
    template("city_neighbour_currencies", [S.CONTAINED_BY, S.ADJOINS, S.CURRENCY], "city", [
        "What currencies are used in the countries that border the country where {t} is?"], 80),
    template("city_region_countries", list(_REGION_WALK), "city", [
        "Which countries are in the same region as the country where {t} is located?"], 80,
        hop_kinds=("country", "region", "country")),
    template("calling_code_neighbour_capitals", [R + S.CALLING_CODE, S.ADJOINS, S.CAPITAL], "calling_code", [
        "What are the capitals of the countries bordering the country with the calling code {t}?"], 45),
    template("province_neighbour_capitals", [S.DIVISION_OF, S.ADJOINS, S.CAPITAL], "province", [
        "What are the capitals of the countries that border the country containing the province of {t}?"], 70),
    template("capital_neighbour_currency_filter", [R + S.CAPITAL, S.ADJOINS], "city", [
        "Which countries that border the country whose capital is {t} use the {c}?"], 70, constraint=S.CURRENCY),
    template("city_neighbour_language_filter", [S.CONTAINED_BY, S.ADJOINS], "city", [
        "Which countries bordering the country where {t} is located have {c} as an official language?"], 70,
        constraint=S.OFFICIAL_LANGUAGE),
]  # fmt: skip

FOUR_HOP: list[Template] = [
    template("city_region_capitals", [*_REGION_WALK, S.CAPITAL], "city", [
        "What are the capitals of " + _SAME_REGION + "?"], 170, hop_kinds=("country", "region", "country", None)),
    template("capital_region_currencies", [R + S.CAPITAL, S.CONTAINED_BY, R + S.CONTAINED_BY, S.CURRENCY], "city", [
        "What currencies are used in the countries in the same region as the country whose capital is {t}?"], 80,
        hop_kinds=("country", "region", "country", None)),
    template("province_region_currencies", [S.DIVISION_OF, S.CONTAINED_BY, R + S.CONTAINED_BY, S.CURRENCY],
             "province", [
        "What currencies are used in the countries in the same region as the country that has the province {t}?"],
        60, hop_kinds=("country", "region", "country", None)),
    template("city_region_language_filter", list(_REGION_WALK), "city", [
        "Which of " + _SAME_REGION + " have {c} as an official language?"], 80, constraint=S.OFFICIAL_LANGUAGE,
        hop_kinds=("country", "region", "country")),
    template("city_region_currencies", [*_REGION_WALK, S.CURRENCY], "city", [
        "What currencies are used in " + _SAME_REGION + "?"], 80, hop_kinds=("country", "region", "country", None)),
    template("city_region_languages", [*_REGION_WALK, S.OFFICIAL_LANGUAGE], "city", [
        "What are the official languages of " + _SAME_REGION + "?"], 80,
        hop_kinds=("country", "region", "country", None)),
    template("province_region_capitals", [S.DIVISION_OF, S.CONTAINED_BY, R + S.CONTAINED_BY, S.CAPITAL], "province", [
        "What are the capitals of the countries in the same region as the country that has the province {t}?"], 80,
        hop_kinds=("country", "region", "country", None)),
    template("city_region_currency_filter", list(_REGION_WALK), "city", [
        "Which of " + _SAME_REGION + " use the {c}?"], 80, constraint=S.CURRENCY,
        hop_kinds=("country", "region", "country")),
]  # fmt: skip

GEOGRAPHY_TEMPLATES: list[Template] = SIMPLE + TWO_HOP + THREE_HOP + FOUR_HOP
