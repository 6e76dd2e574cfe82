"""Conformal prediction for KGQA: exact split-conformal thresholds, LTT p-values, FWER control (UAG).

The math lives in :mod:`kglightning.conformal.functional`; its public names are re-exported here. The
sampling-based baselines over an LLM's sampled answers live in :mod:`.sampling` (the data), :mod:`.clm` (CLM) and
:mod:`.lofree` (LoFreeCP).
"""

from kglightning.conformal import functional as _functional
from kglightning.conformal.clm import CLM, CLMConfig
from kglightning.conformal.functional import *  # noqa: F403  (the names of ``_functional.__all__``)
from kglightning.conformal.lofree import LoFreeCP
from kglightning.conformal.sampling import SampledAnswers
from kglightning.conformal.selection import AnswerSelector, GroupSelection, ScoredAnswers, Selection, calibration_floor

__all__ = [
    *_functional.__all__,
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
