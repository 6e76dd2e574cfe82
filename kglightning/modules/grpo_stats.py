"""GRPO's logged statistics as global means over every process, with one ``all_reduce`` per step.

Each statistic is a (sum, count) pair; the pairs of a step are stacked in one float64 tensor on the module's device
(NCCL refuses CPU tensors), summed over the processes, and divided. Every process then holds the same global values,
so they are logged without ``sync_dist``, weighted by their global count: Lightning's epoch mean of a statistic is
then the exact mean over every item of the epoch, as TRL computes its metrics from gathered values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["GlobalStat", "StepStats"]


@dataclass(frozen=True)
class GlobalStat:
    """A statistic summed over every process: ``total / count`` is its mean."""

    total: float
    count: float

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")


@dataclass
class StepStats:
    """(sum, count) pairs of one step, added in the same order on every process.

    Example:
        >>> stats = StepStats(torch.device("cpu"))
        >>> stats.add("reward", torch.tensor([1.0, 3.0]).sum(), 2)
        >>> stats.reduce()["reward"].mean
        2.0
    """

    device: torch.device
    names: list[str] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)

    def add(self, name: str, total: Tensor | float, count: Tensor | float) -> None:
        """Add a statistic; every process must add the same names in the same order."""
        if name in self.names:
            raise ValueError(f"statistic {name!r} added twice")
        pair = [torch.as_tensor(v, device=self.device).detach().double().reshape(()) for v in (total, count)]
        self.names.append(name)
        self.values.append(torch.stack(pair))

    def reduce(self) -> dict[str, GlobalStat]:
        """Sum every pair over the processes of the default process group (if one is initialised)."""
        if not self.names:
            return {}
        table = torch.stack(self.values)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(table)
        rows = table.tolist()
        return {name: GlobalStat(total, count) for name, (total, count) in zip(self.names, rows)}
