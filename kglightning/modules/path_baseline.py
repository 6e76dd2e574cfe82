"""The embedding path-retrieval KBQA baseline as a LightningModule, so ``predict`` writes its answers."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from kglightning.baselines.path_reasoner import EmbeddingPathReasoner
from kglightning.data.records import KGQARecord


class PathRetrievalBaseline(L.LightningModule):
    """Runs :class:`EmbeddingPathReasoner` on batches of records; ``predict`` returns records with
    ``prediction`` and ``confidence`` (write them with :class:`~kglightning.callbacks.JsonlPredictionWriter`).

    It has no trainable parameters: ``fit`` is not meaningful for it.

    Args:
        reasoner: the path reasoner (default settings when omitted).
    """

    def __init__(self, reasoner: EmbeddingPathReasoner | None = None) -> None:
        super().__init__()
        self.reasoner = reasoner or EmbeddingPathReasoner(show_progress=False)

    def predict_step(self, batch: list[KGQARecord], batch_idx: int) -> list[KGQARecord]:
        return self.reasoner.propose(batch, chunk_size=len(batch) or 1)

    def on_predict_end(self) -> None:
        if self.reasoner.num_abstained:
            print(f"path baseline abstained on {self.reasoner.num_abstained} questions (no topic entity or path)")

    def configure_optimizers(self) -> Any:
        raise RuntimeError("PathRetrievalBaseline has no trainable parameters; use `predict`, not `fit`")

    def forward(self, batch: list[KGQARecord]) -> list[KGQARecord]:
        with torch.no_grad():
            return self.reasoner.propose(batch)
