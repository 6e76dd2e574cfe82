"""Reading a verbalized confidence from the model's distribution instead of its greedy digits.

A proxy fine-tuned on few examples writes the most frequent confidence of its training set for almost every
evidence (greedy decoding picks the mode), so its *stated* confidence carries no information even when its
distribution over the digits does. The *expected* readout replaces the written digits of each
``<PATH confidence=...>`` block (or trailing ``<CONFIDENCE>`` element, :mod:`kglightning.evidence.format`) by the mean of the model's distribution over the confidence values the training
format can write (``0.00``, ``0.01``, ..., ``1.00`` for two decimals), given everything generated before the digits:

    ĉ = Σ_v v · p(v | prompt, text up to "confidence=") / Σ_v p(v | ...)

The probability of a value is the product of its token probabilities, computed exactly for every value on a token
trie of the candidates (one batched forward per block over the trie's inner nodes, about 16 short sequences for a
digit-level tokenizer such as SmolLM2's), so the readout works whatever the tokenizer does with digits. A value's
tokens are those the tokenizer writes for it *after the opening tag* (``encode(tag + value)`` less
``encode(tag)``), the context the model saw in training: a SentencePiece tokenizer (Llama-2, Mistral) writes a
value on its own with a word-boundary token first (``"▁0.75"``), which never follows ``confidence=`` in the text.
Only the digits change; the path written after them is the model's greedy one. A block whose digits do not start
on a token boundary (a tokenizer that merges ``=`` with the digits) keeps its stated digits and is counted as
``unaligned``; a stated value outside ``[0, 1]`` is left for the parser to report (``out_of_range``); nothing is
dropped.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["ConfidenceReadout", "confidence_grid"]

#: where a block's confidence digits start: in its opening tag, or in the trailing element after ``</PATH>``
_OPEN = re.compile(r"<\s*PATH\s+confidence\s*=\s*|<\s*/\s*PATH\s*>\s*<\s*CONFIDENCE\s*>\s*", re.I)
_NUMBER = re.compile(r"[\"']?(?P<value>[-+]?(?:\d+(?:\.\d*)?|\.\d+))")


def confidence_grid(digits: int = 2) -> list[str]:
    """The confidence texts the format writes with ``digits`` decimals, from 0 to 1.

    Example:
        >>> confidence_grid(1)
        ['0.0', '0.1', '0.2', '0.3', '0.4', '0.5', '0.6', '0.7', '0.8', '0.9', '1.0']
        >>> len(confidence_grid(2))
        101
    """
    if digits < 0:
        raise ValueError(f"digits must be >= 0, got {digits}")
    steps = 10**digits
    return [f"{k / steps:.{digits}f}" for k in range(steps + 1)]


class ConfidenceReadout:
    """Rewrites the confidence of every ``<PATH>`` block of generated texts (in either position) by its expected value.

    Args:
        tokenizer: the model's tokenizer.
        digits: decimals of the candidate values and of the rewritten confidence (the SFT data writes 2).

    Attributes:
        candidates: each value's token ids after ``<PATH confidence=`` (see :meth:`candidates_after`; ``None``
            when the tokenizer merges the tag with the digits).
        counts: ``rewritten`` blocks, and ``unaligned`` and ``out_of_range`` ones (left as written), since the last
            :meth:`reset`.
    """

    #: the opening tag whose continuation :attr:`candidates` holds
    TAG = "<PATH confidence="

    def __init__(self, tokenizer: Any, digits: int = 2) -> None:
        self.tokenizer = tokenizer
        self.digits = digits
        self.texts = confidence_grid(digits)
        self.values = [float(v) for v in self.texts]
        self._after: dict[str, list[tuple[int, ...]] | None] = {}
        self.candidates = self.candidates_after(self.TAG)
        self.counts: Counter[str] = Counter()

    def reset(self) -> None:
        self.counts = Counter()

    def candidates_after(self, context: str) -> list[tuple[int, ...]] | None:
        """The token ids of every candidate value as the tokenizer writes it right after the text ``context``.

        ``None`` when some value does not start on a token boundary after ``context`` (the tokenizer merges the
        tag's last characters with the digits), or two values get the same tokens. Remembered per ``context``.

        Example (a byte-level tokenizer and a SentencePiece one, both splitting digits):
            ``encode("0.75")`` is ``[0, ., 7, 5]`` and ``[▁, 0, ., 7, 5]``; after ``"confidence="`` both give
            ``[0, ., 7, 5]``.
        """
        if context not in self._after:
            encode = self.tokenizer.encode
            head = encode(context, add_special_tokens=False)
            out: list[tuple[int, ...]] | None = []
            for text in self.texts:
                ids = encode(context + text, add_special_tokens=False)
                if ids[: len(head)] != head or len(ids) == len(head):
                    out = None
                    break
                out.append(tuple(ids[len(head) :]))
            if out is not None and len(set(out)) != len(out):
                out = None
            self._after[context] = out
        return self._after[context]

    @torch.no_grad()
    def distribution(
        self, model: Any, prefix: Sequence[int], candidates: Sequence[tuple[int, ...]] | None = None
    ) -> Tensor:
        """``p(v | prefix)`` over the candidate values (renormalised over them), a ``(len(values),)`` tensor.

        Args:
            model: the causal LM (called with ``input_ids`` and ``attention_mask``; returns ``.logits``).
            prefix: token ids up to the first digit of the confidence (the prompt included).
            candidates: each value's token ids in that context (default :attr:`candidates`, after
                ``<PATH confidence=``).
        """
        candidates = self.candidates if candidates is None else candidates
        if candidates is None:
            raise ValueError(
                f"the tokenizer merges {self.TAG!r} with the digits that follow it: pass the candidates' tokens for "
                "the context (candidates_after)"
            )
        # the inner nodes of the candidates' token trie: every proper prefix
        nodes = sorted({c[:k] for c in candidates for k in range(len(c))}, key=lambda p: (len(p), p))
        rows = [list(prefix) + list(node) for node in nodes]
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id or 0
        device = next(model.parameters()).device
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
        logits = model(input_ids=ids, attention_mask=mask).logits  # right padding: positions stay those of the text
        last = torch.tensor([len(r) - 1 for r in rows], device=device)
        logp = torch.log_softmax(logits[torch.arange(len(rows), device=device), last].float(), dim=-1)
        at = {node: i for i, node in enumerate(nodes)}
        scores = torch.stack(
            [sum((logp[at[c[:k]], c[k]] for k in range(len(c))), torch.zeros((), device=device)) for c in candidates]
        )
        return torch.softmax(scores, dim=0).cpu()

    def expected(self, model: Any, prefix: Sequence[int], candidates: Sequence[tuple[int, ...]] | None = None) -> float:
        """The expected confidence given ``prefix`` (see :meth:`distribution`)."""
        p = self.distribution(model, prefix, candidates)
        return float((p.double() * torch.tensor(self.values, dtype=torch.float64, device=p.device)).sum())

    def rewrite(self, model: Any, prompt: Sequence[int], generated: Sequence[int]) -> str:
        """The decoded ``generated`` text with each block's confidence replaced by its expected value.

        The values are scored as continuations of the block's own opening tag as written (with the quote, if the
        model quoted the value), so each candidate's tokens are those the tokenizer writes in that place.

        Args:
            model: the causal LM that generated the text.
            prompt: the prompt's token ids, without padding.
            generated: the generated token ids (padding and end tokens are skipped when decoding).
        """
        decode = self.tokenizer.decode
        text = decode(list(generated), skip_special_tokens=True)
        opens = list(_OPEN.finditer(text))
        if not opens:
            return text
        # the first token count whose decoded prefix is a given text: where each block's digits start
        prefixes: dict[str, int] = {}
        for k in range(len(generated) + 1):
            prefixes.setdefault(decode(list(generated[:k]), skip_special_tokens=True), k)
        out, pos = [], 0
        for m in opens:
            digits = _NUMBER.match(text, m.end())
            if digits is None:
                self.counts["unaligned"] += 1
                continue
            start, end = digits.span("value")
            k = prefixes.get(text[:start])
            candidates = self.candidates_after(text[m.start() : start])
            if k is None or candidates is None:
                self.counts["unaligned"] += 1
                continue
            stated = float(digits.group("value"))
            if not 0.0 <= stated <= 1.0:  # a malformed block stays malformed (the parser counts it)
                self.counts["out_of_range"] += 1
                continue
            value = self.expected(model, [*prompt, *generated[:k]], candidates)
            out.append(text[pos:start] + f"{value:.{self.digits}f}")
            pos = end
            self.counts["rewritten"] += 1
        return "".join(out) + text[pos:]
