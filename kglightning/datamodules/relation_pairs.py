"""LightningDataModule of UAG's relation-scorer pairs (:mod:`kglightning.data.relation_pairs`)."""

from __future__ import annotations

import logging
import random
from typing import Any

from tqdm.auto import tqdm

from kglightning.data.records import KGQARecord
from kglightning.data.relation_pairs import PROGRESS_MIN_RECORDS, RelationPair, collate_pairs, mine_relation_pairs
from kglightning.datamodules.base import KGQADataModule, Split

log = logging.getLogger(__name__)

#: validation and test are capped at 200 questions unless ``max_records`` says otherwise
DEFAULT_LIMITS: dict[Split, int] = {"validation": 200, "test": 200}


class RelationPairDataModule(KGQADataModule):
    """Relation-scorer pairs mined from a RoG-format dataset, or from the embedded benchmark.

    Train pairs come from the train split (reshuffled every epoch by a seeded generator); validation pairs from the
    validation split and test pairs from the test split, in order. Each record's negatives are sampled with a
    ``random.Random`` seeded by ``(seed, record id)``, so the pairs do not depend on ``max_records`` or on order.

    Args:
        max_hops: longest gold relation path searched.
        negatives: negatives per positive pair.
        path_negatives: whole-path (Eq. 5) negatives per gold path; ``0`` mines step pairs only (UAG's recipe).
        seed: seed of negative sampling and of the train shuffle.
        batch_size: pairs per batch.
        max_records: records read per split (default: all training questions, 200 validation and 200 test ones).
        **kwargs: the other record-reading arguments of :class:`~kglightning.datamodules.KGQADataModule`.
    """

    def __init__(
        self,
        max_hops: int = 3,
        negatives: int = 3,
        path_negatives: int = 0,
        seed: int = 0,
        batch_size: int = 32,
        max_records: int | dict[Split, int] | None = DEFAULT_LIMITS,
        **kwargs: Any,
    ) -> None:
        super().__init__(batch_size=batch_size, max_records=max_records, **kwargs)
        self.max_hops = max_hops
        self.negatives = negatives
        self.path_negatives = path_negatives
        self.seed = seed

    def build_split(self, split: str) -> list[RelationPair]:
        """The pairs of one split, mined on first use."""
        return self._mine(self.split_records(split), split)

    def split_pairs(self, split: Split) -> list[RelationPair]:
        """The pairs of one split (built once)."""
        if split not in self.datasets:
            self.datasets[split] = self.build_split(split)
        return list(self.datasets[split])

    def _mine(self, records: list[KGQARecord], split: str) -> list[RelationPair]:
        pairs: list[RelationPair] = []
        no_path = 0
        bar = tqdm(records, desc=f"mining {split} relation pairs", disable=len(records) < PROGRESS_MIN_RECORDS)
        for record in bar:
            rng = random.Random(f"{self.seed}:{record.id}")
            mined = mine_relation_pairs(
                record, max_hops=self.max_hops, negatives=self.negatives, rng=rng, path_negatives=self.path_negatives
            )
            no_path += not any(p.label > 0 for p in mined)
            pairs += mined
        positives = sum(p.label > 0 for p in pairs)
        log.info(
            "%s: mined %d relation pairs (%d positive, %d negative) from %d questions; %d questions have no gold "
            "path within %d hops",
            split,
            len(pairs),
            positives,
            len(pairs) - positives,
            len(records),
            no_path,
            self.max_hops,
        )
        return pairs

    def collate(self, items: list[RelationPair]) -> dict:
        return collate_pairs(items)

    def shuffle_seed(self) -> int:
        return self.seed
