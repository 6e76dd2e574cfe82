"""KG-Guard hallucination detector as a LightningModule (KG-Guard §3.2, App. A)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.nn import functional as F
from torchmetrics import Metric
from torchmetrics.functional.classification import binary_precision_recall_curve
from torchmetrics.utilities import dim_zero_cat

from kglightning.conformal.scorer import ConformalScores
from kglightning.metrics.classification import detection_metrics, detection_scores, set_threshold
from kglightning.metrics.functional import unique_by_key
from kglightning.nn import GraphEncoder, GraphTransformerEncoder, KGGuard


class ScoreBuffer(Metric):
    """Keeps every (probability, label, item key) triple of an epoch; DDP gathers them with ``cat``.

    ``compute`` keeps one entry per item key, in key order (:func:`~kglightning.metrics.functional.unique_by_key`):
    the repeats a distributed sampler pads the last shard with are dropped, so a threshold tuned on the result is
    the same on one process or many. Without keys every entry is kept.

    Example:
        >>> buf = ScoreBuffer()
        >>> buf.update(torch.tensor([0.9, 0.2]), torch.tensor([1, 0]), keys=torch.tensor([5, 2]))
        >>> buf.update(torch.tensor([0.9]), torch.tensor([1]), keys=torch.tensor([5]))  # a padded repeat
        >>> probs, target = buf.compute()
        >>> probs.dtype, [round(p, 6) for p in probs.tolist()], target.tolist()
        (torch.float32, [0.2, 0.9], [0, 1])
    """

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("probs", default=[], dist_reduce_fx="cat")
        self.add_state("target", default=[], dist_reduce_fx="cat")
        self.add_state("keys", default=[], dist_reduce_fx="cat")

    def update(self, probs: Tensor, target: Tensor, keys: Tensor | None = None) -> None:
        self.probs.append(probs.detach().float())
        self.target.append(target.detach().long())
        if keys is not None:
            self.keys.append(keys.detach().long())

    def compute(self) -> tuple[Tensor, Tensor]:
        probs = dim_zero_cat(self.probs)
        target = dim_zero_cat(self.target)
        keys = dim_zero_cat(self.keys) if len(self.keys) else None
        if keys is None:
            return probs, target
        if keys.numel() != probs.numel():
            raise ValueError(
                f"{keys.numel()} item keys for {probs.numel()} scores: give keys with every update or none"
            )
        keep = unique_by_key(keys)
        return probs[keep], target[keep]


def answer_keys(batch: Any) -> Tensor | None:
    """``(A,)`` a key per answer node that names it across processes: ``item_id`` of its graph (the graph's index in
    its split) times ``2**20`` plus its position among the graph's answer nodes; ``None`` without ``item_id``."""
    item = getattr(batch, "item_id", None)
    if item is None:
        return None
    owner = batch.batch[batch.answer_index]
    counts = torch.bincount(owner, minlength=int(item.numel()))
    start = counts.cumsum(0) - counts
    position = torch.arange(owner.numel(), device=owner.device) - start[owner]
    return item.to(owner.device).long()[owner] * 2**20 + position


def best_f1_threshold(probs: Tensor, target: Tensor) -> tuple[float, float]:
    """The threshold ``t`` (predict hallucinated when ``p >= t``) with the highest F1, and that F1."""
    precision, recall, thresholds = binary_precision_recall_curve(probs, target)
    f1 = 2 * precision[:-1] * recall[:-1] / (precision[:-1] + recall[:-1]).clamp_min(1e-12)
    best = int(torch.argmax(f1))
    return float(thresholds[best]), float(f1[best])


