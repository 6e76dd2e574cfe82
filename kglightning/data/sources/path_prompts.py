"""The names this module held before ``import-predictions`` read more than RoG / GNN-RAG prompts, kept importable.

The prompt format lives in :mod:`~kglightning.data.sources.prompt_predictions`, the counts, answers and paths every
format shares in :mod:`~kglightning.data.sources.prediction_lines`, and the command (formats, ``--records`` joins,
splits, writing) in :mod:`~kglightning.data.sources.predictions_import`. :class:`PromptStats` is
:class:`~kglightning.data.sources.prediction_lines.ImportStats`.

    kglightning import-predictions --input predictions.jsonl --output data/gnn_rag_webqsp
"""

from __future__ import annotations

from kglightning.data.sources.prediction_lines import ARROW, ImportStats, split_reply
from kglightning.data.sources.predictions_import import main, split_by_question
from kglightning.data.sources.prompt_predictions import (
    PATHS_HEADER,
    QUESTION_HEADER,
    parse_reasoning_paths,
    read_prompt_predictions,
    record_from_prompt,
)

PromptStats = ImportStats

__all__ = [
    "ARROW",
    "PATHS_HEADER",
    "QUESTION_HEADER",
    "PromptStats",
    "main",
    "parse_reasoning_paths",
    "read_prompt_predictions",
    "record_from_prompt",
    "split_by_question",
    "split_reply",
]
