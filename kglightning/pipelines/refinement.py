"""KG-Guard hallucination correction (KG-Guard §4.4): flagged answer nodes are fed back to the LLM, up to a cap.

For a batch of questions, :class:`KGGuardRefinement` runs:

0. **Initial answers** (KAPING-style): the LLM sees the question and the ``max_triples`` triples of its subgraph
   that are most similar to it (MiniLM cosine), and answers ``{answer: confidence}``
   (:func:`~kglightning.llm.parsing.parse_answers` reads it leniently; nothing readable is an abstention). Answers
   are grounded to nodes of the question's full subgraph by normalised name
   (:func:`~kglightning.llm.grounding.ground_answers`).
1. **Detection**: each question's answer nodes go into a KG-Guard graph
   (:func:`~kglightning.datamodules.detection_graphs.build_detection_graph`, the same construction and text embeddings as
   the detector's training data), and the trained :class:`~kglightning.modules.HallucinationDetector` scores them;
   a node is flagged when its probability reaches the detector's tuned ``threshold``.
2. A question with no flag is **resolved** at this step; its answers no longer change.
3. Every other question is **re-prompted** in one batched call: the chat holds the system instruction, the question
   with its triples, the LLM's most recent response, and a follow-up that lists the flagged names.

Steps 1-3 repeat ``max_rounds`` times at most; the answers of the last round are scored once more, so that the
report says how many capped questions are still flagged.

Decisions the paper leaves open (its LLM was constrained to subgraph nodes, ours is not):

* **Answers that name no KG node** cannot be scored by the detector. With ``unmatched="flag"`` (default) they stay
  in the answer set and count as flagged: the follow-up lists them as "not in the knowledge graph". With
  ``unmatched="drop"`` they are removed from the answer set, as a graph-constrained decoder would have done. Both
  count them (``unmatched`` of every round in the predictions and the report).
* **Abstentions** (no readable answer, ``{}``, "unknown"...) have no node to flag, so they are resolved as they
  are (the paper excludes them from detection); they are counted per step.

Outputs (rank 0, at the end of ``predict``; rows of every rank are gathered under DDP) are written by
:func:`~kglightning.pipelines.refinement_report.write_report` to the predicted split's folder in ``output_dir``
(``outputs/refinement/test/``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from kglightning.data.embeddings import SentenceEncoder
from kglightning.data.records import KGQARecord
from kglightning.data.text import RelationView
from kglightning.datamodules.detection import DetectionDataModule
from kglightning.datamodules.detection_graphs import DetectionStats, build_detection_graph, node_texts
from kglightning.datamodules.text_rows import TextRows
from kglightning.fileio import SplitOutputs, clear_outputs
from kglightning.llm.backends import ChatMessage, GenerationParams, LLMBackend, LocalHFBackend
from kglightning.llm.grounding import ground_answers
from kglightning.llm.parsing import parse_answers
from kglightning.metrics.functional.qa import is_abstention
from kglightning.modules.detector import HallucinationDetector
from kglightning.nn import GraphEncoder
from kglightning.pipelines._ddp import gather_unique_rows, sum_over_ranks
from kglightning.pipelines.refinement_prompts import follow_up_message, initial_messages, verbalize_triple
from kglightning.pipelines.refinement_report import REPORT_FILES, format_table, write_report
from kglightning.retrieval.faiss_grounding import FaissGrounder

__all__ = ["KGGuardRefinement", "load_detector"]

log = logging.getLogger(__name__)

DETECTOR_COMMAND = "python -m kglightning fit --config configs/detector.yaml"


def load_detector(path: str, encoder: Callable[[int, int], GraphEncoder] | None = None) -> HallucinationDetector:
    """Load a trained detector for inference (eval mode, frozen), with errors that say what to do.

    Args:
        path: a checkpoint of :class:`~kglightning.modules.HallucinationDetector`.
        encoder: the graph-encoder factory it was trained with, when not the default ``GraphTransformerEncoder``
            (the factory is not stored in checkpoints).
    """
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"detector checkpoint not found: {path!r}. Train the detector first with `{DETECTOR_COMMAND}` (it writes "
            "outputs/detector/graph_transformer/checkpoints/best.ckpt), or set model.init_args.detector_ckpt"
        )
    kwargs: dict[str, Any] = {"map_location": "cpu"}
    if encoder is not None:
        kwargs["encoder"] = encoder
    try:
        detector = HallucinationDetector.load_from_checkpoint(path, **kwargs)
    except RuntimeError as e:
        raise ValueError(
            f"{path}: the checkpoint does not fit the detector built here ({str(e).splitlines()[0]}); set "
            "model.init_args.encoder to the encoder the detector was trained with (see its training config)"
        ) from e
    detector.eval().requires_grad_(False)
    return detector


@dataclass
class _Dialogue:
    """The state of one question across rounds."""

    record: KGQARecord
    triples: list[str]
    prompt: list[ChatMessage]
    versions: list[dict[str, Any]] = field(default_factory=list)
    resolved_round: int | None = None

    @property
    def last(self) -> dict[str, Any]:
        return self.versions[-1]


# a hyperparameter, so checkpoints hold it: let torch.load(weights_only=True) rebuild it
torch.serialization.add_safe_globals([GenerationParams])


class KGGuardRefinement(SplitOutputs, L.LightningModule):
    """KG-Guard's refinement loop as a ``predict``-only LightningModule over batches of :class:`KGQARecord`.

    ``predict_step`` returns one row per question (its final ``prediction``, ``confidence`` when every answer has
    one, ``ground_truth``, ``iterations`` and the per-round history under ``rounds``); at the end of ``predict``
    the report is written to ``output_dir`` (see :mod:`kglightning.pipelines.refinement_report`). Subclass it to
    change the prompts (:meth:`initial_messages`, :meth:`follow_up`) or the context (:meth:`select_triples`).

    Args:
        detector_ckpt: checkpoint of a trained :class:`~kglightning.modules.HallucinationDetector`.
        reasoner: the LLM (default: :class:`~kglightning.llm.backends.LocalHFBackend` on the bundled SmolLM2);
            give it a ``cache_dir`` to make reruns resume from its response cache.
        encoder: the detector's graph-encoder factory, when it was trained with a non-default one.
        text_encoder: the sentence encoder the detector was trained with (default: the bundled MiniLM); it also
            ranks the triples of the prompt.
        cache_dir: cache root of the text embeddings (default ``$KGLIGHTNING_CACHE``, shared with the detector).
        max_rounds: refinement rounds at most (the cap; KG-Guard uses 5).
        max_triples: triples of the subgraph shown to the LLM, most similar to the question first (``None``: all).
        generation: the reasoner's decoding settings (:class:`~kglightning.llm.backends.GenerationParams`; default
            greedy, 64 new tokens per answer, seed 0).
        unmatched: ``"flag"`` answers that name no KG node (kept, re-prompted as unverifiable), or ``"drop"`` them.
        add_reverse_edges: as in the detector's training data (``DetectionDataModule``).
        relation_view: how relations are written for the text encoder, as in the detector's training data
            (``DetectionDataModule``'s ``relation_view``).
        output_dir: where the predictions and the report are written, one subfolder per predicted split
            (``outputs/refinement/test/``; ``{split}`` in it places the split's name elsewhere).
        grounder: grounds answers that match no node name exactly to the most similar name
            (:class:`~kglightning.retrieval.FaissGrounder`); ``None`` keeps exact matching only.
    """

    def __init__(
        self,
        detector_ckpt: str,
        reasoner: LLMBackend | None = None,
        encoder: Callable[[int, int], GraphEncoder] | None = None,
        text_encoder: SentenceEncoder | None = None,
        cache_dir: str | None = None,
        max_rounds: int = 5,
        max_triples: int | None = 30,
        generation: GenerationParams = GenerationParams(max_new_tokens=64),
        unmatched: Literal["flag", "drop"] = "flag",
        add_reverse_edges: bool = True,
        relation_view: RelationView = "readable",
        output_dir: str = "outputs/refinement",
        grounder: FaissGrounder | None = None,
    ) -> None:
        super().__init__()
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        if max_triples is not None and max_triples < 1:
            raise ValueError(f"max_triples must be >= 1 or None, got {max_triples}")
        if unmatched not in ("flag", "drop"):
            raise ValueError(f"unmatched must be 'flag' or 'drop', got {unmatched!r}")
        self.save_hyperparameters(ignore=["reasoner", "encoder", "text_encoder", "grounder"])
        self.grounder = grounder
        self.detector = load_detector(detector_ckpt, encoder)
        self.reasoner = reasoner if reasoner is not None else LocalHFBackend(show_progress=False)
        self.text_encoder = text_encoder or SentenceEncoder(show_progress=False)
        # the detector's graph construction and embedding table, shared with its training data
        self.detection_data = DetectionDataModule(
            encoder=self.text_encoder,
            cache_dir=cache_dir,
            add_reverse_edges=add_reverse_edges,
            relation_view=relation_view,
        )
        self.detector_ckpt = detector_ckpt
        self.max_rounds = max_rounds
        self.max_triples = max_triples
        self.generation = generation
        self.unmatched = unmatched
        self.output_dir = output_dir
        self.rows: list[dict[str, Any]] = []
        self.timings: dict[str, dict[str, float]] = {}

    @property
    def threshold(self) -> float:
        """The detector's decision threshold (tuned on validation when it was trained)."""
        return float(self.detector.threshold)

    def check_text_encoder(self) -> None:
        """Raise if the text encoder's size is not the one the detector was trained with."""
        want, have = self.detector.net.text_dim, self.text_encoder.dim
        if want != have:
            raise ValueError(
                f"{self.detector_ckpt} was trained on {want}-d text embeddings, but text_encoder "
                f"({self.text_encoder.model}) gives {have}-d ones; use the detector's encoder"
            )

    # prompts

    def select_triples(self, records: Sequence[KGQARecord]) -> list[list[str]]:
        """Per record, its verbalized triples most similar to the question (at most ``max_triples``)."""
        emb = self.detection_data.embeddings
        texts = [[verbalize_triple(*t) for t in dict.fromkeys(r.graph)] for r in records]
        if self.max_triples is None:
            return texts
        emb.add([t for ts in texts for t in ts] + [r.question for r in records])
        out = []
        for record, ts in zip(records, texts):
            if len(ts) <= self.max_triples:
                out.append(ts)
                continue
            sims = emb.embed(ts) @ emb.embed([record.question])[0]
            order = torch.argsort(sims, descending=True, stable=True)[: self.max_triples]
            out.append([ts[i] for i in order.tolist()])
        return out

    def initial_messages(self, record: KGQARecord, triples: Sequence[str]) -> list[ChatMessage]:
        """The first chat (see :func:`~kglightning.pipelines.refinement_prompts.initial_messages`)."""
        return initial_messages(record.question, triples)

    def follow_up(self, flagged: Sequence[str], unmatched: Sequence[str]) -> str:
        """The follow-up message of a re-prompt (see :func:`follow_up_message`)."""
        return follow_up_message(flagged, unmatched)

    # one round's parts

    def read_answers(self, record: KGQARecord, text: str, step: int, follow_up: str | None = None) -> dict[str, Any]:
        """Parse and ground one response into a history entry (``scores``/``flagged`` are filled by :meth:`score`)."""
        parsed = parse_answers(text)
        answers = {a: c for a, c in parsed.answers.items() if not is_abstention(a)}
        entities = {n for triple in record.graph for n in (triple[0], triple[2])}
        grounded = ground_answers(answers, sorted(entities), near_miss=self.grounder)
        unmatched = list(grounded.unmatched)
        names = list(grounded.entities) + (unmatched if self.unmatched == "flag" else [])
        conf = {**grounded.entities, **grounded.unmatched}
        return {
            "round": step,
            "follow_up": follow_up,
            "response": text,
            "answers": names,
            "confidence": [conf[n] for n in names],
            "unmatched": unmatched,
            "abstained": not names,
            "parse_issues": parsed.issues + grounded.issues,
            "scores": {},
            "flagged": [],
        }

    @torch.inference_mode()
    def score(self, dialogues: Sequence[_Dialogue]) -> None:
        """Score the latest answers of ``dialogues`` with the detector; fill their ``scores`` and ``flagged``."""
        emb = self.detection_data.embeddings
        view = self.detection_data.relation_view
        texts = list(dict.fromkeys(t for d in dialogues for t in node_texts(d.record, view)))
        emb.add(texts)
        text_id = TextRows(emb._index)  # one graph per dialogue over the split's vocabulary: memoised per call
        graphs, owners = [], []
        for d in dialogues:
            nodes = [a for a in d.last["answers"] if a not in d.last["unmatched"]]
            record = replace(d.record, prediction=nodes, confidence=None, prediction_paths=None)
            if nodes and (
                g := build_detection_graph(
                    record, text_id, DetectionStats(), self.detection_data.add_reverse_edges, relation_view=view
                )
            ):
                graphs.append(g)
                owners.append(d)
        probs: dict[int, dict[str, float]] = {}
        if graphs:
            batch = self.detection_data.collate(graphs).to(self.device)
            p = torch.sigmoid(self.detector(batch).float()).cpu()
            owner = batch.batch[batch.answer_index].cpu()
            for g, d in enumerate(owners):
                probs[id(d)] = dict(zip(batch.answer_names[g], p[owner == g].tolist()))
        for d in dialogues:
            scores, v = probs.get(id(d), {}), d.last
            v["scores"] = {n: round(x, 6) for n, x in scores.items()}
            # an answer without a score (it names no KG node) cannot be verified: it counts as flagged
            v["flagged"] = [a for a in v["answers"] if a not in scores or scores[a] >= self.threshold]

    def generate(self, chats: Sequence[list[ChatMessage]]) -> list[str]:
        """One batched LLM call."""
        return [g.text for g in self.reasoner.generate_with_params(list(chats), self.generation)]

    # the loop

    def _timed(self, step: int, key: str, start: float) -> None:
        entry = self.timings.setdefault(str(step), {})
        entry[key] = entry.get(key, 0.0) + time.perf_counter() - start

    def refine(self, records: Sequence[KGQARecord]) -> list[dict[str, Any]]:
        """Run the loop on ``records``; one row per record (see the class docstring)."""
        records = list(records)
        if not records:
            return []
        t0 = time.perf_counter()
        triples = self.select_triples(records)
        dialogues = [_Dialogue(r, t, self.initial_messages(r, t)) for r, t in zip(records, triples)]
        self._timed(0, "retrieve_s", t0)
        t0 = time.perf_counter()
        for d, text in zip(dialogues, self.generate([d.prompt for d in dialogues])):
            d.versions.append(self.read_answers(d.record, text, 0))
        self._timed(0, "generate_s", t0)
        for step in range(self.max_rounds + 1):
            active = [d for d in dialogues if d.resolved_round is None]
            t0 = time.perf_counter()
            self.score(active)
            self._timed(step, "detect_s", t0)
            if step == self.max_rounds:  # the answers of the last round are only scored, for the report
                break
            for d in active:
                if not d.last["flagged"]:
                    d.resolved_round = step
            todo = [d for d in active if d.resolved_round is None]
            rank_zero_info(
                f"refinement step {step}: {len(active) - len(todo)} of {len(active)} questions resolved, "
                f"{len(todo)} flagged" + (f" -> round {step + 1}/{self.max_rounds}" if todo else "")
            )
            if not todo:
                break
            t0 = time.perf_counter()
            follow_ups = [self.follow_up(d.last["flagged"], d.last["unmatched"]) for d in todo]
            chats = [
                [*d.prompt, {"role": "assistant", "content": d.last["response"]}, {"role": "user", "content": f}]
                for d, f in zip(todo, follow_ups)
            ]
            for d, f, text in zip(todo, follow_ups, self.generate(chats)):
                d.versions.append(self.read_answers(d.record, text, step + 1, follow_up=f))
            self._timed(step + 1, "generate_s", t0)
        return [self._row(d) for d in dialogues]

    def _row(self, d: _Dialogue) -> dict[str, Any]:
        r, last = d.record, d.last
        row: dict[str, Any] = {"id": r.id, "question": r.question, "prediction": list(last["answers"])}
        if last["answers"] and all(c is not None for c in last["confidence"]):
            row["confidence"] = list(last["confidence"])
        row.update(
            ground_truth=list(r.answer),
            flagged=list(last["flagged"]),
            resolved=d.resolved_round is not None,
            iterations=self.max_rounds if d.resolved_round is None else d.resolved_round,
            triples=d.triples,
            rounds=d.versions,
        )
        return row

    # Lightning hooks

    def output_files(self) -> list[Path]:
        """The files :func:`~kglightning.pipelines.refinement_report.write_report` writes."""
        return [self.run_dir() / n for n in REPORT_FILES]

    def on_predict_start(self) -> None:
        self.check_text_encoder()
        self.rows, self.timings = [], {}
        if self.trainer.is_global_zero:  # a run killed before its report leaves no earlier report behind
            clear_outputs(self.output_files())

    def predict_step(self, batch: list[KGQARecord], batch_idx: int) -> list[dict[str, Any]]:
        rows = self.refine(batch)
        self.rows.extend(rows)
        return rows

    def on_predict_end(self) -> None:
        rows = gather_unique_rows(self.rows)
        timings = sum_over_ranks(self.timings)  # seconds of every process
        if not self.trainer.is_global_zero:
            return
        meta = {
            "detector_ckpt": self.detector_ckpt,
            "threshold": self.threshold,
            "reasoner": repr(self.reasoner),
            "unmatched": self.unmatched,
            "max_triples": self.max_triples,
            **{k: v for k, v in self.generation.to_dict().items() if k in ("max_new_tokens", "temperature", "seed")},
        }
        summary = write_report(rows, self.run_dir(), self.max_rounds, meta=meta, timings=timings)
        for logger in self.loggers:
            for s in summary["steps"]:
                values = {f"refine/{k}": v for k, v in s["metrics"].items() if v is not None}
                logger.log_metrics(values, step=s["step"])
            logger.save()
        rank_zero_info(f"KG-Guard refinement ({len(rows)} questions):\n{format_table(summary)}")
        rank_zero_info(f"wrote the predictions and the report to {self.run_dir()}")

    def configure_optimizers(self) -> Any:
        raise RuntimeError("KGGuardRefinement has nothing to train; run `predict` (train the detector with `fit`)")
