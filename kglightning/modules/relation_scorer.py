"""UAG's relation scorer: an SBERT encoder fine-tuned with the CosineSimilarityLoss objective (UAG App. D).

The model scores how well a KG relation continues a partial reasoning path: the cosine similarity between the
embeddings of ``Q || r_0 .. r_{j-1}`` and of ``r_j`` (UAG Eq. 4). Training pairs come from
:class:`~kglightning.datamodules.RelationPairDataModule`; the loss is sentence-transformers'
``CosineSimilarityLoss``: the mean squared error between ``cos(u, v)`` and the 0/1 label.

The :class:`~sentence_transformers.SentenceTransformer` is a submodule, so its weights are in every checkpoint. At the
end of ``fit`` the fine-tuned encoder is written as a sentence-transformers folder (:meth:`RelationScorer.export`)
that :class:`~kglightning.data.encoder.SentenceEncoder` (and so the UAG traversal) loads with
``SentenceEncoder(model=export_dir)``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor
from torchmetrics.classification import BinaryAUROC

from kglightning.data.encoder import BUNDLED_MINILM, bundled_minilm_path
from kglightning.modules.export import ExportChoice, exported_weights

__all__ = ["RelationScorer", "cosine_similarity_loss", "freeze_unused_parameters"]

log = logging.getLogger(__name__)

Batch = dict[str, Any]


def cosine_similarity_loss(scores: Tensor, labels: Tensor) -> Tensor:
    """sentence-transformers' ``CosineSimilarityLoss``: MSE between cosine scores and labels.

    Example:
        >>> cosine_similarity_loss(torch.tensor([1.0, 0.5]), torch.tensor([1.0, 0.0]))
        tensor(0.1250)
    """
    return F.mse_loss(scores, labels.float().view(-1))


def _load_sentence_transformer(model: str, max_seq_length: int | None):
    from sentence_transformers import SentenceTransformer

    path = bundled_minilm_path() if model == BUNDLED_MINILM else model
    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"sentence-transformers model folder not found: {path!r} (model={model!r}); pass a local folder saved by "
            f"SentenceTransformer.save or {BUNDLED_MINILM!r}"
        )
    encoder = SentenceTransformer(path, device="cpu", local_files_only=True)
    if max_seq_length is not None:
        encoder.max_seq_length = max_seq_length
    return encoder


def freeze_unused_parameters(encoder: Any) -> list[str]:
    """Freeze the encoder's parameters that its sentence embedding does not use, and return their names.

    BERT checkpoints carry a pooler layer that sentence-transformers' mean pooling never calls. DDP requires every
    trainable parameter to receive a gradient ("parameters that were not used in producing the loss"), so a fine-tune
    on several GPUs would stop at the first step. A probe forward in eval mode (no randomness) finds them.
    """
    was_training = encoder.training
    encoder.eval()
    try:
        named = [(n, p) for n, p in encoder.named_parameters() if p.requires_grad]
        with torch.enable_grad():
            emb = encoder(encoder.preprocess(["a probe", "of the encoder"]))["sentence_embedding"]
            grads = torch.autograd.grad(emb.sum(), [p for _, p in named], allow_unused=True)
    finally:
        encoder.train(was_training)
    unused = [n for (n, p), g in zip(named, grads) if g is None]
    for name, param in named:
        if name in unused:
            param.requires_grad_(False)
    return unused


class RelationScorer(L.LightningModule):
    """A sentence-transformers encoder fine-tuned to score ``(Q || r_0..r_{j-1}, r_j)`` pairs.

    Batches are ``{"query": list[str], "relation": list[str], "label": FloatTensor}``. ``training_step`` logs
    ``train/loss``; validation and test log ``val/loss`` / ``test/loss`` and ``val/pair_auc`` / ``test/pair_auc``,
    the ROC AUC of the cosine scores against the labels (it fails, logging 0 with a warning, when a split has a
    single class). ``predict_step`` returns the cosine scores of a batch.

    Args:
        model: a local sentence-transformers folder, or ``"bundled:all-MiniLM-L6-v2"`` (UAG's backbone, bundled).
        optimizer: optimizer factory over two parameter groups, the second (biases and LayerNorm weights) with
            ``weight_decay=0``; default AdamW(lr=2e-5, weight_decay=0.01), UAG's setting.
        warmup_ratio: share of the total steps with linear warmup; then linear decay to 0 (UAG's WarmupLinear).
        max_seq_length: truncate texts to this many tokens (``None``: the model's own limit).
        export_dir: where :meth:`on_fit_end` writes the fine-tuned encoder (``None``: not written).
        export: which weights it writes: ``"best"`` (the best checkpoint's, by the checkpoint callback's monitor,
            ``val/loss`` in ``configs/relation_scorer.yaml``) or ``"last"`` (the last step's).

    Parameters the sentence embedding does not use (BERT's pooler) are frozen at construction (:attr:`frozen` lists
    them), so that DDP, which needs a gradient for every trainable parameter, runs.

    Raises:
        FileNotFoundError: the model folder does not exist.
    """

    def __init__(
        self,
        model: str = BUNDLED_MINILM,
        optimizer: OptimizerCallable | None = None,
        warmup_ratio: float = 0.1,
        max_seq_length: int | None = 64,
        export_dir: str | None = "outputs/relation_scorer/encoder",
        export: ExportChoice = "best",
    ) -> None:
        super().__init__()
        if export not in ("best", "last"):
            raise ValueError(f"export must be 'best' or 'last', got {export!r}")
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        self.encoder = _load_sentence_transformer(model, max_seq_length)
        self.encoder.train()  # SentenceTransformer loads in eval mode; Lightning keeps the modes it finds (dropout)
        self.frozen = freeze_unused_parameters(self.encoder)
        if self.frozen:
            log.info(
                "RelationScorer: froze %d parameters the embedding does not use: %s", len(self.frozen), self.frozen
            )
        self.val_auc = BinaryAUROC()
        self.test_auc = BinaryAUROC()

    def embed(self, texts: Sequence[str]) -> Tensor:
        """Sentence embeddings of ``texts``, shape ``(len(texts), dim)``, with gradients when enabled.

        A text repeated in ``texts`` (a query with its negatives) is encoded once.
        """
        unique = list(dict.fromkeys(texts))
        features = self.encoder.preprocess(unique)
        features = {k: v.to(self.device) if isinstance(v, Tensor) else v for k, v in features.items()}
        emb = self.encoder(features)["sentence_embedding"]
        if len(unique) == len(texts):
            return emb
        row = {t: i for i, t in enumerate(unique)}
        return emb[torch.tensor([row[t] for t in texts], device=emb.device)]

    def forward(self, query: Sequence[str], relation: Sequence[str]) -> Tensor:
        """Cosine similarities of ``query[i]`` and ``relation[i]``, shape ``(n,)``."""
        return torch.cosine_similarity(self.embed(query), self.embed(relation), dim=-1)

    def _step(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        scores = self(batch["query"], batch["relation"])
        labels = batch["label"].to(scores.device)
        return cosine_similarity_loss(scores, labels), scores, labels

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss, _, labels = self._step(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=labels.numel())
        return loss

    def _eval_step(self, batch: Batch, stage: str, auc: BinaryAUROC) -> Tensor:
        loss, scores, labels = self._step(batch)
        auc.update(scores.detach(), labels.long())
        self.log(f"{stage}/loss", loss, prog_bar=True, batch_size=labels.numel(), sync_dist=True)
        self.log(f"{stage}/pair_auc", auc, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> Tensor:
        return self._eval_step(batch, "val", self.val_auc)

    def test_step(self, batch: Batch, batch_idx: int) -> Tensor:
        return self._eval_step(batch, "test", self.test_auc)

    def predict_step(self, batch: Batch, batch_idx: int) -> dict[str, Any]:
        return {
            "query": batch["query"],
            "relation": batch["relation"],
            "score": self(batch["query"], batch["relation"]),
        }

    def configure_optimizers(self) -> Any:
        from transformers import get_linear_schedule_with_warmup

        decay, no_decay = [], []
        for name, param in self.named_parameters():
            if param.requires_grad:
                (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(param)
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        if self.optimizer is None:
            optimizer = torch.optim.AdamW(groups, lr=2e-5, weight_decay=0.01)
        else:
            optimizer = self.optimizer(groups)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = math.ceil(self.hparams.warmup_ratio * total)
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def export(self, path: str | Path) -> str:
        """Write the encoder as a sentence-transformers folder that ``SentenceEncoder(model=path)`` loads."""
        path = str(path)
        self.encoder.save(path, create_model_card=False)
        return path

    def on_fit_end(self) -> None:
        if self.hparams.export_dir and self.trainer.is_global_zero:
            with exported_weights(self, self.hparams.get("export", "best")) as source:
                path = self.export(self.hparams.export_dir)
            print(f"RelationScorer: fine-tuned encoder ({source}) saved to {Path(path).resolve()}")
