"""Conformal prediction for KGQA: exact split-conformal thresholds, LTT p-values, FWER control (UAG).

The math lives in :mod:`kglightning.conformal.functional`; its public names are re-exported here. The
sampling-based baselines over an LLM's sampled answers live in :mod:`.sampling` (the data), :mod:`.clm` (CLM) and
:mod:`.lofree` (LoFreeCP). The exports are imported on first use (:mod:`kglightning.lazy`): ``select`` and
``conformalize`` read their arguments before torch is imported.
"""

from typing import TYPE_CHECKING

from kglightning.lazy import lazy_exports

if TYPE_CHECKING:  # the exports, imported on first use (kglightning.lazy)
    from kglightning.conformal.clm import CLM, CLMConfig
    from kglightning.conformal.functional import (
        LTTResult,
        benjamini_hochberg,
        best_per_question,
        betting_pvalue,
        binomial_cdf,
        binomial_tail_pvalue,
        bonferroni,
        conformal_min_n,
        conformal_pvalues,
        conformal_quantile,
        conformal_rank,
        fixed_sequence,
        hoeffding_bentkus_pvalue,
        kept_rate_pvalues,
        ltt_select,
        prediction_sets,
        question_cutoff,
        student_t_sf,
        unit_scores,
    )
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
    "LTTResult",
    "benjamini_hochberg",
    "best_per_question",
    "betting_pvalue",
    "binomial_cdf",
    "binomial_tail_pvalue",
    "bonferroni",
    "conformal_min_n",
    "conformal_pvalues",
    "conformal_quantile",
    "conformal_rank",
    "fixed_sequence",
    "hoeffding_bentkus_pvalue",
    "kept_rate_pvalues",
    "ltt_select",
    "prediction_sets",
    "question_cutoff",
    "student_t_sf",
    "unit_scores",
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
