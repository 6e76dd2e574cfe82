"""Graph-constrained decoding with a KG-Trie that fails closed, as a transformers ``LogitsProcessor``.

Each generated row runs a small state machine over its own generated token ids (the prompt only sets the start
state). Tag detection reads the text of each token (:class:`~kglightning.llm.trie.vocab.TagVocab`); inside a
body only token ids matter. Transitions, on the token just generated::

    FREE  -- the text now holds "<PATH" (any case, spaces after "<") ---------------> TAG
    TAG   -- a plain token (confidence digits, ...) --------------------------------> TAG (count + 1)
    TAG   -- an exit token: a child of the trie root, it holds the tag's ">" -------> BODY
    TAG   -- the first token of "></PATH>" (only when the trie is empty) -----------> CLOSE
    TAG   -- any other token holding ">" (dead end) --------------------------------> CLOSE ("</PATH>")
    BODY  -- a trie child ----------------------------------------------------------> BODY
    BODY  -- the trie child that completes "</PATH>" (a leaf) ----------------------> FREE
    BODY  -- a token with no trie child (dead end) ---------------------------------> CLOSE ("</PATH>")
    CLOSE -- the forced token ------------------------------------------------------> CLOSE, FREE after the last

The end of the prompt sets the start state: ``FREE``; ``TAG`` when it ends inside ``<PATH confidence=``;
``BODY`` when its last token is an exit; ``CLOSE`` when it ends inside a body that the trie cannot follow.

Allowed next tokens per state:

* ``FREE`` (outside a block): every token, except a token holding a whole ``<PATH ...>`` tag by itself and, while
  the text ends with the start of a tag (``<``, ``<PA``), every token containing ``>``. So no tag can close
  without passing through ``TAG``.
* ``TAG`` (inside ``<PATH confidence=...``): *free* text, i.e. every token without ``<`` or ``>`` that is not a
  special token (the model writes its own confidence digits), plus the exit tokens. After ``max_tag_tokens``
  tokens in the tag, only the exits.
* ``BODY``: only the children of the current trie node. The stored sequences end with ``</PATH>``, so the leaf
  closes the block and the row goes back to ``FREE``.
* ``CLOSE``: only the next token of the forced closing sequence.

Failing closed. GCR's ``prefix_allowed_tokens_fn`` returns *all* tokens when the trie has no continuation, which
lets a generation leave the KG. Here a dead end allows only the tokens that close the path: inside a body (the
generated prefix is not in the trie, which happens only when the prefix did not come from this processor, e.g. a
prompt that ends inside a block, or another processor forcing a token) ``</PATH>`` is forced; in a tag whose trie
is empty (no valid path: the topic entity is not in the graph) ``></PATH>`` is forced, an empty block that
:func:`~kglightning.evidence.format.parse_evidence` rejects as ``empty_relation``. Special tokens (EOS) are not
allowed inside a block, so a block ends by ``</PATH>`` or by the length limit (then it is unclosed, hence
malformed, never a path).

Rows map to tries like prompts: with ``B`` tries and ``B * k`` rows (beams or ``num_return_sequences``), row ``r``
uses trie ``r // k``. States are keyed by (prompt, generated ids), so beam reordering is safe. Use a new processor,
or call :meth:`KGTrieLogitsProcessor.reset`, for every ``generate`` call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import torch
from transformers import LogitsProcessor

from kglightning.llm.trie.kg_trie import KGTrie
from kglightning.llm.trie.token_trie import TrieNode
from kglightning.llm.trie.vocab import OPEN_TAG_RE, pending_tag

__all__ = ["KGTrieLogitsProcessor"]

FREE, TAG, BODY, CLOSE = range(4)
_CLOSE_TAG_RE = re.compile(r"<\s*/\s*path[^<>]*>", re.I)


class _State(NamedTuple):
    mode: int
    tail: str = ""  # FREE: the text that may grow into "<PATH"
    count: int = 0  # TAG: tokens since "<PATH"; CLOSE: position in ``seq``
    node: TrieNode | None = None  # BODY: the current trie node
    seq: tuple[int, ...] = ()  # CLOSE: the forced closing tokens


_FREE = _State(FREE)


class KGTrieLogitsProcessor(LogitsProcessor):
    """Constrain every ``<PATH>`` block that a model generates to its prompt's KG-Trie (see the module docstring).

    Pass it as ``model.generate(..., logits_processor=LogitsProcessorList([processor]))``, or pass
    :meth:`allowed_tokens` as ``prefix_allowed_tokens_fn`` (GCR's interface; slower, since it lists all allowed
    ids outside blocks).

    Args:
        tries: one :class:`~kglightning.llm.trie.kg_trie.KGTrie` per prompt (a single trie serves a batch of one
            prompt), all built with the same tokenizer.
        max_tag_tokens: tokens allowed between ``<PATH`` and the tag's ``>``; then the tag must close.

    Attributes:
        dead_ends: how many times a row hit a dead end and was forced to close its block.
    """

    def __init__(self, tries: KGTrie | Sequence[KGTrie], max_tag_tokens: int = 16) -> None:
        self.tries = [tries] if isinstance(tries, KGTrie) else list(tries)
        if not self.tries:
            raise ValueError("need at least one KGTrie")
        if len({t.vocab.size for t in self.tries}) > 1:
            raise ValueError("all tries must come from the same tokenizer")
        if max_tag_tokens < 0:
            raise ValueError(f"max_tag_tokens must be >= 0, got {max_tag_tokens}")
        self.max_tag_tokens = max_tag_tokens
        self.dead_ends = 0
        self._lists: dict[tuple[str, int], list[int]] = {}
        self.reset()

    def reset(self) -> None:
        """Forget the rows of the previous ``generate`` call."""
        self._prompt_len: int | None = None
        self._per = 1
        self._init: dict[int, _State] = {}
        self._len = -1
        self._cur: dict[tuple[int, tuple[int, ...]], _State] = {}
        self._prev: dict[tuple[int, tuple[int, ...]], _State] = {}

    # state tracking

    def _initial(self, b: int, prompt: list[int]) -> _State:
        """The state at the end of a prompt (which may open a tag or a body for the model to continue)."""
        trie = self.tries[b]
        text = "".join(map(trie.vocab.text, prompt))
        last = max(OPEN_TAG_RE.finditer(text), key=lambda m: m.start(), default=None)
        if last is None:
            return _State(FREE, tail=pending_tag(text))
        after = text[last.end() :]
        j = next((i for i, ch in enumerate(after) if ch in "<>"), None)
        if j is None:
            return _State(TAG)
        if after[j] == "<" or _CLOSE_TAG_RE.search(after, j):
            return _State(FREE, tail=pending_tag(text))
        # the prompt ends inside a body: fine if the tag's '>' came with the last token and that token is an exit
        child = trie.root.children.get(prompt[-1]) if prompt else None
        if child is not None and len(after) - j <= len(trie.vocab.text(prompt[-1])):
            return _FREE if child.terminal else _State(BODY, node=child)
        self.dead_ends += 1
        return _State(CLOSE, seq=trie.body_close)

    def _free(self, trie: KGTrie, text: str) -> _State:
        m = OPEN_TAG_RE.search(text)
        if m is None:
            return _State(FREE, tail=pending_tag(text)) if "<" in text else _FREE
        if ">" in text[m.end() :]:  # a tag closed in the same token: not reachable under this processor
            self.dead_ends += 1
            return _State(CLOSE, seq=trie.body_close)
        return _State(TAG)

    def _advance(self, b: int, st: _State, tok: int) -> _State:
        """The state after token ``tok``."""
        trie = self.tries[b]
        if st.mode == FREE:
            text = trie.vocab.text(tok)
            return self._free(trie, st.tail + text) if st.tail or "<" in text else _FREE
        if st.mode == CLOSE:
            pos = st.count + 1 if tok == st.seq[st.count] else len(st.seq)
            return _FREE if pos >= len(st.seq) else st._replace(count=pos)
        node = trie.root if st.mode == TAG else st.node
        assert node is not None
        child = node.children.get(tok)
        if child is not None:
            return _FREE if child.terminal else _State(BODY, node=child)
        if st.mode == TAG:
            if not trie.root.children and tok == trie.tag_close[0]:
                return _FREE if len(trie.tag_close) == 1 else _State(CLOSE, count=1, seq=trie.tag_close)
            if ">" not in trie.vocab.text(tok):
                return st._replace(count=st.count + 1)
        self.dead_ends += 1  # off the trie: only closing is allowed from here
        return _State(CLOSE, seq=trie.body_close)

    def _state(self, b: int, gen: tuple[int, ...]) -> _State:
        """The state of batch item ``b`` after generating ``gen``, from the previous step's state when known."""
        key = (b, gen)
        st = self._cur.get(key)
        if st is None:
            prev = self._prev.get((b, gen[:-1])) if gen else None
            if prev is not None:
                st = self._advance(b, prev, gen[-1])
            else:
                st = self._init[b]
                for tok in gen:
                    st = self._advance(b, st, tok)
            self._cur[key] = st
        return st

    def _init_prompt(self, b: int, row: list[int]) -> None:
        if b not in self._init:
            assert self._prompt_len is not None
            self._init[b] = self._initial(b, row[: self._prompt_len])

    def _new_step(self, length: int) -> None:
        if self._prompt_len is None or length < self._len:
            self.reset()
            self._prompt_len = length
        if length != self._len:
            self._prev, self._cur, self._len = self._cur, {}, length

    # the two generate interfaces

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Mask the scores of every row to its allowed tokens.

        Args:
            input_ids: ``(rows, seq_len)`` prompt and generated ids.
            scores: ``(rows, vocab)`` next-token scores; not modified (a masked copy is returned when needed).

        Returns:
            ``(rows, vocab)`` scores with disallowed tokens at ``-inf``.
        """
        rows, length = input_ids.shape
        if self._prompt_len is not None and length <= self._len:
            self.reset()  # a new generate call with the same processor
        self._new_step(length)
        if rows % len(self.tries):
            raise ValueError(f"{rows} rows cannot be split over {len(self.tries)} tries")
        self._per = rows // len(self.tries)
        width, device = scores.shape[1], scores.device
        if len(self._init) < len(self.tries):  # the first step: read the prompts
            for r, row in enumerate(input_ids[:: self._per].tolist()):
                self._init_prompt(r, row)
        out: torch.Tensor | None = None
        picks: list[tuple[int, torch.Tensor]] = []
        for r, gen in enumerate(input_ids[:, self._prompt_len :].tolist()):
            b = r // self._per
            st, trie = self._state(b, tuple(gen)), self.tries[b]
            if st.mode == FREE:
                ban = trie.vocab.free_ban(bool(st.tail), width, device)
            elif st.mode == TAG and st.count < self.max_tag_tokens:
                ban = trie.tag_ban(width, device)
            else:
                ban = None
                if st.mode == BODY:
                    assert st.node is not None
                    picks.append((r, st.node.allowed(device)))
                elif st.mode == TAG:
                    picks.append((r, trie.tag_exit_ids(device)))
                else:
                    picks.append((r, torch.tensor([st.seq[st.count]], dtype=torch.long, device=device)))
            if ban is not None:
                out = scores.clone() if out is None else out
                out[r].masked_fill_(ban, float("-inf"))
        if picks:  # keep only the picked ids of these rows, in a few vectorized ops
            out = scores.clone() if out is None else out
            rows_t = torch.tensor([r for r, _ in picks], dtype=torch.long, device=device)
            cols = torch.cat([ids for _, ids in picks])
            keep = rows_t.repeat_interleave(torch.tensor([len(ids) for _, ids in picks], device=device))
            vals = out[keep, cols]
            out[rows_t] = float("-inf")
            out[keep, cols] = vals
        return scores if out is None else out

    def allowed_tokens(self, batch_id: int, input_ids: torch.Tensor) -> list[int]:
        """``prefix_allowed_tokens_fn(batch_id, input_ids)`` for ``generate``: the allowed next token ids.

        Args:
            batch_id: the prompt index (``PrefixConstrainedLogitsProcessor`` passes ``row // num_beams``).
            input_ids: ``(seq_len,)`` prompt and generated ids of one row.
        """
        row = input_ids.tolist()
        self._new_step(len(row))
        self._init_prompt(batch_id, row)
        st, trie = self._state(batch_id, tuple(row[self._prompt_len :])), self.tries[batch_id]
        if st.mode == BODY:
            assert st.node is not None
            return list(st.node.children)
        if st.mode == CLOSE:
            return [st.seq[st.count]]
        if st.mode == TAG and st.count >= self.max_tag_tokens:
            return trie.tag_exits()
        if st.mode == TAG:
            key = ("tag", batch_id)
            if key not in self._lists:
                self._lists[key] = (~trie.tag_ban(trie.vocab.size, torch.device("cpu"))).nonzero().flatten().tolist()
            return self._lists[key]
        key = ("pending" if st.tail else "free", id(trie.vocab))
        if key not in self._lists:
            ban = trie.vocab.free_ban(bool(st.tail), trie.vocab.size, torch.device("cpu"))
            n = trie.vocab.size
            self._lists[key] = list(range(n)) if ban is None else (~ban).nonzero().flatten().tolist()
        return self._lists[key]
