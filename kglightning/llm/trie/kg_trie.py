"""KG-Trie for the DoublyCal proxy: the token sequences of every valid ``<PATH>`` body of one question.

GCR (Luo et al., ICML 2025) writes each KG path of up to ``L`` hops from the topic entity as text, tokenizes it
and stores the token sequences in a prefix tree that constrains decoding. Here the text is the proxy's output
format (DoublyCal App. A.1, :func:`~kglightning.evidence.format.format_evidence`)::

    <PATH confidence=0.75>r1<SEP>r2<CONSTRAINT>r_c<SEP>c</CONSTRAINT></PATH>

and the valid bodies are every relation sequence walkable from the topic entities
(:meth:`~kglightning.data.kg.KGIndex.relation_paths`, ``~r`` for reverse hops), optionally each followed by a
constraint ``(r_c, c)`` that holds for at least one end entity of that sequence.

Tokenization boundaries. The model writes its own confidence digits, then the tag's ``>``, then the body. A
tokenizer may merge ``>`` with what follows (``>~``) or, without a pre-tokenizer, with the digits before it
(``5>``). So each string is tokenized *whole*, as the model saw it in training, and the stored sequence starts
at the token that contains the tag's ``>`` (the *boundary token*) and runs to the end of ``</PATH>``. The root's
children are therefore the tokens that close the opening tag. Every stored sequence is checked by decoding the
whole string back (``verify=True``); strings that do not round-trip are skipped and counted. The body is assumed
to tokenize the same whatever the confidence digits; tokenizers with digit-level pre-tokenization (GPT-2, Llama 3,
Qwen, SmolLM2) satisfy this. For others, pass several ``confidence_texts``: their sequences are all stored.

With ``confidence_position="after"`` (:mod:`kglightning.evidence.format`) the opening tag is a bare ``<PATH>`` and the
stored sequences are those of ``<PATH>body</PATH>``; the trailing ``<CONFIDENCE>`` element is free text after the
block, written outside the trie like any text between blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from kglightning.data.kg import KGIndex
from kglightning.data.kg_csr import csr_positions
from kglightning.evidence.builder import CVT_PATTERN
from kglightning.evidence.format import ConfidencePosition, format_evidence, writes_verbatim
from kglightning.llm.trie.token_trie import TokenTrie, TrieNode
from kglightning.llm.trie.vocab import TagVocab, decode_batch, encode_batch

__all__ = ["CLOSE_TAG", "OPEN_PREFIX", "EvidenceKey", "KGTrie", "valid_evidence"]

log = logging.getLogger(__name__)

OPEN_PREFIX = "<PATH confidence="
CLOSE_TAG = "</PATH>"
EvidenceKey = tuple[tuple[str, ...], tuple[str, str] | None]


def _constraints(kg: KGIndex, ends: Iterable[str], cap: int | None, skip_cvt: bool) -> list[tuple[str, str]]:
    """Every one-hop ``(label, constant)`` around ``ends`` (sorted by label id, then entity id), at most ``cap``."""
    ids = kg._ids(ends)
    if not ids.size:
        return []
    ptr, lab, dst = kg._both_csr()
    pos = csr_positions(ptr, ids)
    n = max(kg.num_entities, 1)
    out: list[tuple[str, str]] = []
    for key in np.unique(lab[pos] * n + dst[pos]).tolist():
        entity = kg._entities[key % n]
        if (skip_cvt and CVT_PATTERN.match(entity)) or not writes_verbatim(entity):
            continue  # a machine id, or a name that the <PATH> format would not print verbatim
        out.append((kg._labels[key // n], entity))
        if cap is not None and len(out) >= cap:
            break
    return out


def valid_evidence(
    kg: KGIndex,
    topics: str | Iterable[str],
    max_hops: int = 2,
    *,
    constraints: bool = False,
    max_constraints_per_path: int | None = None,
    max_paths: int | None = None,
    skip_cvt_constraints: bool = True,
) -> list[EvidenceKey]:
    """The evidence a constrained proxy may write for one question: ``(relations, constraint or None)`` pairs.

    Args:
        kg: the question's graph.
        topics: the topic entity (or entities); the paths start from any of them.
        max_hops: the longest relation path (GCR's ``L``).
        constraints: also list every valid constraint of each path (a one-hop ``(r_c, c)`` from one of its end
            entities, ``~r_c`` for a reverse hop).
        max_constraints_per_path: keep at most this many constraints per path (``None``: all).
        max_paths: cap on the relation paths (their number grows exponentially with ``max_hops``).
        skip_cvt_constraints: never use a machine id (``m.0abc``, :data:`~kglightning.evidence.builder.CVT_PATTERN`)
            as the constant of a constraint.

    Example:
        >>> kg = KGIndex.from_triples([("Snoopy", "sibling_of", "Spike"), ("Spike", "gender", "Male")])
        >>> valid_evidence(kg, "Snoopy")
        [(('sibling_of',), None), (('sibling_of', 'gender'), None)]
        >>> valid_evidence(kg, "Snoopy", constraints=True)[:3]
        [(('sibling_of',), None), (('sibling_of',), ('gender', 'Male')), (('sibling_of',), ('~sibling_of', 'Snoopy'))]
    """
    topics = [topics] if isinstance(topics, str) else list(topics)
    out: list[EvidenceKey] = []
    for relations, ends in kg.relation_paths(topics, max_hops, max_paths).items():
        out.append((relations, None))
        if constraints:
            out.extend((relations, c) for c in _constraints(kg, ends, max_constraints_per_path, skip_cvt_constraints))
    return out


def _body(relations: Sequence[str], constraint: tuple[str, str] | None) -> str:
    """The text between the opening tag and ``</PATH>``, as :func:`format_evidence` writes it."""
    return format_evidence(relations, constraint)[len("<PATH>") : -len(CLOSE_TAG)]


def _boundary(tokenizer: Any, vocab: TagVocab, ids: list[int], head: list[int], gt: int) -> int | None:
    """Index of the token holding the character ``gt`` (the tag's ``>``) in ``ids``; ``None`` if none does."""
    k = 0
    while k < min(len(ids), len(head)) and ids[k] == head[k]:
        k += 1
    if k < len(head):  # a merge across '>' (or earlier): find the first token whose text reaches past it
        while k < len(ids) and len(decode_batch(tokenizer, [ids[: k + 1]])[0]) <= gt:
            k += 1
    return k if k < len(ids) and ">" in vocab.text(ids[k]) else None


class KGTrie:
    """The token trie of one question's valid ``<PATH>`` bodies, with the sequences that close a block.

    Build it with :meth:`from_kg` (or :meth:`from_evidence` for a given list) and hand one per prompt to
    :class:`~kglightning.llm.trie.processor.KGTrieLogitsProcessor`.

    Args:
        trie: the token sequences, each from the boundary token through ``</PATH>``.
        vocab: the tokenizer's :class:`TagVocab`.
        tag_close: the tokens that close an open tag with an empty body (``></PATH>``), used when the trie is empty.
        body_close: the tokens of ``</PATH>``, forced at a dead end inside a body.
        skipped: evidence strings left out: unprintable names, or (per confidence text) no exact round trip.
        tokenizer: the tokenizer, kept for :meth:`bodies`.

    Example:
        >>> from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
        >>> from transformers import PreTrainedTokenizerFast
        >>> bpe = Tokenizer(models.BPE())
        >>> bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        >>> bpe.train_from_iterator(["<PATH confidence=0.5>sibling_of</PATH>"], trainers.BpeTrainer(
        ...     vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
        >>> tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
        >>> kg = KGIndex.from_triples([("Snoopy", "sibling_of", "Spike"), ("Spike", "gender", "Male")])
        >>> trie = KGTrie.from_kg(tok, kg, "Snoopy", max_hops=2, constraints=True)
        >>> len(trie), trie.skipped
        (5, 0)
        >>> trie.bodies()[:3]
        ['sibling_of', 'sibling_of<CONSTRAINT>gender<SEP>Male</CONSTRAINT>', 'sibling_of<CONSTRAINT>~sibling_of<SEP>Snoopy</CONSTRAINT>']
        >>> [tok.decode([t]) for t in trie.root.children]  # the tokens that close the opening tag
        ['>']
    """

    def __init__(
        self,
        trie: TokenTrie,
        vocab: TagVocab,
        tag_close: Sequence[int],
        body_close: Sequence[int],
        skipped: int = 0,
        tokenizer: Any = None,
    ) -> None:
        if not tag_close or not body_close:
            raise ValueError("tag_close and body_close must not be empty")
        self.trie = trie
        self.vocab = vocab
        self.tag_close = tuple(tag_close)
        self.body_close = tuple(body_close)
        self.skipped = skipped
        self.tokenizer = tokenizer
        self._masks: dict[tuple[int, torch.device], torch.Tensor] = {}

    @classmethod
    def from_evidence(
        cls,
        tokenizer: Any,
        evidence: Iterable[EvidenceKey],
        *,
        confidence_texts: Sequence[str] = ("0.5",),
        confidence_position: ConfidencePosition = "open",
        verify: bool = True,
    ) -> KGTrie:
        """Tokenize ``(relations, constraint)`` pairs in the proxy format and store them.

        Args:
            tokenizer: the proxy's tokenizer (a transformers tokenizer).
            evidence: the valid evidence (see :func:`valid_evidence`).
            confidence_texts: confidence values written into the opening tag while tokenizing (see the module
                docstring); the sequences of all of them are stored.
            confidence_position: ``"after"``: the blocks open with a bare ``<PATH>`` (``confidence_texts`` unused).
            verify: skip (and count) strings whose token ids do not decode back to the exact string.
        """
        vocab = TagVocab.of(tokenizer)
        bodies: dict[str, None] = {}
        skipped = 0
        for relations, constraint in evidence:
            try:
                bodies[_body(relations, constraint)] = None
            except ValueError:  # a name with '<' or '>' cannot be written in the format
                skipped += 1
        trie, bad = TokenTrie(), 0
        tag_close: list[int] | None = None
        if confidence_position not in ("open", "after"):
            raise ValueError(f"confidence_position must be 'open' or 'after', got {confidence_position!r}")
        heads = ["<PATH"] if confidence_position == "after" else [OPEN_PREFIX + c for c in confidence_texts]
        for head_text in heads:
            head = encode_batch(tokenizer, [head_text])[0]
            strings = [f"{head_text}>{b}{CLOSE_TAG}" for b in bodies] + [f"{head_text}>{CLOSE_TAG}"]
            full = encode_batch(tokenizer, strings)
            back = decode_batch(tokenizer, full) if verify else strings
            for i, (s, ids, d) in enumerate(zip(strings, full, back)):
                ok = d == s or d.lstrip() == s  # SentencePiece may add a space before the first token
                k = _boundary(tokenizer, vocab, ids, head, len(head_text)) if ok else None
                if i == len(bodies):  # the empty body: how an open tag closes when nothing is valid
                    tag_close = tag_close or (ids[k:] if k is not None else None)
                elif k is None:
                    bad += 1
                else:
                    trie.insert(ids[k:])
        body_close = encode_batch(tokenizer, [CLOSE_TAG])[0]
        if tag_close is None or decode_batch(tokenizer, [body_close])[0].strip() != CLOSE_TAG:
            raise ValueError(f"cannot tokenize {CLOSE_TAG!r} so that it decodes back exactly with this tokenizer")
        if bad:
            log.warning("KG-Trie: %d evidence strings do not round-trip through the tokenizer; skipped", bad)
        return cls(trie, vocab, tag_close, body_close, skipped + bad, tokenizer)

    @classmethod
    def from_kg(
        cls,
        tokenizer: Any,
        kg: KGIndex,
        topics: str | Iterable[str],
        max_hops: int = 2,
        *,
        constraints: bool = False,
        max_constraints_per_path: int | None = None,
        max_paths: int | None = None,
        skip_cvt_constraints: bool = True,
        confidence_texts: Sequence[str] = ("0.5",),
        confidence_position: ConfidencePosition = "open",
        verify: bool = True,
    ) -> KGTrie:
        """The trie of every valid evidence of one question (arguments as in :func:`valid_evidence`)."""
        evidence = valid_evidence(
            kg,
            topics,
            max_hops,
            constraints=constraints,
            max_constraints_per_path=max_constraints_per_path,
            max_paths=max_paths,
            skip_cvt_constraints=skip_cvt_constraints,
        )
        return cls.from_evidence(
            tokenizer,
            evidence,
            confidence_texts=confidence_texts,
            confidence_position=confidence_position,
            verify=verify,
        )

    @classmethod
    def from_record(cls, tokenizer: Any, record: Any, max_hops: int = 2, **kwargs: Any) -> KGTrie:
        """:meth:`from_kg` on a :class:`~kglightning.data.records.KGQARecord` (its graph and ``q_entity``)."""
        return cls.from_kg(tokenizer, KGIndex.from_record(record), record.q_entity, max_hops, **kwargs)

    @property
    def root(self) -> TrieNode:
        """The node just before the boundary token: its children close the opening tag."""
        return self.trie.root

    def __len__(self) -> int:
        """The number of stored token sequences."""
        return len(self.trie)

    def __repr__(self) -> str:
        return f"KGTrie(sequences={len(self.trie)}, nodes={self.trie.num_nodes}, skipped={self.skipped})"

    def tag_exits(self) -> list[int]:
        """The tokens that may close the opening tag: the root's children, or ``tag_close[0]`` if there are none."""
        return list(self.root.children) if self.root.children else [self.tag_close[0]]

    def tag_exit_ids(self, device: torch.device) -> torch.Tensor:
        """:meth:`tag_exits` as a ``(n,)`` long tensor on ``device`` (cached)."""
        if self.root.children:
            return self.root.allowed(device)
        key = (-1, device)
        if key not in self._masks:
            self._masks[key] = torch.tensor([self.tag_close[0]], dtype=torch.long, device=device)
        return self._masks[key]

    def tag_ban(self, width: int, device: torch.device) -> torch.Tensor:
        """Tokens banned inside an opening tag, as a ``(width,)`` bool mask: all but plain tokens and the exits."""
        key = (width, device)
        if key not in self._masks:
            self._masks[key] = ~self.vocab.tag_allow(self.tag_exits(), width, device)
        return self._masks[key]

    def bodies(self) -> list[str]:
        """The stored sequences decoded, without the tag's ``>`` and ``</PATH>`` (needs the tokenizer)."""
        if self.tokenizer is None:
            raise ValueError("this KGTrie was built without a tokenizer")
        texts = decode_batch(self.tokenizer, sorted(self.trie))
        return sorted({t[t.index(">") + 1 : -len(CLOSE_TAG)] for t in texts})