def bootstrap_f1_threshold(probs: Tensor, target: Tensor, resamples: int, seed: int = 0) -> float:
    """The median of the best-F1 thresholds of ``resamples`` bootstrap resamples of ``(probs, target)``.

    On a small validation set the best-F1 threshold jumps with every answer node that moves; the median over seeded
    bootstrap resamples (drawn with replacement, same size; resamples without a positive are skipped) moves much
    less. Falls back to :func:`best_f1_threshold` when no resample has a positive.

    Example:
        >>> probs, target = torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])
        >>> bootstrap_f1_threshold(probs, target, 50) == bootstrap_f1_threshold(probs, target, 50)  # seeded
        True
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    gen = torch.Generator().manual_seed(seed)
    probs, target = probs.detach().float().cpu(), target.detach().long().cpu()
    picks = torch.randint(len(probs), (resamples, len(probs)), generator=gen, device="cpu")
    found = [best_f1_threshold(probs[idx], target[idx])[0] for idx in picks if bool(target[idx].any())]
    if not found:
        return best_f1_threshold(probs, target)[0]
    return float(torch.tensor(found, device="cpu").median())


def detection_loss(logits: Tensor, target: Tensor, pos_weight: float | None = None, gamma: float = 0.0) -> Tensor:
    """Mean (class-weighted, focal) binary cross-entropy of answer-node logits.

    Each term is ``w_y (1 - p_t)^gamma BCE``, with ``p_t`` the probability of the true class and ``w_1 = pos_weight``,
    ``w_0 = 1``; ``gamma = 0`` and ``pos_weight = None`` give plain BCE.

    Example:
        >>> logits, y = torch.tensor([2.0, -1.0]), torch.tensor([1.0, 0.0])
        >>> bool(torch.isclose(detection_loss(logits, y), F.binary_cross_entropy_with_logits(logits, y)))
        True
        >>> round(detection_loss(torch.tensor([0.0]), torch.tensor([1.0]), pos_weight=2.0, gamma=1.0).item(), 4)
        0.6931
    """
    if pos_weight is None and gamma == 0:
        return F.binary_cross_entropy_with_logits(logits, target)  # the fused mean: the paper's loss, bit for bit
    bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    if gamma > 0:
        p_true = torch.exp(-bce)
        bce = (1 - p_true).pow(gamma) * bce
    if pos_weight is not None:
        bce = bce * torch.where(target > 0.5, pos_weight, 1.0)
    return bce.mean()


def item_uniform(seed: int, qid: str, node: str) -> float:
    """A uniform number in ``[0, 1)`` fixed by ``(seed, question id, node)``, whatever process or batch sees it."""
    digest = hashlib.sha1(f"{seed}\x1f{qid}\x1f{node}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class HallucinationDetector(L.LightningModule):
    """Flags hallucinated answer nodes: label 1 = the proposed node is not a gold answer.

    The decision threshold is tuned on validation (best F1) at the end of every validation epoch and kept in the
    ``threshold`` buffer, so it is saved in checkpoints. The majority class of validation labels is kept in the
    ``majority`` buffer; the test run reports the MostFrequent and Random baselines beside the detector
    (``test/mostfrequent/*``, ``test/random/*``).

    Reloading: through the CLI (``--ckpt_path``) the config rebuilds the encoder. In Python, pass a non-default
    encoder again, as the factory is not pickled into the checkpoint:
    ``HallucinationDetector.load_from_checkpoint(path, encoder=partial(GATEncoder, hidden_channels=256))``.

    Args:
        text_dim: text-embedding size (linked from the DataModule).
        encoder: graph encoder, built as ``encoder(in_channels, edge_dim)``; name it by ``class_path``
            (``kglightning.nn.GraphTransformerEncoder`` or ``kglightning.nn.GATEncoder``, or your own subclass of
            :class:`~kglightning.nn.GraphEncoder`).
        mark_dim: size of topic/answer mark embeddings.
        mlp_hidden: hidden size of the classifier MLP.
        dropout: MLP dropout.
        optimizer: optimizer factory; default Adam(lr=1e-3, weight_decay=1e-4) as in the paper.
        scheduler: learning-rate scheduler factory, stepped once per epoch (e.g.
            :class:`kglightning.modules.schedules.CosineAnnealingLR`, whose ``T_max`` defaults to the number of epochs
            in the CLI); ``None``: a constant rate.
        threshold: initial decision threshold.
        tune_threshold: re-tune the threshold on validation.
        threshold_resamples: ``0``: the threshold is the best-F1 one on the validation set; ``B > 0``: the median
            of the best-F1 thresholds of ``B`` bootstrap resamples of the validation answer nodes (seeded by
            ``baseline_seed``), which stays stable when the validation set is small
            (:func:`bootstrap_f1_threshold`).
        baseline_seed: seed of the Random baseline, whose score for a node is fixed by (seed, question id,
            node name), so that it is the same on one process or many.
        pos_weight: weight of the hallucinated (positive) class in the loss (``None``: 1). Below 1 when most
            answers are hallucinated, as with small LLMs; ``neg / pos`` of the training set balances the classes.
        focal_gamma: focusing parameter of the focal loss (Lin et al., 2017); ``0`` is plain binary cross-entropy.
        answer_features: extra classifier inputs per answer node, read from ``batch.answer_features`` (the CLI
            links it to the DataModule's ``num_answer_features``).
        marks, question_node, edge_text, inputs: the paper's ablations (Tables 4-5), all on by default; see
            :class:`~kglightning.nn.KGGuard`.
    """

    def __init__(
        self,
        text_dim: int = 384,
        encoder: Callable[[int, int], GraphEncoder] = GraphTransformerEncoder,
        mark_dim: int = 20,
        mlp_hidden: int = 256,
        dropout: float = 0.1,
        optimizer: OptimizerCallable | None = None,
        scheduler: LRSchedulerCallable | None = None,
        threshold: float = 0.5,
        tune_threshold: bool = True,
        threshold_resamples: int = 0,
        baseline_seed: int = 0,
        pos_weight: float | None = None,
        focal_gamma: float = 0.0,
        answer_features: int = 0,
        marks: bool = True,
        question_node: bool = True,
        edge_text: bool = True,
        inputs: Literal["graph+question", "graph", "question"] = "graph+question",
    ) -> None:
        super().__init__()
        if pos_weight is not None and pos_weight <= 0:
            raise ValueError(f"pos_weight must be > 0, got {pos_weight}")
        if threshold_resamples < 0:
            raise ValueError(f"threshold_resamples must be >= 0, got {threshold_resamples}")
        if focal_gamma < 0:
            raise ValueError(f"focal_gamma must be >= 0, got {focal_gamma}")
        self.save_hyperparameters(ignore=["encoder", "optimizer", "scheduler"])
        self.net = KGGuard(text_dim, encoder, mark_dim=mark_dim, mlp_hidden=mlp_hidden, dropout=dropout,
                           answer_features=answer_features, marks=marks, question_node=question_node,
                           edge_text=edge_text, inputs=inputs)  # fmt: skip
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.tune_threshold = tune_threshold
        self.threshold_resamples = threshold_resamples
        self.baseline_seed = baseline_seed
        self.pos_weight = pos_weight
        self.focal_gamma = focal_gamma
        self.register_buffer("threshold", torch.tensor(float(threshold)))
        self.register_buffer("majority", torch.tensor(1.0))
        self.val_scores = ScoreBuffer()
        # rebuilt at test start with the tuned threshold; the baselines' scores are 0/1 or uniform: threshold 0.5
        self.test_metrics = detection_metrics(threshold=float(threshold))
        self.mostfrequent_metrics = detection_metrics()
        self.random_metrics = detection_metrics()
        self.llm_baseline_names: list[str] = []  # the datamodule's baselines, set in setup("test")
        self.llm_baseline_metrics = torch.nn.ModuleDict()

    def forward(self, batch: Any) -> Tensor:
        """Logits ``(A,)`` for every proposed answer node of the batch.

        Edge features come per edge type (``type_text_emb``, ``type_kind``, ``edge_type``, as
        :meth:`~kglightning.datamodules.DetectionDataModule.collate` builds them) or per edge (``edge_text_emb``,
        ``edge_kind``); both give the same logits.
        """
        if getattr(batch, "edge_type", None) is not None:
            edges = (batch.type_text_emb, batch.type_kind, batch.edge_type)
        else:
            edges = (batch.edge_text_emb, batch.edge_kind, None)
        return self.net(
            batch.x_text,
            batch.topic_mask,
            batch.answer_mask,
            batch.edge_index,
            edges[0],
            edges[1],
            batch.answer_index,
            batch.question,
            edge_type=edges[2],
            answer_features=getattr(batch, "answer_features", None) if self.net.answer_features else None,
        )

    def _loss(self, batch: Any, stage: str) -> tuple[Tensor, Tensor]:
        logits = self(batch)
        loss = detection_loss(logits, batch.y, self.pos_weight, self.focal_gamma)
        train = stage == "train"
        self.log(
            f"{stage}/loss",
            loss,
            batch_size=batch.y.numel(),
            prog_bar=train,
            on_step=train,
            on_epoch=True,
            sync_dist=not train,
        )
        return loss, torch.sigmoid(logits)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch, "train")[0]

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        _, probs = self._loss(batch, "val")
        keys = answer_keys(batch)
        if keys is None and batch_idx == 0 and self.trainer.world_size > 1:
            rank_zero_warn(
                "validation batches carry no item_id: the items a distributed sampler repeats to pad the last shard "
                "enter the tuned threshold (DetectionDataModule sets item_id)"
            )
        self.val_scores.update(probs, batch.y, keys)

    def on_validation_epoch_end(self) -> None:
        probs, target = self.val_scores.compute()
        self.val_scores.reset()
        if probs.numel() == 0:
            return
        if not self.trainer.sanity_checking:
            # MostFrequent's class: the validation majority, whether or not the threshold is tuned
            self.majority.fill_(float(target.float().mean() >= 0.5))
        if self.tune_threshold and not self.trainer.sanity_checking:
            if self.threshold_resamples:
                thr = bootstrap_f1_threshold(probs, target, self.threshold_resamples, self.baseline_seed)
            else:
                thr = best_f1_threshold(probs, target)[0]
            self.threshold.fill_(thr)
        values = {f"val/{k}": v for k, v in detection_scores(probs, target, float(self.threshold)).items()}
        values["val/threshold"] = self.threshold.clone()
        self.log("val/f1", values.pop("val/f1"), prog_bar=True)
        self.log_dict(values)

    def setup(self, stage: str) -> None:
        # built here, before Lightning moves the module to its device (a metric built in a later hook would keep its
        # states on the default device); LLM-based detectors give 0/1 verdicts or sample shares: threshold 0.5
        if stage == "test":
            names = getattr(getattr(self.trainer, "datamodule", None), "baseline_names", None) or []
            self.llm_baseline_names = list(names)
            # ModuleDict keys may not hold dots: index by column
            self.llm_baseline_metrics = torch.nn.ModuleDict({str(k): detection_metrics() for k in range(len(names))})

    def on_test_epoch_start(self) -> None:
        set_threshold(self.test_metrics, float(self.threshold))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        _, probs = self._loss(batch, "test")
        target = batch.y.long()
        self.test_metrics.update(probs, target)
        self.mostfrequent_metrics.update(torch.full_like(probs, float(self.majority)), target)
        # answer nodes come graph by graph, in the order of each graph's answer_names
        rand = torch.tensor(
            [
                item_uniform(self.baseline_seed, qid, name)
                for qid, names in zip(batch.qid, batch.answer_names)
                for name in names
            ],
            device=probs.device,
        )
        self.random_metrics.update(rand, target)
        scores = getattr(batch, "baseline_scores", None)
        for k, metrics in enumerate(self.llm_baseline_metrics.values()):
            if scores is not None:
                metrics.update(scores[:, k].to(probs.device), target)

    def on_test_epoch_end(self) -> None:
        values = {}
        llm = [(f"{name}/", m) for name, m in zip(self.llm_baseline_names, self.llm_baseline_metrics.values())]
        for name, metrics in (
            ("", self.test_metrics),
            ("mostfrequent/", self.mostfrequent_metrics),
            ("random/", self.random_metrics),
            *llm,
        ):
            values.update({f"test/{name}{k}": v for k, v in metrics.compute().items()})
            metrics.reset()
        values["test/threshold"] = self.threshold.clone()
        self.log_dict(values)

    def predict_step(self, batch: Any, batch_idx: int) -> list[dict[str, Any]]:
        """Per question: the proposed answers with their hallucination probability and flag."""
        probs = torch.sigmoid(self(batch)).cpu()
        owner = batch.batch[batch.answer_index].cpu()
        thr = float(self.threshold)
        out = []
        for g, (qid, names) in enumerate(zip(batch.qid, batch.answer_names)):
            p = probs[owner == g].tolist()
            out.append(
                {
                    "id": qid,
                    "prediction": list(names),
                    "hallucination_prob": [round(x, 6) for x in p],
                    "flagged": [n for n, x in zip(names, p) if x >= thr],
                    "threshold": thr,
                }
            )
        return out

    def conformal_scores(self, batch: Any) -> ConformalScores:
        """For :class:`~kglightning.callbacks.ConformalCallback`: each answer node is an item with the candidate labels
        ``("faithful", "hallucinated")`` and non-conformity ``1 - p(label)``; ``labels`` one-hot of ``batch.y``."""
        p = torch.sigmoid(self(batch)).double()
        y = getattr(batch, "y", None)
        labels = F.one_hot(y.long(), 2).bool() if y is not None else None
        return ConformalScores(
            torch.stack([p, 1 - p], dim=1),
            labels=labels,
            candidates=("faithful", "hallucinated"),
            keys=answer_keys(batch),
        )

    def attach_conformal_sets(
        self, outputs: list[dict[str, Any]], batch: Any, sets: list[list[str]], qhat: float
    ) -> None:
        """Adds ``conformal_set`` (one label set per proposed answer), ``conformal_qhat`` and ``conformal_full_set``
        to each question's dict of :meth:`predict_step`."""
        owner = batch.batch[batch.answer_index].tolist()
        for g, out in enumerate(outputs):
            out["conformal_set"] = [s for s, o in zip(sets, owner) if o == g]
            out["conformal_qhat"] = qhat
            out["conformal_full_set"] = qhat == float("inf")

    def configure_optimizers(self) -> Any:
        if self.optimizer is None:
            optimizer = torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=1e-4)
        else:
            optimizer = self.optimizer(self.parameters())
        if self.scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler(optimizer), "interval": "epoch"}}
