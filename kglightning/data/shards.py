"""Shards of a list of questions, for preparation spread over machines (``--shard i/N``).

A shard is a contiguous slice, so the shards' outputs, concatenated in shard order, are the output of one run over
the whole list.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Shard"]

T = TypeVar("T")
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Part ``index`` (from 0) of ``count`` equal contiguous parts of a list.

    Example:
        >>> s = Shard.parse("1/3")
        >>> s.take(list(range(10))), s.suffix, Shard.parse("0/1").take("abc")
        ([3, 4, 5], 'shard-00001-of-00003', 'abc')
        >>> [Shard(i, 3).bounds(10) for i in range(3)]
        [(0, 3), (3, 6), (6, 10)]
    """

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 99999 or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index}/{self.count}: need 0 <= i < N, 1 <= N <= 99999 (e.g. 0/4 ... 3/4)")

    @classmethod
    def parse(cls, spec: str) -> Shard:
        """``"i/N"`` (``i`` from 0 to ``N - 1``)."""
        m = _SPEC.match(spec)
        if m is None:
            raise ValueError(f"shard {spec!r}: expected i/N, e.g. 0/4 for the first of four")
        return cls(int(m.group(1)), int(m.group(2)))

    def bounds(self, n: int) -> tuple[int, int]:
        """``[lo, hi)`` of this shard in a list of ``n``."""
        return n * self.index // self.count, n * (self.index + 1) // self.count

    def take(self, items: Sequence[T]) -> Sequence[T]:
        """This shard's slice of ``items``."""
        lo, hi = self.bounds(len(items))
        return items[lo:hi]

    @property
    def suffix(self) -> str:
        """The file-name part naming this shard (sorts in shard order)."""
        return f"shard-{self.index:05d}-of-{self.count:05d}"
