"""LightningModules, one method per file."""

from kglightning.modules.detector import HallucinationDetector
from kglightning.modules.path_baseline import PathRetrievalBaseline

__all__ = ["HallucinationDetector", "PathRetrievalBaseline"]
