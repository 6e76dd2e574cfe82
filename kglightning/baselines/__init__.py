"""KBQA baselines that propose answers (the detector's source of real hallucinations)."""

from kglightning.baselines.path_reasoner import EmbeddingPathReasoner
from kglightning.baselines.structural import StructuralBaseline

__all__ = ["EmbeddingPathReasoner", "StructuralBaseline"]
