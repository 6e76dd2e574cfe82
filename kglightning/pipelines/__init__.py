"""Inference pipelines that chain kglightning's parts, each a LightningModule run by ``predict``.

* :class:`DoublyCalPipeline`: proxy evidence → grounding → verbalized confidence → reasoner, with its ablations.
* :class:`KGGuardRefinement`: the detector flags answer nodes, the LLM revises flagged answers, up to a cap.
* :class:`SGICPipeline`: uncertainty-guided iterative self-calibration of an LLM's answers over documents.
* :class:`UAGReasoner`: conformal KG traversal with Learn-Then-Test error control, beside Top-K and split CP.
"""

from kglightning.pipelines.doublycal import VARIANTS, DoublyCalPipeline
from kglightning.pipelines.refinement import KGGuardRefinement, load_detector
from kglightning.pipelines.report import comparison_markdown, write_comparison
from kglightning.pipelines.sgic import SGICPipeline
from kglightning.pipelines.uag import UAGReasoner

__all__ = [
    "VARIANTS",
    "DoublyCalPipeline",
    "KGGuardRefinement",
    "SGICPipeline",
    "UAGReasoner",
    "comparison_markdown",
    "load_detector",
    "write_comparison",
]
