"""LightningModules, one method per file."""

from kglightning.modules.detector import HallucinationDetector
from kglightning.modules.path_baseline import PathRetrievalBaseline
from kglightning.modules.proxy_grpo import ProxyGRPO
from kglightning.modules.proxy_sft import ProxySFT
from kglightning.modules.relation_scorer import RelationScorer
from kglightning.modules.sgic import SGICCalibrator

__all__ = [
    "HallucinationDetector",
    "PathRetrievalBaseline",
    "ProxyGRPO",
    "ProxySFT",
    "RelationScorer",
    "SGICCalibrator",
]
