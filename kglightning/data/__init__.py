"""KGQA data, the ground floor: the RoG record schema, the per-question KG index, loaders (records and predictions
files), the embedded benchmark, text embeddings and the answer-proposer interface. The LightningDataModules that
serve it live one floor up, in :mod:`kglightning.datamodules`.

The text encoder pulls in sentence-transformers; it is imported on first use, so ``from kglightning.data import
KGQARecord`` stays light.
"""

from importlib import import_module
from typing import Any

from kglightning.data.kg import REVERSE_PREFIX, KGIndex, is_reverse, reverse
from kglightning.data.predictions import PredictionLine, PredictionList, read_predictions
from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.sources.loaders import RecordList, read_questions, read_records, write_records
from kglightning.data.triple_array import TripleArray, Vocab

_LAZY = {
    "RelationPair": "kglightning.data.relation_pairs",
    "mine_relation_pairs": "kglightning.data.relation_pairs",
    "EmbeddingCache": "kglightning.data.embeddings",
    "SentenceEncoder": "kglightning.data.encoder",
    "AnswerProposer": "kglightning.data.proposer",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kglightning.data' has no attribute {name!r}")


__all__ = [
    "AnswerProposer",
    "EmbeddingCache",
    "KGIndex",
    "KGQARecord",
    "PredictionLine",
    "PredictionList",
    "REVERSE_PREFIX",
    "RecordError",
    "RecordList",
    "RelationPair",
    "SentenceEncoder",
    "TripleArray",
    "Vocab",
    "is_reverse",
    "mine_relation_pairs",
    "read_predictions",
    "read_questions",
    "read_records",
    "reverse",
    "write_records",
]
