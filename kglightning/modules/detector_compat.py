"""What keeps older detector checkpoints and user-written components working as the detector grows.

* :func:`upgrade_state_dict`: a checkpoint saved by an older version loads, deciding as that version did (no
  ungrounded scorer, no offset, one threshold, one majority, a scorer that did not read the answer features).
* :func:`build_ungrounded_scorer`: an ungrounded-answer scorer written before the answer features existed still builds.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from kglightning.nn import UngroundedAnswerScorer

__all__ = ["build_ungrounded_scorer", "upgrade_state_dict"]

FIRST_LAYER = "ungrounded.mlp.0.weight"


def upgrade_state_dict(state_dict: Any, own: dict[str, Tensor], answer_features: int) -> Any:
    """``state_dict`` (of a checkpoint) completed with what older versions did not save, from ``own`` (the module's
    own state): the ungrounded scorer's weights (fresh, with a warning), a zero ``ungrounded_offset``, an
    ``ungrounded_threshold`` equal to ``threshold`` and a ``majority_all`` equal to ``majority``; and a first
    ungrounded layer that predates the ``answer_features`` widened with zero columns (so its scores are the
    checkpoint's, with a warning). A state dict of something else (no ``net.*`` weights) is returned as it is.

    Example:
        >>> own = {"net.w": torch.ones(1), "threshold": torch.tensor(0.5), "ungrounded_threshold": torch.tensor(0.5),
        ...        "majority": torch.tensor(1.0), "majority_all": torch.tensor(1.0), "ungrounded_offset": torch.tensor(2.0)}
        >>> old = {"net.w": torch.ones(1), "threshold": torch.tensor(0.3), "majority": torch.tensor(0.0)}
        >>> new = upgrade_state_dict(old, own, 0)
        >>> float(new["ungrounded_threshold"]), float(new["majority_all"]), float(new["ungrounded_offset"])
        (0.30000001192092896, 0.0, 0.0)
    """
    old, new = state_dict.get(FIRST_LAYER), own.get(FIRST_LAYER)
    if answer_features and old is not None and new is not None and old.shape[1] + answer_features == new.shape[1]:
        rank_zero_warn(
            f"this checkpoint's ungrounded-answer scorer predates its {answer_features} answer features: they enter "
            "with zero weights, so its scores are the checkpoint's; retrain to use them"
        )
        state_dict = {**state_dict, FIRST_LAYER: torch.cat([old, old.new_zeros(old.shape[0], answer_features)], dim=1)}
    if "threshold" not in state_dict or not any(k.startswith("net.") for k in state_dict):
        return state_dict  # a part of a state dict (strict=False): what it leaves out stays as it is
    if not any(k.startswith("ungrounded.") for k in state_dict):
        rank_zero_warn(
            "this checkpoint has no weights for the ungrounded-answer scorer (saved before it existed): answers "
            "that name no graph node get an untrained score; retrain, or set data.init_args.ungrounded: drop"
        )
        state_dict = {**state_dict, **{k: v for k, v in own.items() if k.startswith("ungrounded.")}}
    # saved before these existed: no shift, one threshold for every answer, one majority, as then
    older = {"ungrounded_offset": torch.zeros_like(own["ungrounded_offset"])}
    older["ungrounded_threshold"] = state_dict["threshold"]
    older["majority_all"] = state_dict.get("majority", own["majority"])
    return {**{k: v for k, v in older.items() if k not in state_dict}, **state_dict}


def build_ungrounded_scorer(
    factory: Callable[..., UngroundedAnswerScorer], text_dim: int, answer_features: int
) -> UngroundedAnswerScorer:
    """``factory(text_dim, answer_features=...)``, or ``factory(text_dim)`` for a scorer that takes no answer
    features (written before they existed), which then reads its text inputs alone, with a warning. The detector's
    ``answer_features`` replaces one in the scorer's config.

    Example:
        >>> build_ungrounded_scorer(UngroundedAnswerScorer, 4, 2).answer_features
        2
    """
    if not answer_features:
        return factory(text_dim)
    # the detector's number always wins: jsonargparse's partial of a class_path carries every init argument, the
    # defaults included, so an answer_features in it cannot be told from one a user wrote
    target = _class_of(factory)
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):  # a builtin or an object without a signature: try the keyword
        params = {"answer_features": None}
    takes = "answer_features" in params or any(
        getattr(p, "kind", None) is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )
    if takes:
        return factory(text_dim, answer_features=answer_features)
    rank_zero_warn(
        f"{getattr(target, '__name__', target)!s} takes no answer_features: the ungrounded answers are scored "
        f"without the {answer_features} answer features the graph model reads"
    )
    return factory(text_dim)


def _class_of(factory: Callable[..., Any]) -> Any:
    """The class a factory builds: the factory itself, a partial's ``func``, or, for the partial jsonargparse makes
    of a ``class_path`` (``partial(instantiator, ..., cls, **init_args)``), the class among its arguments."""
    if isinstance(factory, type):
        return factory
    classes = [a for a in getattr(factory, "args", ()) if isinstance(a, type)]
    return classes[-1] if classes else getattr(factory, "func", factory)
