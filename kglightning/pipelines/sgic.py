"""SGIC's uncertainty-guided iterative self-calibration (SGIC §3.1-3.2), run by ``predict``, with its baselines.

Per question (documents from :class:`~kglightning.datamodules.SGICDataModule`: verbalized KG paths or text passages):

1. **round 0**: a greedy answer to the question with all documents, and its confidence (Eq. 1); the answer
   uncertainty (Eq. 2) is taken against the mean confidence ``s̄`` of the split's round-0 answers, computed in a first
   pass over the predict data before the first batch (or given as ``answer_mean``, e.g. the training split's);
2. **document scores**: one greedy answer per (question, single document), ``1 -`` its confidence, min-max
   normalised over the question's documents (Eq. 3); all pairs of a batch go to the backend in one call;
3. **rounds 1..K**: the Table 1 prompt (scored documents, the question, every earlier answer with its uncertainty
   as ``Round k``), a greedy answer, its uncertainty by Eq. 2 with the same ``s̄``;
4. the **final answer** is the round (0..K) with the lowest uncertainty (the first on ties).

Beside it, on the same questions and backend: ``baseline`` (the round-0 answer) and ``k_sampling`` (``K`` answers
sampled at ``sample_temperature`` from the round-0 prompt, the one with the highest sequence probability kept: the
paper's baseline "sampled the same number of times").

At the end of ``predict``, the predicted split's folder in ``output_dir`` (``outputs/sgic/test/``) gets
``rounds.jsonl`` (per question: documents and their scores, every round's answer, confidence, uncertainty, EM and
F1, the samples), per-method RoG-format predictions with their
``evaluate`` files and ``comparison.md`` (Hit, F1, ECE with confidence ``1 - uncertainty/100``, prompt tokens sent per
question: round 0 for ``baseline``; round 0, the document scores and the K rounds for ``sgic``; the samples for
``k_sampling``), and
``sgic_summary.md``/``.json``: EM and F1 (SQuAD normalisation) per method and per round, the AUROC of the
uncertainty for telling correct (EM) from wrong answers, generated and prompt tokens and seconds per method, and the
counters of bad input. ``uncertainty_trajectories.png`` plots the mean uncertainty by round for the four kinds of
change between round 0 and the final answer (the paper's Fig. 4) and ten single questions (Fig. 5).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from kglightning.data.sources.passages import PassageExample
from kglightning.fileio import SplitOutputs, atomic_write, clear_outputs, write_text_atomic
from kglightning.llm.backends.base import GenerationParams, LLMBackend
from kglightning.llm.sgic_prompt import SGICPrompt
from kglightning.llm.sgic_rounds import History, SelfCalibration, clean_answer, split_mean
from kglightning.llm.uncertainty import UncertaintyEstimator, answer_uncertainty
from kglightning.metrics.functional.squad import squad_exact_match, squad_f1, squad_hit
from kglightning.pipelines._ddp import gather_unique_rows, sum_over_ranks
from kglightning.pipelines.report import comparison_outputs, write_comparison
from kglightning.pipelines.sgic_report import METHODS, plot_trajectories, summarize, summary_markdown

__all__ = ["SGICPipeline"]

log = logging.getLogger(__name__)


def _correctness(answer: str, gold: Sequence[str], correct_if: str) -> dict[str, float]:
    """SQuAD exact match, Hit and F1 of one answer against the accepted answers, and which of them counts."""
    scores = {"em": squad_exact_match(answer, gold), "hit": squad_hit(answer, gold), "f1": squad_f1(answer, gold)}
    return {**scores, "correct": scores[correct_if]}


class SGICPipeline(SplitOutputs, L.LightningModule):
    """Iterative self-calibration of an LLM's answers with token-probability uncertainty (SGIC).

    Args:
        backend: the LLM (a local Hugging Face model, the bundled SmolLM2 by default in ``configs/sgic.yaml``, or an
            OpenAI-compatible endpoint that returns token log-probabilities, as vLLM does).
        rounds: ``K``, the calibration rounds after round 0 (the paper: 5).
        prompt: the Table 1 input format (:class:`~kglightning.llm.sgic_prompt.SGICPrompt`; its
            ``max_document_tokens`` truncates documents).
        estimator: a generation's confidence (default :class:`~kglightning.llm.uncertainty.MaxProbProduct`, Eq. 1).
        generation: decoding of every greedy answer (``temperature`` must be 0: Eq. 1 multiplies the highest token
            probabilities, which greedy decoding generates); token log-probabilities are always requested.
        answer_mean: ``s̄`` of Eq. 2; ``None`` computes it from the round-0 answers of the predict split.
        sample_temperature: temperature of the ``k_sampling`` baseline (the paper: 0.7).
        samples: answers sampled for ``k_sampling``; ``None`` = ``rounds``; ``0`` skips the baseline.
        seed: sampling seed (sample ``k`` uses ``seed + 1000 * k``).
        output_dir: where the report goes, one subfolder per predicted split
            (``outputs/sgic/test/``; ``{split}`` in it places the split's name elsewhere).
        n_bins: calibration bins of the comparison.
        correct_if: what counts as a correct answer for the uncertainty AUROC, the round-0 -> final transitions and
            the plot: SQuAD exact match (``"em"``) or Hit (``"hit"``). EM, Hit and F1 are all reported.
    """

    def __init__(
        self,
        backend: LLMBackend,
        rounds: int = 5,
        prompt: SGICPrompt | None = None,
        estimator: UncertaintyEstimator | None = None,
        generation: GenerationParams = GenerationParams(max_new_tokens=32, stop=("\n",)),
        answer_mean: float | None = None,
        sample_temperature: float = 0.7,
        samples: int | None = None,
        seed: int = 0,
        output_dir: str = "outputs/sgic",
        n_bins: int = 10,
        correct_if: Literal["em", "hit"] = "em",
    ) -> None:
        super().__init__()
        if answer_mean is not None and not 0 < answer_mean < 1:
            raise ValueError(f"answer_mean must be in (0, 1), got {answer_mean}")
        if sample_temperature <= 0:
            raise ValueError(f"sample_temperature must be > 0, got {sample_temperature}")
        if samples is not None and samples < 0:
            raise ValueError(f"samples must be >= 0, got {samples}")
        self.engine = SelfCalibration(backend, rounds, prompt, estimator, generation, correct_if)
        self.rounds = rounds
        self.answer_mean = answer_mean
        self.sample_params = dataclasses.replace(self.engine.params, temperature=sample_temperature)
        self.samples = rounds if samples is None else samples
        self.seed = seed
        self.output_dir = output_dir
        self.n_bins = n_bins
        self._reset()

    @property
    def prompt(self) -> SGICPrompt:
        return self.engine.prompt

    def _reset(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.mean: float | None = self.answer_mean
        self.engine.reset(METHODS)
        self.counts = {"questions": 0, "without_documents": 0, "unstable": 0, "empty_answers": 0}

    def _predict_examples(self) -> list[PassageExample]:
        """This process's share of the predict data, read from a fresh loader (the loop's own is already running)."""
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and hasattr(dm, "predict_dataloader"):
            items = [e for batch in dm.predict_dataloader() for e in batch]
            return items[self.trainer.global_rank :: self.trainer.world_size]
        loaders = self.trainer.predict_dataloaders
        loaders = list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]
        return [e for loader in loaders for batch in loader for e in batch]

    def _compute_mean(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        size = max(int(getattr(dm, "batch_size", 8) or 8), 1)
        total, count = self.engine.mean_confidence(self._predict_examples(), size, ("baseline", "sgic"))
        stats = torch.tensor([total, float(count)], dtype=torch.float64, device=self.device)  # NCCL: on the device
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(stats)
        total, count = stats.tolist()
        self.mean = split_mean(total, count)
        rank_zero_info(f"SGIC: mean round-0 answer confidence s̄ = {self.mean:.4f} over {int(count)} questions")

    def sample_baseline(self, examples: Sequence[PassageExample]) -> list[list[dict[str, Any]]]:
        """``samples`` sampled answers per example from the round-0 prompt, each with its sequence probability and
        the prompt tokens it took."""
        out: list[list[dict[str, Any]]] = [[] for _ in examples]
        convs = [self.prompt.plain(e.question, e.documents) for e in examples]
        for k in range(self.samples):
            params = dataclasses.replace(self.sample_params, seed=self.seed + 1000 * k)
            for i, g in enumerate(self.engine.generate(convs, params, ("k_sampling",))):
                out[i].append(
                    {
                        "answer": clean_answer(g.text),
                        "confidence": self.engine.confidence(g),
                        "prompt_tokens": g.prompt_tokens,
                    }
                )
        return out

    # Lightning hooks

    def output_files(self) -> list[Path]:
        """The files :meth:`write_report` writes."""
        out = self.run_dir()
        names = ("rounds.jsonl", "sgic_summary.json", "sgic_summary.md", "uncertainty_trajectories.png")
        return [out / n for n in names] + comparison_outputs(out, METHODS)

    def on_predict_start(self) -> None:
        self._reset()
        if self.mean is None:
            self._compute_mean()
        if self.trainer.is_global_zero:  # a run killed before its report leaves no earlier report behind
            clear_outputs(self.output_files())

    def predict_step(self, batch: list[PassageExample], batch_idx: int) -> list[dict[str, Any]]:
        examples = list(batch)
        self.counts["questions"] += len(examples)
        self.counts["without_documents"] += sum(not e.documents for e in examples)
        zero = self.engine.round_zero(examples, ("baseline", "sgic"))
        spent = [g.prompt_tokens for g in zero]  # SGIC's prompt tokens per question: round 0, documents, rounds
        doc_scores = self.engine.document_scores(examples, ("sgic",), spent)
        histories = [[self.engine.scored(g, self.mean)] for g in zero]
        for _ in range(self.rounds):
            self.engine.calibrate(examples, doc_scores, histories, self.mean, None, ("sgic",), spent)
        samples = self.sample_baseline(examples)
        tokens = [
            {"baseline": g.prompt_tokens, "sgic": n, "k_sampling": sum(x["prompt_tokens"] for x in smp)}
            for g, n, smp in zip(zero, spent, samples)
        ]
        rows = [self._row(e, s, h, smp, t) for e, s, h, smp, t in zip(examples, doc_scores, histories, samples, tokens)]
        self.rows.extend(rows)
        return rows

    def _row(
        self,
        example: PassageExample,
        doc_scores: list[float],
        history: History,
        samples: list[dict[str, Any]],
        prompt_tokens: dict[str, int],
    ) -> dict[str, Any]:
        gold, correct_if = example.answer, self.engine.correct_if
        rounds = [
            {"round": k, "answer": a, "confidence": c, "uncertainty": u, **_correctness(a, gold, correct_if)}
            for k, (a, u, c) in enumerate(history)
        ]
        self.counts["empty_answers"] += sum(not r["answer"] for r in rounds)
        best = min(rounds, key=lambda r: (r["uncertainty"], r["round"]))
        self.counts["unstable"] += len(rounds) > 1 and rounds[-1]["answer"] != rounds[-2]["answer"]
        methods = {"baseline": rounds[0], "sgic": best}
        if samples:
            pick = max(samples, key=lambda s: s["confidence"])
            methods["k_sampling"] = {
                "answer": pick["answer"],
                "uncertainty": answer_uncertainty(pick["confidence"], self.mean),
                **_correctness(pick["answer"], gold, correct_if),
            }
        variants = {
            m: {
                "prediction": [r["answer"]] if r["answer"] else [],
                "confidence": [round(1.0 - r["uncertainty"] / 100.0, 6)] if r["answer"] else [],
                "input_tokens": prompt_tokens[m],
            }
            for m, r in methods.items()
        }
        return {
            "id": example.id,
            "question": example.question,
            "answer": gold,
            "documents": example.documents,
            "document_scores": doc_scores,
            "rounds": rounds,
            "final_round": best["round"],
            "samples": samples,
            "methods": {
                m: {k: r[k] for k in ("answer", "uncertainty", "em", "hit", "f1", "correct")}
                for m, r in methods.items()
            },
            "variants": variants,
        }

    def on_predict_epoch_end(self) -> None:
        rows = gather_unique_rows(self.rows)
        # the counters and the cost of every process, for the per-question figures of the report
        self.counts = sum_over_ranks({**self.counts, "truncated_documents": self.prompt.truncated})
        self.engine.cost = sum_over_ranks(self.engine.cost)
        if self.trainer.is_global_zero and rows:
            self.results = self.write_report(rows)

    def write_report(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Write ``rounds.jsonl``, the per-method predictions and comparison, the summary and the plot."""
        out = self.run_dir()
        out.mkdir(parents=True, exist_ok=True)
        with atomic_write(out / "rounds.jsonl") as f:
            for row in rows:
                f.write(json.dumps({k: v for k, v in row.items() if k != "variants"}, ensure_ascii=False) + "\n")
        methods = [m for m in METHODS if m in rows[0]["variants"]]
        comparison = write_comparison(rows, methods, out, self.n_bins)
        self.counts.setdefault("truncated_documents", self.prompt.truncated)
        summary = summarize(rows, self.rounds, self.engine.cost, self.counts, self.mean)
        summary["comparison"] = {  # the evaluation's keys are lower case; the summary's are the tables' headers
            m: {k: comparison[m].get(k.lower()) for k in ("Hit", "F1", "ECE")} for m in methods
        }
        write_text_atomic(out / "sgic_summary.json", json.dumps(summary, indent=2) + "\n")
        text = summary_markdown(summary)
        write_text_atomic(out / "sgic_summary.md", text)
        plot_trajectories(rows, out / "uncertainty_trajectories.png")
        rank_zero_info(f"SGIC on {len(rows)} questions ({out}/sgic_summary.md):\n{text}")
        return summary
