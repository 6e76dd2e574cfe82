"""KG-Guard as a service: ``kglightning serve`` (:mod:`kglightning.cli.serve`) puts a trained detector behind
``POST /v1/guard`` (and, with a calibration, ``POST /v1/guard/batch``) with LitServe.

- :mod:`~kglightning.serve.schema`: the typed requests and responses (pydantic; the OpenAPI page at ``/docs``).
- :mod:`~kglightning.serve.guard`: :class:`~kglightning.serve.guard.GuardScorer`, the detector as a function of
  requests (what ``predict`` computes for the same records).
- :mod:`~kglightning.serve.kg`: :class:`~kglightning.serve.kg.ServedKG`, the subgraph of a request sent without one,
  cut from the server's KG as ``build-subgraphs`` cuts it.
- :mod:`~kglightning.serve.selection`: :class:`~kglightning.serve.selection.ServedSelection`, the calibrated rules
  that decide which answers are kept, request by request or over a batch.
- :mod:`~kglightning.serve.api`: :class:`~kglightning.serve.api.GuardAPI`,
  :class:`~kglightning.serve.api.GuardBatchAPI` and :func:`~kglightning.serve.api.guard_server`.
"""

from kglightning.serve.api import Deadline, GuardAPI, GuardBatchAPI, guard_server
from kglightning.serve.guard import GuardScorer, verdicts
from kglightning.serve.kg import ServedKG, load_served_kg
from kglightning.serve.schema import (
    LIMITS,
    AnswerVerdict,
    GuardBatchRequest,
    GuardBatchResponse,
    GuardRequest,
    GuardResponse,
    Limits,
    NotScored,
)
from kglightning.serve.selection import PROMISES, ServedSelection

__all__ = [
    "LIMITS",
    "PROMISES",
    "AnswerVerdict",
    "Deadline",
    "GuardAPI",
    "GuardBatchAPI",
    "GuardBatchRequest",
    "GuardBatchResponse",
    "GuardRequest",
    "GuardResponse",
    "GuardScorer",
    "Limits",
    "NotScored",
    "ServedKG",
    "ServedSelection",
    "guard_server",
    "load_served_kg",
    "verdicts",
]
