"""Input validation shared by the conformal functional code (private)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def as_float_tensor(x: Tensor | Sequence | float, name: str, dtype: torch.dtype | None = None) -> Tensor:
    """Convert ``x`` to a floating tensor (float64 unless it already is floating or ``dtype`` is given)."""
    t = x if isinstance(x, Tensor) else torch.as_tensor(x, device="cpu")  # a tensor keeps its device
    if dtype is not None:
        t = t.to(dtype)
    elif not torch.is_floating_point(t):
        t = t.to(torch.float64)
    if torch.isnan(t).any():
        raise ValueError(f"{name} contains NaN")
    return t


def check_level(value: float | Tensor, name: str) -> None:
    """Raise unless every entry of ``value`` lies in the open interval (0, 1)."""
    v = value.double() if isinstance(value, Tensor) else torch.tensor(value, dtype=torch.float64, device="cpu")
    if torch.isnan(v).any() or not bool(((v > 0) & (v < 1)).all()):
        raise ValueError(f"{name} must lie in the open interval (0, 1), got {value}")
