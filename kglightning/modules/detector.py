"""KG-Guard hallucination detector as a LightningModule (KG-Guard §3.2, App. A)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.nn import functional as F

from kglightning.conformal.scorer import ConformalScores
from kglightning.datamodules.detection_graphs import GROUNDING_KINDS, answer_owner
from kglightning.metrics.classification import detection_scores
from kglightning.modules.detector_compat import build_ungrounded_scorer, upgrade_state_dict
from kglightning.modules.detector_scores import (
    ScoreBuffer,
    answer_keys,
    detection_loss,
    item_uniform,
    labelled_answers,
)
from kglightning.modules.detector_thresholds import Decision, shifted_probs, tune_decision
from kglightning.nn import GraphEncoder, GraphTransformerEncoder, KGGuard, UngroundedAnswerScorer, nearest_nodes

UNGROUNDED = 2  # index of "ungrounded" in kglightning.datamodules.detection_graphs.GROUNDING_KINDS


class HallucinationDetector(L.LightningModule):
    """Flags hallucinated answers: label 1 = the proposed answer is not a gold answer.

    An answer that names a node of the question's graph is scored by the graph model (:class:`~kglightning.nn.KGGuard`
    over ``encoder``); one that names no node (an *ungrounded* answer, kept by
    :class:`~kglightning.datamodules.DetectionDataModule` with ``ungrounded="keep"``) by ``ungrounded_scorer``, from
    its text, the question and the graph node nearest to it (or, with ``text=False``, from its similarity to that
    node, its place in the list and the answer features). Both are trained by the same loss. The test table gives
    every metric over the grounded answers (``test/f1``...) and over all answers (``test/all/f1``...), for the
    detector and each baseline (``test/<baseline>/f1``, ``test/all/<baseline>/f1``).

    The decision rule is tuned on validation at the end of every validation epoch
    (:mod:`~kglightning.modules.detector_thresholds`) and kept in buffers, so it is saved in checkpoints. The two
    models' scores live on different scales, so the ungrounded answers' logits get an offset (``ungrounded_offset``),
    chosen so that one probability ranks every validation answer best (average precision); each population then has
    its own threshold: a grounded answer is flagged when ``p >= threshold``, an ungrounded one when ``p >=
    ungrounded_threshold`` (see ``threshold_for``). Tests, predictions and conformal scores use the shifted logits.
    The majority class of the validation labels is kept in ``majority`` (grounded answers) and ``majority_all``
    (every answer); the test run reports the MostFrequent and Random baselines beside the detector
    (``test/mostfrequent/*``, ``test/random/*``).
    Known limit: :class:`~kglightning.callbacks.ConformalCallback` with ``fit_on="validation"`` collects its scores
    during the validation batches, before this epoch's offset is tuned, so its ``qhat`` is fitted on the previous
    epoch's offset; with ungrounded answers, prefer ``fit_on="fit_end"``.

    Reloading: through the CLI (``--ckpt_path``) the config rebuilds the encoder. In Python, pass a non-default
    encoder again, as the factory is not pickled into the checkpoint:
    ``HallucinationDetector.load_from_checkpoint(path, encoder=partial(GATEncoder, hidden_channels=256))``; a
    non-default ``ungrounded_scorer`` likewise.

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
        threshold: initial decision threshold (of both populations).
        tune_threshold: re-tune the thresholds on validation.
        threshold_resamples: ``0``: the grounded threshold is the best-F1 one on the validation set; ``B > 0``: the
            median of the best-F1 thresholds of ``B`` bootstrap resamples of the validation answer nodes (seeded by
            ``baseline_seed``), which stays stable when the validation set is small
            (:func:`~kglightning.modules.detector_thresholds.bootstrap_f1_threshold`); with ``threshold_for:
            grounded`` only.
        tune_ungrounded_offset: tune ``ungrounded_offset`` on validation
            (:func:`~kglightning.modules.detector_thresholds.best_ap_offset`); ``False`` keeps it at 0.
        threshold_for: ``"grounded"``: the grounded threshold is the best-F1 one over the graph model's answers, then
            the ungrounded threshold the best for F1 over every answer given it; ``"all"``: both together, for the
            best F1 over every validation answer
            (:func:`~kglightning.modules.detector_thresholds.best_joint_thresholds`). Choose ``"all"`` when the
            LLM's answers are often not graph nodes, as a real LLM's are. ``"calibrated"``: each population's
            threshold is where its Platt-calibrated probability (fitted on validation) reaches half the best
            validation F1 (:func:`~kglightning.modules.detector_thresholds.half_best_f1_threshold`); it moves less
            with a small validation set than a searched threshold. ``"all_ap"`` is an older name of ``"all"``. Ties keep
            the fewest flags; a population with no validation answer keeps its threshold.
        baseline_seed: seed of the Random baseline, whose score for a node is fixed by (seed, question id,
            node name), so that it is the same on one process or many.
        pos_weight: weight of the hallucinated (positive) class in the loss (``None``: 1). Below 1 when most
            answers are hallucinated, as with small LLMs; ``neg / pos`` of the training set balances the classes.
        focal_gamma: focusing parameter of the focal loss (Lin et al., 2017); ``0`` is plain binary cross-entropy.
        answer_features: extra classifier inputs per answer (both models'), read from ``batch.answer_features``
            (the CLI links it to the DataModule's ``num_answer_features``).
        marks, question_node, edge_text, inputs: the paper's ablations (Tables 4-5), all on by default; see
            :class:`~kglightning.nn.KGGuard`.
        ungrounded_scorer: the model of ungrounded answers, built as ``ungrounded_scorer(text_dim)`` (and
            ``answer_features=answer_features`` when there are any); name it by ``class_path`` (default
            :class:`~kglightning.nn.UngroundedAnswerScorer`).

    Example:
        One question's graph, its three proposed answers (two name nodes, one names none), scored by a small
        detector and then fitted to them for a few steps. A run fits it with the Trainer over
        :class:`~kglightning.datamodules.DetectionDataModule`'s graphs (``configs/detector.yaml``); here a random
        table stands in for the text encoder.

        >>> from functools import partial
        >>> import torch
        >>> from kglightning.data import KGQARecord
        >>> from kglightning.datamodules.detection_graphs import DetectionStats, build_detection_graph, node_texts
        >>> from kglightning.datamodules.graph_forms import collate_graphs
        >>> from kglightning.nn import GraphTransformerEncoder
        >>> record = KGQARecord("q1", "Which country is Paris the capital of?", answer=["France"], q_entity=["Paris"],
        ...     a_entity=["France"], graph=[("Paris", "capital of", "France"), ("Paris", "located in", "Europe")],
        ...     prediction=["France", "Europe", "Atlantis"])
        >>> rows = {text: i for i, text in enumerate(node_texts(record))}  # text -> row of an embedding table
        >>> graph = build_detection_graph(record, rows, DetectionStats(), ungrounded="keep")
        >>> graph.answer_names, graph.y.tolist()  # 1: hallucinated (not a gold answer)
        (['France', 'Europe', 'Atlantis'], [0.0, 1.0, 1.0])
        >>> _ = torch.manual_seed(0)
        >>> table = torch.randn(len(rows), 16)
        >>> batch = collate_graphs([graph], lambda ids: table[ids])
        >>> encoder = partial(GraphTransformerEncoder, hidden_channels=16, num_layers=1, heads=2)
        >>> detector = HallucinationDetector(text_dim=16, encoder=encoder, mark_dim=4, mlp_hidden=16)
        >>> detector.eval()(batch).sigmoid().shape  # P(hallucinated) per answer
        torch.Size([3])
        >>> optimizer = torch.optim.Adam(detector.train().parameters(), lr=0.01)
        >>> for _ in range(30):
        ...     loss = torch.nn.functional.binary_cross_entropy_with_logits(detector(batch), batch.y)
        ...     optimizer.zero_grad(); loss.backward(); optimizer.step()
        >>> (detector.eval()(batch).sigmoid() > 0.5).tolist()
        [False, True, True]
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
        tune_ungrounded_offset: bool = True,
        threshold_for: Literal["grounded", "all", "calibrated", "all_ap"] = "grounded",
        baseline_seed: int = 0,
        pos_weight: float | None = None,
        focal_gamma: float = 0.0,
        answer_features: int = 0,
        marks: bool = True,
        question_node: bool = True,
        edge_text: bool = True,
        inputs: Literal["graph+question", "graph", "question"] = "graph+question",
        ungrounded_scorer: Callable[[int], UngroundedAnswerScorer] = UngroundedAnswerScorer,
    ) -> None:
        super().__init__()
        if pos_weight is not None and pos_weight <= 0:
            raise ValueError(f"pos_weight must be > 0, got {pos_weight}")
        if threshold_for not in ("grounded", "all", "calibrated", "all_ap"):
            raise ValueError(f"threshold_for must be 'grounded', 'all' or 'calibrated', got {threshold_for!r}")
        threshold_for = "all" if threshold_for == "all_ap" else threshold_for  # the older name
        if threshold_for != "grounded" and not tune_threshold:
            raise ValueError(f"threshold_for={threshold_for!r} tunes the thresholds: it needs tune_threshold")
        if threshold_for != "grounded" and threshold_resamples:
            raise ValueError(
                "threshold_resamples (bootstrap) tunes a grounded-only threshold: use threshold_for=grounded"
            )
        if threshold_resamples < 0:
            raise ValueError(f"threshold_resamples must be >= 0, got {threshold_resamples}")
        if focal_gamma < 0:
            raise ValueError(f"focal_gamma must be >= 0, got {focal_gamma}")
        self.save_hyperparameters(ignore=["encoder", "optimizer", "scheduler", "ungrounded_scorer"])
        self.net = KGGuard(text_dim, encoder, mark_dim=mark_dim, mlp_hidden=mlp_hidden, dropout=dropout,
                           answer_features=answer_features, marks=marks, question_node=question_node,
                           edge_text=edge_text, inputs=inputs)  # fmt: skip
        # the ungrounded answers read the same answer features as the graph's (a scorer that takes none is built as
        # before, with its text inputs alone)
        self.ungrounded = build_ungrounded_scorer(ungrounded_scorer, text_dim, answer_features)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.tune_threshold = tune_threshold
        self.threshold_resamples = threshold_resamples
        self.tune_ungrounded_offset = tune_ungrounded_offset
        self.threshold_for = threshold_for
        self.baseline_seed = baseline_seed
        self.pos_weight = pos_weight
        self.focal_gamma = focal_gamma
        self.register_buffer("threshold", torch.tensor(float(threshold)))  # of the grounded answers
        self.register_buffer("ungrounded_threshold", torch.tensor(float(threshold)))
        self.register_buffer("majority", torch.tensor(1.0))  # MostFrequent's class over the grounded answers
        self.register_buffer("majority_all", torch.tensor(1.0))  # ... and over every answer
        # added to the ungrounded answers' logits outside training, so that one probability ranks every answer
        self.register_buffer("ungrounded_offset", torch.tensor(0.0))
        self.val_scores = ScoreBuffer()
        self.val_ungrounded = ScoreBuffer()  # raw logits of the ungrounded answers
        # the test run's scores per scorer (the detector, then its baselines), over every answer with its item key, so
        # that the repeats a distributed sampler pads the last shard with are counted once; built in setup("test")
        self.test_scores = torch.nn.ModuleDict()
        self.test_grounded = ScoreBuffer()  # 1 for a grounded answer, in the same key order
        self.llm_baseline_names: list[str] = []  # the datamodule's baselines, set in setup("test")

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict``; a checkpoint saved by an older version loads as that version decided
        (:func:`~kglightning.modules.detector_compat.upgrade_state_dict`, with a warning where it lacks weights)."""
        own = super().state_dict()
        width = int(self.hparams.get("answer_features", 0) or 0)
        state_dict = upgrade_state_dict(state_dict, own, width)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def decision(self) -> Decision:
        """The tuned decision rule (thresholds and offset) held in this module's buffers."""
        return Decision(float(self.threshold), float(self.ungrounded_threshold), float(self.ungrounded_offset))

    def answer_thresholds(self, grounded: Tensor) -> Tensor:
        """``(A,)`` the threshold of each answer: ``threshold`` for a grounded one, ``ungrounded_threshold`` else."""
        return torch.where(grounded.to(self.threshold.device), self.threshold, self.ungrounded_threshold)

    def forward(self, batch: Any, calibrated: bool | None = None) -> Tensor:
        """Logits ``(A,)`` for every proposed answer of the batch, in answer order (per graph: grounded answers, then
        ungrounded ones).

        ``calibrated`` (default: outside training) adds the validation-tuned ``ungrounded_offset`` to the ungrounded
        answers' logits, so that one probability ranks every answer (each population then has its own threshold).

        Edge features come per edge type (``type_text_emb``, ``type_kind``, ``edge_type``, as
        :meth:`~kglightning.datamodules.DetectionDataModule.collate` builds them) or per edge (``edge_text_emb``,
        ``edge_kind``); both give the same logits.
        """
        grounding = getattr(batch, "answer_grounding", None)
        loose = grounding == UNGROUNDED if grounding is not None else None
        features = getattr(batch, "answer_features", None) if self.net.answer_features else None
        node_logits = self._graph_logits(batch, features if loose is None or features is None else features[~loose])
        if loose is None:  # graphs built before ungrounded answers existed: every answer is a node
            return node_logits
        logits = node_logits.new_zeros(loose.numel())
        logits[~loose] = node_logits[: int((~loose).sum())]
        loose_logits = self._ungrounded_logits(batch, loose, None if features is None else features[loose])
        logits[loose] = loose_logits[: int(loose.sum())]
        if not self.training if calibrated is None else calibrated:
            # in float32 (also under bf16 autocast), as the validation epoch tuned the rule on them
            logits = logits.float() + loose.float() * self.ungrounded_offset.float()
        # under DDP every parameter must take part in every step: a batch without one kind of answer adds a zero
        # that depends on the other model's output
        if node_logits.numel() > int((~loose).sum()) or loose_logits.numel() > int(loose.sum()):
            logits = logits + 0.0 * (node_logits.sum() + loose_logits.sum())
        return logits

    def _graph_logits(self, batch: Any, features: Tensor | None) -> Tensor:
        index = batch.answer_index
        if index.numel() == 0:  # no grounded answer: score the question nodes, only to keep the graph model in use
            index = batch.question_index
            features = None if features is None else features.new_zeros(index.numel(), features.shape[-1])
        if getattr(batch, "edge_type", None) is not None:
            edges = (batch.type_text_emb, batch.type_kind, batch.edge_type)
        else:
            edges = (batch.edge_text_emb, batch.edge_kind, None)
        answer_mask = batch.answer_mask
        return self.net(
            batch.x_text,
            batch.topic_mask,
            answer_mask,
            batch.edge_index,
            edges[0],
            edges[1],
            index,
            batch.question if index is batch.answer_index else batch.x_text[index],
            edge_type=edges[2],
            answer_features=features,
        )

    def _ungrounded_logits(self, batch: Any, loose: Tensor, features: Tensor | None = None) -> Tensor:
        """Logits of the ungrounded answers (or of one placeholder, to keep the model in use, when there are none)."""
        x = batch.x_text
        q_index = batch.ungrounded_question_index
        answer = getattr(batch, "ungrounded_x", None)
        if not getattr(self.ungrounded, "answer_features", 0):  # a scorer that reads no answer features
            features = None
        extra = {} if features is None else {"features": features}
        if q_index.numel() == 0 or answer is None:
            zero = x.new_zeros(1, x.shape[-1])
            if features is not None:
                extra = {"features": x.new_zeros(1, features.shape[-1])}
            return self.ungrounded(zero, zero, zero, x.new_zeros(1), x.new_zeros(1), **extra)
        candidates = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        candidates[batch.question_index] = False
        idx, sim = nearest_nodes(answer, x, batch.batch, batch.batch[q_index], candidates)
        nearest = torch.where((idx >= 0)[:, None], x[idx.clamp_min(0)], torch.zeros_like(answer))
        return self.ungrounded(answer, x[q_index], nearest, sim, batch.answer_rank[loose].to(x.dtype), **extra)

    def _loss(self, batch: Any, stage: str) -> tuple[Tensor, Tensor]:
        """The loss over the batch's labelled answers (:func:`~kglightning.modules.detector_scores.labelled_answers`:
        an answer of a question with no gold answer has no label), and the logits of every answer."""
        logits = self(batch, calibrated=stage == "test")  # validation tunes the offset on the raw logits
        mask = labelled_answers(batch)
        scored, target = (logits, batch.y) if mask is None else (logits[mask], batch.y[mask])
        if target.numel():
            loss = detection_loss(scored, target, self.pos_weight, self.focal_gamma)
        else:  # nothing labelled: a zero that keeps every parameter in the step, logged with weight 0 so that every
            loss = logits.sum() * 0.0  # process reaches the same collectives (DDP)
        train = stage == "train"
        self.log(
            f"{stage}/loss",
            loss,
            batch_size=target.numel(),
            prog_bar=train,
            on_step=train,
            on_epoch=True,
            sync_dist=not train,
        )
        return loss, logits

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch, "train")[0]

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        _, logits = self._loss(batch, "val")
        keys = answer_keys(batch)
        if keys is None and batch_idx == 0 and self.trainer.world_size > 1:
            rank_zero_warn(
                "validation batches carry no item_id: the items a distributed sampler repeats to pad the last shard "
                "enter the tuned threshold (DetectionDataModule sets item_id)"
            )
        grounding = getattr(batch, "answer_grounding", None)
        grounded = grounding != UNGROUNDED if grounding is not None else torch.ones_like(batch.y, dtype=torch.bool)
        labelled = labelled_answers(batch)
        if labelled is not None:  # an answer without a label tunes nothing
            labelled = labelled.to(grounded.device)
            grounded, loose = grounded & labelled, ~grounded & labelled
        else:
            loose = ~grounded
        pick = (lambda m: None) if keys is None else (lambda m: keys[m])  # noqa: E731
        # the raw logits of each population tune the decision rule (updated every step, empty or not, so every
        # process holds the state); val/* is over the graph model's answers, as test/*
        self.val_scores.update(logits[grounded], batch.y[grounded], pick(grounded))
        self.val_ungrounded.update(logits[loose], batch.y[loose], pick(loose))

    def on_validation_epoch_end(self) -> None:
        logits, target = self.val_scores.compute()
        loose_logits, loose_target = self.val_ungrounded.compute()
        for buf in (self.val_scores, self.val_ungrounded):
            buf.reset()
        if logits.numel() == 0 and loose_logits.numel() == 0:
            return
        loose_target = loose_target.to(target)
        if not self.trainer.sanity_checking:
            # MostFrequent's class: the validation majority, whether or not the thresholds are tuned
            if logits.numel():
                self.majority.fill_(float(target.float().mean() >= 0.5))
            self.majority_all.fill_(float(torch.cat([target, loose_target]).float().mean() >= 0.5))
            decision = tune_decision(
                logits, target, loose_logits, loose_target, self.threshold_for, self.decision(),
                self.tune_threshold, self.tune_ungrounded_offset, self.threshold_resamples, self.baseline_seed,
            )  # fmt: skip
            self.threshold.fill_(decision.threshold)
            self.ungrounded_threshold.fill_(decision.ungrounded_threshold)
            self.ungrounded_offset.fill_(decision.offset)
        # the probabilities the test and predict steps give these answers
        shifted = shifted_probs(loose_logits, float(self.ungrounded_offset)).to(logits)
        probs = torch.cat([torch.sigmoid(logits), shifted])
        loose = torch.cat([torch.zeros_like(target, dtype=torch.bool), torch.ones_like(loose_target, dtype=torch.bool)])
        values: dict[str, Any] = {}
        if logits.numel():  # a validation split without a grounded answer has no grounded metrics
            grounded = detection_scores(probs[~loose], target, float(self.threshold))
            values |= {f"val/{k}": v for k, v in grounded.items()}
        # every answer (the same as val/* when every answer is a graph node), so that a monitor on val/all/* exists
        every = detection_scores(probs, torch.cat([target, loose_target]), self.answer_thresholds(~loose).to(probs))
        values |= {f"val/all/{k}": v for k, v in every.items()}
        for name in ("threshold", "ungrounded_threshold", "ungrounded_offset"):
            values[f"val/{name}"] = getattr(self, name).clone()
        if "val/f1" in values:
            self.log("val/f1", values.pop("val/f1"), prog_bar=True)
        self.log_dict(values)

    def setup(self, stage: str) -> None:
        # built here, before Lightning moves the module to its device (a metric built in a later hook would keep its
        # states on the default device)
        if stage == "test":
            names = getattr(getattr(self.trainer, "datamodule", None), "baseline_names", None) or []
            self.llm_baseline_names = list(names)
            # ModuleDict keys may not hold dots or slashes: the detector, MostFrequent, Random, then the baselines
            self.test_scores = torch.nn.ModuleDict({str(k): ScoreBuffer() for k in range(3 + len(names))})

    def test_step(self, batch: Any, batch_idx: int) -> None:
        probs = torch.sigmoid(self._loss(batch, "test")[1])
        target = batch.y.long()
        keys = answer_keys(batch)
        grounding = getattr(batch, "answer_grounding", None)
        grounded = grounding != UNGROUNDED if grounding is not None else torch.ones_like(target, dtype=torch.bool)
        # answers come graph by graph, in the order of each graph's answer_names
        rand = torch.tensor(
            [
                item_uniform(self.baseline_seed, qid, name)
                for qid, names in zip(batch.qid, batch.answer_names)
                for name in names
            ],
            device=probs.device,
        )
        columns = [probs, torch.full_like(probs, float(self.majority)), rand]
        scores = getattr(batch, "baseline_scores", None)
        # every process updates every buffer (NaN where a batch has no baseline scores): compute() is a collective
        columns += [
            scores[:, k].to(probs) if scores is not None else torch.full_like(probs, float("nan"))
            for k in range(len(self.llm_baseline_names))
        ]
        labelled = labelled_answers(batch)
        if labelled is not None:  # the answers of a question without a gold answer have no label to score
            labelled = labelled.to(probs.device)
            columns, target, grounded = [c[labelled] for c in columns], target[labelled], grounded[labelled]
            keys = None if keys is None else keys[labelled]
        for buf, column in zip(self.test_scores.values(), columns):
            buf.update(column, target, keys)
        self.test_grounded.update(grounded.float(), target, keys)

    def on_test_epoch_end(self) -> None:
        """``test/<scorer>/<metric>`` over the grounded answers and ``test/all/<scorer>/<metric>`` over every answer,
        each answer once (by item key); the detector at its tuned threshold, the baselines (0/1 verdicts, uniform
        draws or sample shares) at 0.5."""
        flags, _ = self.test_grounded.compute()
        grounded = flags > 0.5
        names = ["", "mostfrequent/", "random/", *(f"{name}/" for name in self.llm_baseline_names)]
        values = {}
        for name, buf in zip(names, self.test_scores.values()):
            probs, target = buf.compute()
            buf.reset()
            if bool(torch.isnan(probs).all()):  # the datamodule gave no scores for this baseline
                continue
            thr = self.answer_thresholds(grounded).to(probs) if name == "" else torch.full_like(probs, 0.5)
            if bool(grounded.any()):  # a split with no grounded answer leaves out the grounded metrics
                scores = detection_scores(probs[grounded], target[grounded], thr[grounded])
                values |= {f"test/{name}{k}": v for k, v in scores.items()}
            if name == "mostfrequent/":  # over every answer, MostFrequent answers the majority of every answer
                probs = torch.full_like(probs, float(self.majority_all))
            values |= {f"test/all/{name}{k}": v for k, v in detection_scores(probs, target, thr).items()}
        self.test_grounded.reset()
        values["test/threshold"] = self.threshold.clone()
        values["test/ungrounded_threshold"] = self.ungrounded_threshold.clone()
        values["test/ungrounded_offset"] = self.ungrounded_offset.clone()
        self.log_dict(values)

    def predict_step(self, batch: Any, batch_idx: int) -> list[dict[str, Any]]:
        """Per question: the proposed answers with their hallucination probability and flag,
        ``hallucination_logit`` (the same ranking without float32 saturation), ``hallucinated``, each answer's label
        against the record's gold answers (what ``kglightning select`` calibrates on; ``null`` for a record without
        gold answers, which has nothing to label against and which ``select`` leaves out of calibration), and
        ``prediction_entries``: per answer, the indices of the record's ``prediction`` entries behind it (repeats,
        spellings of one node)."""
        raw = self(batch)
        probs = torch.sigmoid(raw).cpu()  # on the module's device, as the thresholds were tuned
        logits = raw.float().cpu()
        owner = answer_owner(batch).cpu()
        grounding = getattr(batch, "answer_grounding", None)
        kinds = [GROUNDING_KINDS[k] for k in grounding.tolist()] if grounding is not None else None
        loose = grounding == UNGROUNDED if grounding is not None else torch.zeros_like(owner, dtype=torch.bool)
        flagged = (probs >= self.answer_thresholds(~loose.cpu()).cpu()).tolist()
        thresholds = {"threshold": float(self.threshold), "ungrounded_threshold": float(self.ungrounded_threshold)}
        labels = batch.y.bool().cpu().tolist() if getattr(batch, "y", None) is not None else None
        labelled = getattr(batch, "labelled", None)  # absent from graphs built before it existed: labelled
        labelled = labelled.cpu().tolist() if labelled is not None else [True] * len(batch.qid)
        entries = getattr(batch, "answer_entries", None)  # absent from graphs built before it existed
        out = []
        for g, (qid, names) in enumerate(zip(batch.qid, batch.answer_names)):
            mine = (owner == g).nonzero().flatten().tolist()
            p = probs[mine].tolist()
            out.append(
                {
                    "id": qid,
                    "prediction": list(names),
                    "hallucination_prob": [round(x, 6) for x in p],
                    # the same order without saturation: past logit ~16 float32 probabilities tie at 1
                    "hallucination_logit": [round(float(logits[i]), 6) for i in mine],
                    **({"grounding": [kinds[i] for i in mine]} if kinds else {}),
                    # null for a record without gold answers: it has nothing to label against (select leaves it out)
                    **(
                        {"hallucinated": [labels[i] for i in mine] if labelled[g] else None}
                        if labels is not None
                        else {}
                    ),
                    **({"prediction_entries": entries[g]} if entries is not None else {}),
                    "flagged": [n for n, i in zip(names, mine) if flagged[i]],
                    **thresholds,
                }
            )
        return out

    def conformal_scores(self, batch: Any) -> ConformalScores:
        """For :class:`~kglightning.callbacks.ConformalCallback`: each answer node is an item with the candidate labels
        ``("faithful", "hallucinated")`` and non-conformity ``1 - p(label)``; ``labels`` one-hot of ``batch.y``, with
        ``labelled`` ``False`` for the answers of a question without gold answers; ``units`` the answer's question
        (its graph's ``item_id``), the exchangeable unit; the groups are grounded (0) and ungrounded (1) answers, for
        ``ConformalCallback(by_group=True)``."""
        p = torch.sigmoid(self(batch)).double()
        y = getattr(batch, "y", None)
        labels = F.one_hot(y.long(), 2).bool() if y is not None else None
        grounding = getattr(batch, "answer_grounding", None)
        groups = (grounding == UNGROUNDED).long() if grounding is not None else torch.zeros_like(p, dtype=torch.long)
        item = getattr(batch, "item_id", None)  # the answers of one question cluster: the question is the unit
        return ConformalScores(
            torch.stack([p, 1 - p], dim=1),
            labels=labels,
            candidates=("faithful", "hallucinated"),
            keys=answer_keys(batch),
            groups=groups,
            group_names=("grounded", "ungrounded"),
            units=item.to(p.device).long()[answer_owner(batch)] if item is not None else None,
            labelled=labelled_answers(batch),  # a question without gold answers has no labels to calibrate on
        )

    def attach_conformal_sets(
        self, outputs: list[dict[str, Any]], batch: Any, sets: list[list[str]], qhat: float | list[float]
    ) -> None:
        """Adds ``conformal_set`` (one label set per proposed answer), ``conformal_qhat`` and ``conformal_full_set``
        to each question's dict of :meth:`predict_step`; with a threshold per answer (groups), both are lists."""
        owner = answer_owner(batch).tolist()
        for g, out in enumerate(outputs):
            out["conformal_set"] = [s for s, o in zip(sets, owner) if o == g]
            if isinstance(qhat, list):
                mine = [q for q, o in zip(qhat, owner) if o == g]
                out["conformal_qhat"], out["conformal_full_set"] = mine, [q == float("inf") for q in mine]
            else:
                out["conformal_qhat"], out["conformal_full_set"] = qhat, qhat == float("inf")

    def configure_optimizers(self) -> Any:
        if self.optimizer is None:
            optimizer = torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=1e-4)
        else:
            optimizer = self.optimizer(self.parameters())
        if self.scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler(optimizer), "interval": "epoch"}}
