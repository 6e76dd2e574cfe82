"""What the KG-Trie state machine needs to know about a tokenizer: each token's text and a few token masks.

The state machine (:mod:`kglightning.llm.trie.processor`) reads generated text token by token to find where a
``<PATH`` tag opens; it never decodes whole sequences at generation time. :class:`TagVocab` decodes every token
once, when it is built, and keeps boolean masks over the vocabulary:

* ``plain``: tokens free inside an opening tag (no ``<`` or ``>``, not a special token);
* ``has_gt``: tokens containing ``>`` (they could close a tag);
* ``self_tag``: tokens that contain a whole opening tag ``<PATH ...>`` by themselves; such a token would open
  *and* close a tag in one step and skip the trie, so it is banned outside blocks.

Special tokens count as empty text, as in ``decode(..., skip_special_tokens=True)``, which is how generations are
read back (:class:`~kglightning.llm.backends.local_hf.LocalHFBackend`).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["OPEN_TAG_RE", "TagVocab", "decode_batch", "encode_batch", "pending_tag"]

#: the start of an opening ``<PATH`` tag, as lenient as :func:`~kglightning.evidence.format.parse_evidence`
#: (whitespace after ``<``, any case); a closing ``</PATH`` does not match
OPEN_TAG_RE = re.compile(r"<\s*path", re.I)
_PENDING_RE = re.compile(r"<\s*(?:p(?:a(?:t)?)?)?", re.I)
_SELF_TAG_RE = re.compile(r"<\s*path[^>]*>", re.I)

_CACHE: weakref.WeakKeyDictionary[Any, TagVocab] = weakref.WeakKeyDictionary()


def encode_batch(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens (no BOS): what a model generates for it."""
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def decode_batch(tokenizer: Any, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> list[str]:
    """Text of each id sequence, with no tokenization-space clean-up (so that a round trip is exact)."""
    if not sequences:
        return []
    return list(
        tokenizer.batch_decode(
            [list(s) for s in sequences], skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )
    )


def pending_tag(text: str) -> str:
    """The end of ``text`` that could still grow into an opening ``<PATH`` tag (``""`` if none).

    Example:
        >>> pending_tag("so <pa"), pending_tag("a < b"), pending_tag("<  "), pending_tag("x")
        ('<pa', '', '<  ', '')
    """
    i = text.rfind("<")
    return text[i:] if i >= 0 and _PENDING_RE.fullmatch(text, i) else ""


class TagVocab:
    """Token texts and tag-related masks of one tokenizer (see the module docstring).

    Use :meth:`of` to share one instance per tokenizer.

    Args:
        tokenizer: a transformers tokenizer (``batch_decode``, ``all_special_ids``, ``len()``).

    Attributes:
        texts: ``texts[i]`` is the text of token ``i`` alone (``""`` for special tokens).
        plain, has_gt, self_tag: ``(len(tokenizer),)`` boolean numpy masks.
    """

    def __init__(self, tokenizer: Any) -> None:
        n = len(tokenizer)
        special = {int(i) for i in getattr(tokenizer, "all_special_ids", ()) if i is not None}
        texts = decode_batch(tokenizer, [[i] for i in range(n)])
        self.texts: list[str] = ["" if i in special else t for i, t in enumerate(texts)]
        self.special_ids = frozenset(special)
        is_special = np.zeros(n, dtype=bool)
        is_special[[i for i in special if i < n]] = True
        self.plain = np.array([("<" not in t and ">" not in t) for t in self.texts], dtype=bool) & ~is_special
        self.has_gt = np.array([">" in t for t in self.texts], dtype=bool)
        self.self_tag = np.array([_SELF_TAG_RE.search(t) is not None for t in self.texts], dtype=bool)
        self._masks: dict[tuple[str, int, torch.device], torch.Tensor | None] = {}

    @classmethod
    def of(cls, tokenizer: Any) -> TagVocab:
        """The shared :class:`TagVocab` of ``tokenizer`` (rebuilt if tokens were added since)."""
        try:
            vocab = _CACHE.get(tokenizer)
        except TypeError:  # not weak-referenceable
            return cls(tokenizer)
        if vocab is None or vocab.size != len(tokenizer):
            vocab = cls(tokenizer)
            _CACHE[tokenizer] = vocab
        return vocab

    @property
    def size(self) -> int:
        """The tokenizer's vocabulary size (a model's logits may be wider: padded embeddings)."""
        return len(self.texts)

    def text(self, token: int) -> str:
        """The text of one token (``""`` for special tokens and ids past the tokenizer's vocabulary)."""
        return self.texts[token] if 0 <= token < len(self.texts) else ""

    def free_ban(self, pending: bool, width: int, device: torch.device) -> torch.Tensor | None:
        """Tokens banned outside a block, as a ``(width,)`` bool mask (``None`` when nothing is banned).

        Args:
            pending: whether the text so far ends with the start of a tag (:func:`pending_tag`); then every token
                with ``>`` is banned too, so the tag cannot close without going through the trie.
            width: the logits width.
            device: the logits device.
        """
        key = ("pending" if pending else "free", width, device)
        if key not in self._masks:
            ban = self.self_tag | self.has_gt if pending else self.self_tag
            self._masks[key] = self._pad(ban, width, device) if ban.any() else None
        return self._masks[key]

    def tag_allow(self, extra: Sequence[int], width: int, device: torch.device) -> torch.Tensor:
        """``plain`` tokens plus ``extra`` ids, as a fresh ``(width,)`` bool mask (ids past ``width`` dropped)."""
        allow = self._pad(self.plain, width, device).clone()
        ids = [i for i in extra if 0 <= i < width]
        if ids:
            allow[torch.tensor(ids, dtype=torch.long, device=device)] = True
        return allow

    def _pad(self, mask: np.ndarray, width: int, device: torch.device) -> torch.Tensor:
        out = torch.zeros(width, dtype=torch.bool, device=device)
        m = min(width, mask.size)
        out[:m] = torch.from_numpy(mask[:m]).to(device)
        return out
