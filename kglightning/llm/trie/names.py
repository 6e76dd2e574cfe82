"""Structured generation of answers that are node names of a subgraph: one name per line, or ``unknown``.

KG-Guard's answerer (KAPING over a PCST subgraph) may only answer with nodes of the question's subgraph, or abstain.
:class:`NameChoice` describes what one prompt may produce; :class:`NameListLogitsProcessor` enforces it in
``generate``: each answer line is a path through a :class:`~kglightning.llm.trie.token_trie.TokenTrie` of the
tokenized names, each followed by the line separator or by EOS; after a separator a new name starts (or, after the
first, EOS ends the list); after ``max_answers`` names only EOS is allowed; ``unknown`` is one more choice, allowed
only as the first and only line. Everything else is masked to ``-inf``, so the decoded text splits into names of
the set and nothing else (up to the length limit, which can cut the last name short: :meth:`NameChoice.parse`
drops an unfinished name and counts it).

Names are tokenized as they appear at the start of a line (no leading space). Generation stops on EOS; a model
cannot stop in the middle of a name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LogitsProcessor

from kglightning.llm.trie.token_trie import TokenTrie

__all__ = ["UNKNOWN", "NameChoice", "NameListLogitsProcessor"]

UNKNOWN = "unknown"


@dataclass(frozen=True)
class NameChoice:
    """The answers one prompt may produce: up to ``max_answers`` of ``names``, one per line, or ``unknown``.

    Args:
        names: the allowed answers (e.g. the node names of the question's subgraph); duplicates are ignored.
        max_answers: most names in one answer.
        allow_unknown: whether the model may abstain with ``unknown``.
    """

    names: tuple[str, ...]
    max_answers: int = 5
    allow_unknown: bool = True
    _set: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = tuple(dict.fromkeys(n for n in self.names if n.strip() and "\n" not in n))
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "_set", frozenset(names))
        if self.max_answers < 1:
            raise ValueError(f"max_answers must be >= 1, got {self.max_answers}")
        if not names and not self.allow_unknown:
            raise ValueError("no name to choose from and unknown is not allowed")

    @property
    def key(self) -> str:
        """A short hash of the choice (part of a response-cache key)."""
        text = "\n".join((*sorted(self.names), f"max={self.max_answers}", f"unknown={self.allow_unknown}"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def regex(self) -> str:
        """The same structure as a regular expression (for servers that constrain decoding by regex, e.g. vLLM).

        Example:
            >>> import re
            >>> pattern = NameChoice(("Paris", "St. Louis"), max_answers=2).regex()
            >>> [bool(re.fullmatch(pattern, t)) for t in ("Paris\\nSt. Louis", "St. Louis", "unknown", "Lyon", "St- Louis")]
            [True, True, True, False, False]
        """
        names = "|".join(_escape(n) for n in sorted(self.names, key=lambda n: (-len(n), n)))
        lines = f"(?:{names})(?:\n(?:{names})){{0,{self.max_answers - 1}}}" if names else ""
        return "|".join(x for x in (lines, UNKNOWN if self.allow_unknown else "") if x)

    def parse(self, text: str) -> tuple[list[str], bool, int]:
        """``(answers, abstained, dropped)``: the distinct names of ``text`` in order, whether it is ``unknown``,
        and how many lines are not a name of the set (e.g. cut by the length limit).

        Example:
            >>> NameChoice(("Paris", "Lyon")).parse("Paris\\nLyon\\nParis\\nLy")
            (['Paris', 'Lyon'], False, 1)
            >>> NameChoice(("Paris",)).parse("unknown")
            ([], True, 0)
        """
        lines = [line.strip() for line in text.strip().split("\n") if line.strip()]
        if self.allow_unknown and lines == [UNKNOWN]:
            return [], True, 0
        names = [line for line in lines if line in self._set]
        return list(dict.fromkeys(names)), False, len(lines) - len(names)


def _escape(text: str) -> str:
    """``text`` as a regex literal, escaping only the metacharacters (``re.escape`` also escapes spaces, ``-``, ``#``,
    ``&`` and ``~``, and xgrammar, one of vLLM's grammar engines, warns on each such escape it does not know).

    Example:
        >>> import re
        >>> _escape("St. Louis (Missouri) - A&M"), bool(re.fullmatch(_escape("a+b [c]"), "a+b [c]"))
        ('St\\\\. Louis \\\\(Missouri\\\\) - A&M', True)
    """
    return _META.sub(r"\\\g<0>", text)


_META = re.compile(r"[\\.^$*+?()\[\]{}|]")


class _ChoiceTrie:
    """The token tries of one :class:`NameChoice`: the first line (names and ``unknown``) and later lines (names)."""

    def __init__(self, choice: NameChoice, tokenizer: Any, eos: Sequence[int]) -> None:
        self.choice = choice
        self.sep = tuple(tokenizer.encode("\n", add_special_tokens=False))
        self.eos = sorted(set(eos))
        if not self.eos:
            raise ValueError("the tokenizer has no EOS token; a name list could never end")
        encoded = tokenizer(list(choice.names), add_special_tokens=False)["input_ids"] if choice.names else []
        encoded = [ids for ids in encoded if ids]
        self.unknown = tuple(tokenizer.encode(UNKNOWN, add_special_tokens=False)) if choice.allow_unknown else ()
        self.names = TokenTrie(encoded)
        self.first = TokenTrie(encoded + ([list(self.unknown)] if self.unknown else []))

    def allowed(self, gen: Sequence[int]) -> list[int]:
        """The allowed next tokens after ``gen`` (the ids generated so far for this prompt)."""
        pos, done, n = 0, 0, len(gen)
        while True:
            start, node = pos, (self.first if done == 0 else self.names).root
            while pos < n and gen[pos] in node.children:
                node = node.children[gen[pos]]
                pos += 1
            line = tuple(gen[start:pos])
            abstained = done == 0 and bool(self.unknown) and line == self.unknown
            if pos == n:
                break
            tail = tuple(gen[pos:])
            if not node.terminal or abstained or pos == start:
                return self.eos  # off the trie (not generated under this processor): end
            if tail[: len(self.sep)] == self.sep:
                pos, done = pos + len(self.sep), done + 1
                if pos == n:  # a new line starts
                    start, node, line, abstained = pos, self.names.root, (), False
                    break
                continue
            if tail == self.sep[: len(tail)]:
                return [self.sep[len(tail)]]  # inside a multi-token separator
            return self.eos
        if pos == start:  # at the start of a line
            if done >= self.choice.max_answers:
                return self.eos
            return sorted(set(node.children).union(self.eos if done else ()))
        allowed = set(node.children)
        if node.terminal:
            allowed.update(self.eos)
            if not abstained and done + 1 < self.choice.max_answers:
                allowed.add(self.sep[0])
        return sorted(allowed) or self.eos


class NameListLogitsProcessor(LogitsProcessor):
    """Constrain each prompt's generation to its :class:`NameChoice` (see the module docstring).

    Args:
        choices: one choice per prompt; with ``k`` rows per prompt (``num_return_sequences``), row ``r`` uses
            choice ``r // k``.
        tokenizer: the model's tokenizer.
        eos_token_ids: the ids that end a generation.

    Example:
        >>> from transformers import LogitsProcessorList  # doctest: +SKIP
        >>> proc = NameListLogitsProcessor([NameChoice(("Paris", "Lyon"))], tokenizer, [tokenizer.eos_token_id])  # doctest: +SKIP
        >>> model.generate(**enc, logits_processor=LogitsProcessorList([proc]))  # doctest: +SKIP
    """

    def __init__(self, choices: Sequence[NameChoice], tokenizer: Any, eos_token_ids: Sequence[int]) -> None:
        if not choices:
            raise ValueError("no choice given")
        self.tries = [_ChoiceTrie(c, tokenizer, eos_token_ids) for c in choices]
        self._prompt_len: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, length = input_ids.shape
        if self._prompt_len is None or length <= self._prompt_len:
            self._prompt_len = length  # the first step of a generate call
        if rows % len(self.tries):
            raise ValueError(f"{rows} rows cannot be split over {len(self.tries)} choices")
        per = rows // len(self.tries)
        keep_rows, keep_cols = [], []
        for r, gen in enumerate(input_ids[:, self._prompt_len :].tolist()):
            ids = self.tries[r // per].allowed(gen)
            keep_rows += [r] * len(ids)
            keep_cols += ids
        device = scores.device
        rows_t = torch.tensor(keep_rows, dtype=torch.long, device=device)
        cols_t = torch.tensor(keep_cols, dtype=torch.long, device=device)
        out = torch.full_like(scores, float("-inf"))
        out[rows_t, cols_t] = scores[rows_t, cols_t]
        return out
