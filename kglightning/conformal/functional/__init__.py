"""Pure torch conformal prediction and Learn-Then-Test functions (vectorised over configuration grids)."""

from kglightning.conformal.functional.ltt import LTTResult, bonferroni, fixed_sequence, ltt_select
from kglightning.conformal.functional.pvalues import binomial_cdf, binomial_tail_pvalue, hoeffding_bentkus_pvalue
from kglightning.conformal.functional.quantile import conformal_quantile, conformal_rank, prediction_sets

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
