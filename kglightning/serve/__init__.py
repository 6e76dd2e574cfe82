"""KG-Guard as a service: ``kglightning serve`` (:mod:`kglightning.cli.serve`) puts a trained detector behind
``POST /v1/guard`` with LitServe.

- :mod:`~kglightning.serve.schema`: the typed request and response (pydantic; the OpenAPI page at ``/docs``).
- :mod:`~kglightning.serve.guard`: :class:`~kglightning.serve.guard.GuardScorer`, the detector as a function of
  requests (what ``predict`` computes for the same records).
- :mod:`~kglightning.serve.api`: :class:`~kglightning.serve.api.GuardAPI` and :func:`~kglightning.serve.api.guard_server`.
"""

from kglightning.serve.api import GuardAPI, guard_server
from kglightning.serve.guard import GuardScorer, verdicts
from kglightning.serve.schema import LIMITS, AnswerVerdict, GuardRequest, GuardResponse, Limits, NotScored
from kglightning.serve.selection import ServedSelection

__all__ = [
    "LIMITS",
    "AnswerVerdict",
    "GuardAPI",
    "GuardRequest",
    "GuardResponse",
    "GuardScorer",
    "Limits",
    "NotScored",
    "ServedSelection",
    "guard_server",
    "verdicts",
]
