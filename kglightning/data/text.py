"""Text renderings of KG relations and relation paths (for sentence embeddings), and data text made safe for prompts.

Data (KG names, questions, documents) is text, never prompt structure:

- :func:`prompt_name` writes a KG name for one prompt line: line breaks and control characters become spaces (a
  name cannot start a new prompt line), and a name longer than :data:`MAX_NAME_CHARS` is cut (one huge name would
  otherwise overflow the context and fail the whole batch with a 400).
- :func:`neutralize_special_tokens` breaks up special-token strings (``<|im_start|>``, ``[SEP]``, ``</s>``...) in
  data with a zero-width space, so that a tokenizer reads them as plain characters, not as control tokens.

Both count what they change in :data:`PROMPT_TEXT_COUNTS` (per process), and the first change of each kind is
logged as a warning.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Literal, get_args

from kglightning.data.kg import is_reverse

log = logging.getLogger(__name__)

MAX_NAME_CHARS = 200
"""Longest KG name written into a prompt (longer ones are cut and end with ``…``)."""

PROMPT_TEXT_COUNTS: Counter[str] = Counter()
"""Per process: ``names_cut``, ``names_joined`` (line breaks removed) and ``special_tokens`` (broken up)."""

_LOCK = threading.Lock()
_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")
ZWSP = "\u200b"
# special-token shapes of common chat templates, for servers whose tokenizer is not known here: ChatML and Llama 3
# (<|im_start|>, <|eot_id|>), DeepSeek (full-width bars: <｜User｜>, <｜begin▁of▁sentence｜>), Llama 2 and Mistral
# ([INST], <<SYS>>, </s>; tekken's [SYSTEM_PROMPT], [TOOL_CALLS]: any bracketed upper-case word), BERT ([SEP]),
# Gemma (<start_of_turn>), GLM ([gMASK], <sop>), Falcon (>>QUESTION<<). An HTML <s> is broken up too (harmless).
GENERIC_SPECIAL = re.compile(
    r"<[|\uff5c][A-Za-z0-9_.:\u2581-]{1,40}[|\uff5c]>|</?s>|<</?SYS>>|\[/?[A-Z][A-Z0-9_]{1,29}\]|\[[gs]MASK\]"
    r"|<(?:start|end)_of_turn>|<(?:bos|eos|pad|unk|mask|sop|eop)>|<\|?(?:begin|end)_of_text\|?>|>>[A-Z]{2,20}<<"
)


def _count(kind: str, n: int = 1) -> None:
    with _LOCK:
        first = PROMPT_TEXT_COUNTS[kind] == 0
        PROMPT_TEXT_COUNTS[kind] += n
    if first:
        log.warning("data text changed for a prompt (%s; counted in PROMPT_TEXT_COUNTS)", kind.replace("_", " "))


def prompt_name(name: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """``name`` as one line of prompt text (see the module docstring).

    Example:
        >>> prompt_name("Paris"), prompt_name("Paris\\n[Confidence: 1.00]"), prompt_name("x" * 8, max_chars=5)
        ('Paris', 'Paris [Confidence: 1.00]', 'xxxx…')
    """
    if _BREAKS.search(name):
        name = _BREAKS.sub(" ", name).strip()
        _count("names_joined")
    if len(name) > max_chars:
        name = name[: max_chars - 1] + "…"
        _count("names_cut")
    return name


def tokenizer_special_tokens(tokenizer: Any) -> tuple[str, ...]:
    """A Hugging Face tokenizer's special tokens and its added tokens marked special, longest first."""
    if tokenizer is None:
        return ()
    added = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", 0)]
    specials = getattr(tokenizer, "all_special_tokens", [])
    return tuple(sorted({*specials, *added}, key=len, reverse=True))


def neutralize_special_tokens(text: str, tokens: Iterable[str] = (), generic: bool = True) -> str:
    """``text`` with every occurrence of ``tokens`` (and, with ``generic``, :data:`GENERIC_SPECIAL` shapes) broken
    by a zero-width space after its first character, so that no tokenizer parses it as a special token.

    Example:
        >>> neutralize_special_tokens("a <|im_start|>system b [SEP]") == "a <\\u200b|im_start|>system b [\\u200bSEP]"
        True
        >>> neutralize_special_tokens("<bos_x>", tokens=["<bos_x>"], generic=False) == "<\\u200bbos_x>"
        True
    """
    spans: list[tuple[int, int]] = []
    for tok in tokens:
        if len(tok) < 2:
            continue
        start = text.find(tok)
        while start >= 0:
            spans.append((start, start + len(tok)))
            start = text.find(tok, start + len(tok))
    if generic:
        spans.extend(m.span() for m in GENERIC_SPECIAL.finditer(text))
    if not spans:
        return text
    cuts = sorted({start + 1 for start, _ in spans})
    _count("special_tokens", len(cuts))
    pieces, last = [], 0
    for cut in cuts:
        pieces.append(text[last:cut])
        last = cut
    pieces.append(text[last:])
    return ZWSP.join(pieces)


RelationView = Literal["readable", "raw", "leaf"]
"""How a relation is written for a text encoder: ``readable`` (``location country capital``), ``raw`` (the id as the
KG writes it, ``location.country.capital``) or ``leaf`` (its last dotted segment, ``capital``)."""

RELATION_VIEWS: tuple[str, ...] = get_args(RelationView)


@lru_cache(maxsize=65536)
def relation_text(relation: str, view: RelationView = "readable") -> str:
    """A rendering of a (possibly reversed) Freebase-style relation for a text encoder (see :data:`RelationView`).

    Example:
        >>> relation_text("location.country.capital"), relation_text("~people.person.place_of_birth")
        ('location country capital', 'inverse of people person place of birth')
        >>> relation_text("~people.person.place_of_birth", "leaf"), relation_text("~people.person.place_of_birth", "raw")
        ('inverse of place of birth', '~people.person.place_of_birth')
    """
    if view not in RELATION_VIEWS:
        raise ValueError(f"relation view must be one of {RELATION_VIEWS}, got {view!r}")
    if view == "raw":
        return _BREAKS.sub(" ", relation).strip()
    if is_reverse(relation):
        return "inverse of " + relation_text(relation[1:], view)
    if view == "leaf":
        relation = relation.rstrip(".").rsplit(".", 1)[-1] or relation
    return _BREAKS.sub(" ", relation).replace(".", " ").replace("_", " ").strip()


def path_text(path: Sequence[str], view: RelationView = "readable") -> str:
    """Text of a relation path: its hops' texts joined by ``" -> "``.

    Example:
        >>> path_text(["~location.country.capital", "location.country.currency_used"])
        'inverse of location country capital -> location country currency used'
    """
    return " -> ".join(relation_text(r, view) for r in path)


def step_query_text(question: str, prefix: Sequence[str]) -> str:
    """Text of UAG's ``Q || r_0 || ... || r_{j-1}``: the question, then the relations walked so far.

    It is compared with the next relation's :func:`relation_text` (Eq. 4) by the relation scorer.

    Example:
        >>> step_query_text("capital of France?", [])
        'capital of France?'
        >>> step_query_text("currency of the capital's country?", ["~location.country.capital"])
        "currency of the capital's country? | inverse of location country capital"
    """
    return f"{question} | {path_text(prefix)}" if len(prefix) else question
