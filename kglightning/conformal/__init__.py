"""Conformal prediction for KGQA: exact split-conformal thresholds, LTT p-values, FWER control (UAG).

The math lives in :mod:`kglightning.conformal.functional`; its public names are re-exported here (``__all__`` is
the same list).
"""

from kglightning.conformal import functional as _functional
from kglightning.conformal.functional import *  # noqa: F403  (the names of ``_functional.__all__``)

__all__ = list(_functional.__all__)
