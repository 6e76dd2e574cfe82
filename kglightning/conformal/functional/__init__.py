"""Pure torch conformal prediction and Learn-Then-Test functions (vectorised over configuration grids)."""

from typing import TYPE_CHECKING

from kglightning.lazy import lazy_exports

if TYPE_CHECKING:  # the exports, imported on first use (kglightning.lazy)
    from kglightning.conformal.functional.ltt import LTTResult, bonferroni, fixed_sequence, ltt_select
    from kglightning.conformal.functional.pvalues import (
        betting_pvalue,
        binomial_cdf,
        binomial_tail_pvalue,
        hoeffding_bentkus_pvalue,
        student_t_sf,
    )
    from kglightning.conformal.functional.quantile import (
        conformal_min_n,
        conformal_quantile,
        conformal_rank,
        prediction_sets,
        unit_scores,
    )
    from kglightning.conformal.functional.selection import (
        benjamini_hochberg,
        best_per_question,
        conformal_pvalues,
        kept_rate_pvalues,
        question_cutoff,
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
]
