"""Conformal prediction for KGQA: exact split-conformal thresholds, LTT p-values, FWER control (UAG).

The math lives in :mod:`kglightning.conformal.functional`; its public names are re-exported here. The
sampling-based baselines over an LLM's sampled answers live in :mod:`.sampling` (the data), :mod:`.clm` (CLM) and
:mod:`.lofree` (LoFreeCP). The exports are imported on first use (:mod:`kglightning.lazy`): ``select`` and
``conformalize`` read their arguments before torch is imported.
"""

from typing import TYPE_CHECKING

from kglightning.conformal.functional import __all__ as _functional_all  # the names only: nothing is imported
from kglightning.lazy import lazy_exports

if TYPE_CHECKING:  # the exports, imported on first use (kglightning.lazy)
    from kglightning.conformal.clm import CLM, CLMConfig
    from kglightning.conformal.functional import *  # noqa: F403  (its declared exports)
    from kglightning.conformal.lofree import LoFreeCP
    from kglightning.conformal.sampling import SampledAnswers
    from kglightning.conformal.selection import (
        AnswerSelector,
        GroupSelection,
        ScoredAnswers,
        Selection,
        calibration_floor,
    )

__getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    *_functional_all,
    "CLM",
    "CLMConfig",
    "LoFreeCP",
    "SampledAnswers",
    "AnswerSelector",
    "GroupSelection",
    "ScoredAnswers",
    "Selection",
    "calibration_floor",
]
