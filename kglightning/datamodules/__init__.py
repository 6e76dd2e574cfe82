"""LightningDataModules, one per file, all extending the record-reading :class:`KGQADataModule`.

They sit above ``data``, ``evidence``, ``llm`` and ``nn`` (they turn records into a method's items with those), and
below the modules and pipelines that consume them.
"""

from kglightning.datamodules.base import KGQADataModule
from kglightning.datamodules.detection import DetectionDataModule
from kglightning.datamodules.grpo import ProxyGRPODataModule
from kglightning.datamodules.relation_pairs import RelationPairDataModule
from kglightning.datamodules.sft import ProxySFTDataModule
from kglightning.datamodules.sgic import SGICDataModule
from kglightning.datamodules.sgic_finetune import SGICFinetuneDataModule

__all__ = [
    "DetectionDataModule",
    "KGQADataModule",
    "ProxyGRPODataModule",
    "ProxySFTDataModule",
    "RelationPairDataModule",
    "SGICDataModule",
    "SGICFinetuneDataModule",
]
