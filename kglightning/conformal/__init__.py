"""Conformal prediction for KGQA: exact split-conformal thresholds, LTT p-values, FWER control (UAG).

The math lives in :mod:`kglightning.conformal.functional`; its public functions are re-exported here.
"""

from kglightning.conformal.functional import (
    LTTResult,
    binomial_cdf,
    binomial_tail_pvalue,
    bonferroni,
    conformal_quantile,
    conformal_rank,
    fixed_sequence,
    hoeffding_bentkus_pvalue,
    ltt_select,
    prediction_sets,
)

__all__ = [
    "LTTResult",
    "binomial_cdf",
    "binomial_tail_pvalue",
    "bonferroni",
    "conformal_quantile",
    "conformal_rank",
    "fixed_sequence",
    "hoeffding_bentkus_pvalue",
    "ltt_select",
    "prediction_sets",
]
