"""Functional metrics: the math behind the Metric classes of :mod:`kglightning.metrics`."""

from kglightning.metrics.functional.calibration import (
    brier_score,
    calibration_bin_sums,
    calibration_error_from_bin_sums,
    expected_calibration_error,
    maximum_calibration_error,
    reliability_bins,
    target_calibration_error,
)
from kglightning.metrics.functional.coverage import average_set_size, covered, set_coverage, set_sizes
from kglightning.metrics.functional.distributed import unique_by_key
from kglightning.metrics.functional.qa import (
    ALL_KEYS,
    ROG_KEYS,
    STRICT_KEYS,
    answer_correctness,
    answer_score_sums,
    answer_scores,
    extract_topk_prediction,
    gold_keys,
    key_hallucinated,
    match,
    normalize,
    prepare_prediction,
    rog_answer_metrics,
    rog_answer_scores,
    strict_answer_scores,
)
from kglightning.metrics.functional.selection import grouped_selection_metrics, selection_metrics
from kglightning.metrics.functional.squad import normalize_squad, squad_exact_match, squad_f1

__all__ = [
    "normalize_squad",
    "squad_exact_match",
    "squad_f1",
    "ALL_KEYS",
    "ROG_KEYS",
    "STRICT_KEYS",
    "answer_correctness",
    "answer_score_sums",
    "answer_scores",
    "gold_keys",
    "key_hallucinated",
    "average_set_size",
    "brier_score",
    "calibration_bin_sums",
    "calibration_error_from_bin_sums",
    "covered",
    "expected_calibration_error",
    "grouped_selection_metrics",
    "extract_topk_prediction",
    "match",
    "maximum_calibration_error",
    "normalize",
    "prepare_prediction",
    "reliability_bins",
    "rog_answer_metrics",
    "rog_answer_scores",
    "selection_metrics",
    "set_coverage",
    "set_sizes",
    "strict_answer_scores",
    "target_calibration_error",
    "unique_by_key",
]
