"""KG-Trie graph-constrained decoding for the DoublyCal proxy (GCR's idea, failing closed on dead ends).

* :class:`KGTrie` stores the token sequences of a question's valid ``<PATH>`` bodies
  (:func:`valid_evidence`: every relation path of up to ``L`` hops from the topic entity, optionally with its
  valid constraints).
* :class:`KGTrieLogitsProcessor` constrains ``generate`` with one trie per prompt; see
  :mod:`kglightning.llm.trie.processor` for the state machine.
* :func:`path_validity` counts the generated paths that are not in the KG (the hallucinated-path rate).

Example:
    >>> from transformers import LogitsProcessorList  # doctest: +SKIP
    >>> tries = [KGTrie.from_record(tokenizer, rec, max_hops=2) for rec in records]  # doctest: +SKIP
    >>> out = model.generate(**enc, logits_processor=LogitsProcessorList([KGTrieLogitsProcessor(tries)]))  # doctest: +SKIP
"""

from kglightning.llm.trie.config import TrieConfig
from kglightning.llm.trie.kg_trie import CLOSE_TAG, OPEN_PREFIX, EvidenceKey, KGTrie, valid_evidence
from kglightning.llm.trie.processor import KGTrieLogitsProcessor
from kglightning.llm.trie.token_trie import TokenTrie, TrieNode
from kglightning.llm.trie.validity import PathValidity, is_walkable, path_validity
from kglightning.llm.trie.vocab import TagVocab

__all__ = [
    "CLOSE_TAG",
    "OPEN_PREFIX",
    "EvidenceKey",
    "KGTrie",
    "KGTrieLogitsProcessor",
    "PathValidity",
    "TagVocab",
    "TokenTrie",
    "TrieConfig",
    "TrieNode",
    "is_walkable",
    "path_validity",
    "valid_evidence",
]
