"""LightningModules, one method per file."""

from kglightning.modules.detector import HallucinationDetector
from kglightning.modules.path_baseline import PathRetrievalBaseline
from kglightning.modules.proxy_sft import ProxySFT

__all__ = ["HallucinationDetector", "PathRetrievalBaseline", "ProxySFT"]
