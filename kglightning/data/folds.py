"""K-fold cross-validation by question, for data that comes with a single published split.

:class:`KFold` pools the questions of some published splits and cuts them into ``k`` folds: fold ``fold`` becomes
the test split, a seeded fraction of the other questions the validation split, and the rest the training split. A
data module that is given one (:class:`~kglightning.datamodules.KGQADataModule`'s ``folds``) serves these three
instead of the published ones, so every method can run cross-validation without a split file of its own.

The order of the questions is a seeded hash of each id, not a shuffle of the files' order: the assignment depends
only on the set of ids and the seed, so reordering or rewriting a file the same way assigns every question to the
same split again.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["FoldSplit", "KFold"]

FoldSplit = Literal["train", "validation", "test"]
_SPLITS: tuple[FoldSplit, ...] = ("train", "validation", "test")


def _rank(seed: int, salt: str, qid: str) -> bytes:
    """A seeded pseudo-random sort key of one question id."""
    return hashlib.blake2b(f"{seed}\0{salt}\0{qid}".encode(), digest_size=8).digest()


@dataclass
class KFold:
    """Which fold of a K-fold cross-validation by question a data module serves; a nested group in configs.

    The questions of the ``pool`` splits (distinct ids) are ordered by a hash seeded with ``seed`` and cut into
    ``k`` folds whose sizes differ by at most one. Fold ``fold`` is the ``test`` split; of the other questions, a
    seeded ``validation_fraction`` (at least one) is the ``validation`` split and the rest the ``train`` split. Every
    pooled question is in exactly one of the three, and the ``k`` test splits of one seed cover the pool once.

    Args:
        k: the number of folds (at least 2).
        fold: which fold is the test split, ``0 <= fold < k``.
        seed: the seed of the fold assignment and of the validation draw (not the training seed).
        validation_fraction: the share of the non-test questions that validates, in ``(0, 1)``.
        pool: the published splits pooled before folding, e.g. ``[train, validation]`` to choose a recipe on the
            training part only and keep the published test split untouched. Splits outside the pool are not read.

    Example:
        >>> folds = KFold(k=3, fold=1, seed=0, validation_fraction=0.25, pool=["train", "validation"])
        >>> parts = folds.assign({"train": [f"q{i}" for i in range(9)], "validation": ["q9", "q10", "q11"]})
        >>> {split: len(ids) for split, ids in parts.items()}
        {'train': 6, 'validation': 2, 'test': 4}
        >>> sorted(parts["train"] + parts["validation"] + parts["test"]) == sorted(f"q{i}" for i in range(12))
        True
    """

    k: int = 5
    fold: int = 0
    seed: int = 0
    validation_fraction: float = 0.2
    pool: list[FoldSplit] = field(default_factory=lambda: list(_SPLITS))

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 2:
            raise ValueError(f"folds.k must be an integer of at least 2, got {self.k!r}")
        if isinstance(self.fold, bool) or not isinstance(self.fold, int) or not 0 <= self.fold < self.k:
            raise ValueError(f"folds.fold must be an integer in [0, {self.k - 1}] (folds are numbered from 0), "
                             f"got {self.fold!r}")  # fmt: skip
        if not isinstance(self.validation_fraction, (int, float)) or not 0 < self.validation_fraction < 1:
            raise ValueError(f"folds.validation_fraction must lie strictly between 0 and 1, got "
                             f"{self.validation_fraction!r}")  # fmt: skip
        pool = [self.pool] if isinstance(self.pool, str) else list(self.pool)
        unknown = [s for s in pool if s not in _SPLITS]
        if unknown or not pool:
            raise ValueError(f"folds.pool must name some of {list(_SPLITS)}, got {self.pool!r}")
        if len(set(pool)) != len(pool):
            raise ValueError(f"folds.pool names a split twice: {self.pool!r}")
        self.pool = pool
        self.validation_fraction = float(self.validation_fraction)

    @property
    def cache_key(self) -> str:
        """Every setting that decides which questions land in which split (for the keys of caches).

        Example:
            >>> KFold(k=5, fold=2, pool=["train", "validation"]).cache_key
            'kfold:k5:fold2:seed0:val0.2:train+validation'
        """
        pool = "+".join(self.pool)
        return f"kfold:k{self.k}:fold{self.fold}:seed{self.seed}:val{self.validation_fraction!r}:{pool}"

    def assign(
        self, ids_by_split: Mapping[str, Sequence[str]], sources: Mapping[str, str] | None = None
    ) -> dict[FoldSplit, list[str]]:
        """The ids of the folded train, validation and test splits.

        Args:
            ids_by_split: the question ids of each pooled split (every split of :attr:`pool`, nothing else).
            sources: where each split was read from, named when an id is in two of them.

        Returns:
            ``{"train": ids, "validation": ids, "test": ids}``, each in the pooled order (the pool's splits in
            turn, each in its own order).

        Raises:
            ValueError: a pooled split is missing, an id is in two pooled splits, there are fewer questions than
                folds, or too few left beside the test fold for both a training and a validation question.
        """
        missing = [s for s in self.pool if s not in ids_by_split]
        if missing:
            raise ValueError(f"the pool names {missing}, which were not given")
        owner: dict[str, str] = {}
        for split in self.pool:
            for qid in ids_by_split[split]:
                first = owner.setdefault(qid, split)
                if first != split:
                    where = sources or {}
                    raise ValueError(
                        f"question id {qid!r} is in two pooled splits: {first} ({where.get(first, first)}) and "
                        f"{split} ({where.get(split, split)}); folding needs each question once"
                    )
        roles = self._roles(owner)
        out: dict[FoldSplit, list[str]] = {s: [] for s in _SPLITS}
        for qid in owner:  # the pooled order
            out[roles[qid]].append(qid)
        return out

    def _roles(self, ids: Iterable[str]) -> dict[str, FoldSplit]:
        order = sorted(ids, key=lambda qid: (_rank(self.seed, "fold", qid), qid))
        n = len(order)
        if n < self.k:
            raise ValueError(f"{n} pooled questions cannot make {self.k} folds (folds.k is larger than the pool)")
        size, extra = divmod(n, self.k)  # the first `extra` folds hold one question more
        start = self.fold * size + min(self.fold, extra)
        stop = start + size + (1 if self.fold < extra else 0)
        rest = order[:start] + order[stop:]
        n_val = max(1, math.floor(self.validation_fraction * len(rest) + 0.5))
        if n_val >= len(rest):
            raise ValueError(
                f"fold {self.fold} of {self.k} leaves {len(rest)} question(s) beside its test fold: too few for a "
                f"training and a validation split at validation_fraction {self.validation_fraction}"
            )
        salt = f"validation:{self.k}:{self.fold}"
        validation = set(sorted(rest, key=lambda qid: (_rank(self.seed, salt, qid), qid))[:n_val])
        roles: dict[str, FoldSplit] = {qid: "test" for qid in order[start:stop]}
        roles.update({qid: "validation" if qid in validation else "train" for qid in rest})
        return roles

    def describe(self, sizes: Mapping[str, int]) -> str:
        """One line naming the fold and the sizes of its three splits.

        Example:
            >>> KFold(k=5, fold=2).describe({"train": 80, "validation": 20, "test": 25})
            'fold 2/5 (seed 0, pool train+validation+test): 80 train, 20 validation, 25 test questions'
        """
        counts = ", ".join(f"{sizes.get(s, 0)} {s}" for s in _SPLITS)
        return f"fold {self.fold}/{self.k} (seed {self.seed}, pool {'+'.join(self.pool)}): {counts} questions"
