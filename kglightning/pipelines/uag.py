"""UAG as a LightningModule: ``python -m kglightning predict --config configs/uag.yaml --model.alpha 0.2``.

At the start of ``predict`` the module scores its calibration pool (the data module's ``calibration_split``, by
default ``validation``), fits :class:`~kglightning.conformal.uag.UAGController` and selects ``(alpha1, alpha2,
alpha3)`` by Learn-Then-Test for ``alpha`` and for every level of ``sweep_alphas``; it fits the Top-K and split-CP
baselines on the same pool. It prints the selected per-component error rates and writes them to
``<output_dir>/<split>/ltt.json``. Each predicted question then gets UAG's set from the breadth-first traversal at the
selected thresholds (:class:`~kglightning.conformal.uag.UAGTraversal`), the baselines' sets, and, for every swept
level, whether each method covered it and with how many answers.

When ``alpha`` cannot be certified, the module abstains explicitly: every set is the full candidate pool and each
row says ``"abstained": true`` (the same for a baseline that cannot reach a level).

Outputs (rank 0, rows of every DDP process gathered): ``predictions.jsonl`` (readable by ``python -m kglightning
evaluate``), ``metrics.json``, and with ``sweep_alphas`` the table ``sweep.md``/``sweep.json`` and the plot
``coverage_vs_alpha.png``.

Without an ``llm``, the evaluator (Eq. 6) compares each candidate with the question instead of with an LLM answer;
see :mod:`kglightning.conformal.uag.scores`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from kglightning.conformal.answer_sampling import AnswerSampler
from kglightning.conformal.clm import CLM
from kglightning.conformal.lofree import LoFreeCP
from kglightning.conformal.sample_cp import SampleSplitCP, SampleTopK
from kglightning.conformal.sampling import SampledAnswers, set_covers
from kglightning.conformal.uag import (
    QuestionScores,
    SplitCP,
    TopK,
    UAGCalibration,
    UAGController,
    UAGTraversal,
    covers,
    members_at,
    score_questions,
)
from kglightning.conformal.uag.controller import split_indices
from kglightning.conformal.uag.evaluator import LLMEvaluator
from kglightning.data.embeddings import (
    BUNDLED_MINILM,
    EmbeddingCache,
    SentenceEncoder,
    TransientEmbeddings,
    default_cache_root,
)
from kglightning.data.kg import KGIndex
from kglightning.data.records import KGQARecord
from kglightning.fileio import SplitOutputs, atomic_write, clear_outputs, write_text_atomic
from kglightning.pipelines._ddp import gather_unique_rows
from kglightning.pipelines.uag_report import (
    METHODS,
    SWEEP_FILES,
    alpha_key,
    describe,
    evaluator_usage,
    sweep_markdown,
    sweep_results,
    write_sweep,
)

RELATION_SCORER_HINT = "train it with `python -m kglightning fit --config configs/relation_scorer.yaml`"


class UAGReasoner(SplitOutputs, L.LightningModule):
    """Conformal KG traversal with Learn-Then-Test error control (UAG), run by ``predict``.

    Args:
        encoder: the relation scorer's sentence encoder (a folder written by
            :class:`~kglightning.modules.RelationScorer`, or the bundled MiniLM without fine-tuning).
        alpha: the user's error rate: the set misses the gold answers with probability at most ``alpha``.
        controller: the Learn-Then-Test settings (:class:`~kglightning.conformal.uag.UAGController`: grid step
            ``h``, FWER level ``delta``, procedure, p-value, coverage ``"any"``/``"all"``, the seeded quantile /
            calibration / selection fractions of the pool); default ``UAGController()``.
        calibration_split: the data module's split used as the calibration pool.
        max_hops: longest relation path walked.
        max_paths: bound on enumerated relation paths per question.
        llm: optional reasoner LLM for the evaluator (Eq. 6).
        sweep_alphas: levels for the ECR/APSS table and plot (``[]`` for none).
        baselines: also fit and apply Top-K and split CP.
        sampler: also fit and apply the sampling baselines on the LLM answers it samples (e.g.
            ``AnswerSampler(KAPINGAnswerer(...), samples=10)``): Top-K and split CP ranked by the LLM's likelihood
            (or sample frequency with ``quality: frequency``), fitted on the whole pool like the distance
            baselines; LoFreeCP, its weights tuned on the controller's quantile split and its threshold set on the
            calibration split; CLM, certified on the calibration split and selected on the selection split. With a sampler, ``predict``
            always calibrates (the loaded state keeps UAG's and the distance baselines' fits only).
        clm: CLM's settings (default ``CLM(delta=controller.delta)``; ``set_confidence``, grids); used with
            ``sampler``.
        output_dir: where the outputs go, one subfolder per predicted split
            (``outputs/uag/test/``; ``{split}`` in it places the split's name elsewhere).
        cache_dir: text-embedding cache root (default ``$KGLIGHTNING_CACHE/embeddings``).
        progress: show progress bars.
        store_question_texts: keep each question's step queries and path texts in the embedding cache too, so a
            rerun on the same questions encodes nothing (``configs/uag.yaml`` does, on the small embedded
            benchmark); off, they are encoded per question and dropped, which a full-size split needs (millions of
            rows otherwise: about 6 MB of disk per question at RoG's 5,000 paths).

    The fitted selections (and baselines) are in the module's ``state_dict``, keyed by the float ``alpha``: save
    with ``trainer.save_checkpoint`` after ``predict``, and ``predict --ckpt_path`` (or ``load_state_dict``)
    reuses them without calibrating again. They are used only when they were fitted with the same controller
    settings, calibration split, traversal bounds and levels (``alpha`` and ``sweep_alphas``); otherwise the module
    calibrates anew and says so.
    """

    def __init__(
        self,
        encoder: SentenceEncoder | None = None,
        alpha: float = 0.2,
        controller: UAGController | None = None,
        calibration_split: Literal["train", "validation", "test"] = "validation",
        max_hops: int = 3,
        max_paths: int | None = 5000,
        llm: LLMEvaluator | None = None,
        sweep_alphas: list[float] | None = None,
        baselines: bool = True,
        sampler: AnswerSampler | None = None,
        clm: CLM | None = None,
        output_dir: str = "outputs/uag",
        cache_dir: str | None = None,
        progress: bool = True,
        store_question_texts: bool = False,
    ) -> None:
        super().__init__()
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if any(not 0 < a < 1 for a in sweep_alphas or []):
            raise ValueError(f"sweep_alphas must lie in (0, 1), got {sweep_alphas}")
        self.encoder = encoder or SentenceEncoder(show_progress=progress)
        self.alpha = float(alpha)
        self.controller = controller or UAGController()
        self.coverage = self.controller.coverage
        self.calibration_split = calibration_split
        self.max_hops = max_hops
        self.max_paths = max_paths
        self.llm = llm
        self.sweep_alphas = [float(a) for a in sweep_alphas or []]
        self.baselines = baselines
        self.sampler = sampler
        self.clm_settings = clm or CLM(delta=self.controller.delta)
        self.clm_settings.coverage = self.coverage  # one coverage for every method of the table
        self.fitted_sampling: dict[float, dict[str, Any]] = {}
        self.output_dir = Path(output_dir)
        self.cache_dir = cache_dir
        self.progress = progress
        self.store_question_texts = store_question_texts
        self.rows: list[dict[str, Any]] = []
        self.selections: dict[float, UAGCalibration] = {}
        self.fitted_baselines: dict[float, dict[str, SplitCP | TopK]] = {}
        self._cache: EmbeddingCache | None = None
        self.empty_pools = 0
        self.calibration_seconds = 0.0
        self._fitted_for: dict[str, Any] | None = None  # the settings the selections were fitted with
        self._calibration_data: str | None = None  # the data module's key of the calibration split, when known

    @property
    def cache(self) -> EmbeddingCache:
        if self._cache is None:
            if self.encoder.model != BUNDLED_MINILM and not Path(self.encoder.path).is_dir():
                raise FileNotFoundError(
                    f"relation scorer encoder not found at {self.encoder.path!r}; {RELATION_SCORER_HINT}, "
                    "or set model.encoder.init_args.model to a sentence-transformers folder"
                )
            root = self.cache_dir if self.cache_dir is not None else default_cache_root() / "embeddings"
            self._cache = EmbeddingCache(self.encoder, root)
        return self._cache

    @property
    def alphas(self) -> list[float]:
        """``alpha`` followed by the swept levels (no repeats)."""
        return list(dict.fromkeys([self.alpha, *self.sweep_alphas]))

    def score(
        self,
        records: Sequence[KGQARecord],
        desc: str = "UAG scores",
        scratches: Sequence[TransientEmbeddings] | None = None,
    ) -> list[QuestionScores]:
        """UAG scores of ``records`` (the LLM is asked when configured); ``scratches``: see :func:`score_questions`."""
        scores = score_questions(
            records,
            self.cache,
            max_hops=self.max_hops,
            max_paths=self.max_paths,
            progress=self.progress,
            desc=desc,
            store_question_texts=self.store_question_texts,
            scratches=scratches,
        )
        if self.llm is not None:
            self.llm.rescore(records, scores, self.cache)
        return scores

    def fit_settings(self) -> dict[str, Any]:
        """What decides the fitted selections (compared on reload): the controller, the scores' encoder and LLM, and
        the calibration split's data key."""
        c = self.controller
        return {
            "grid": [a.tolist() for a in c.alphas],
            "grid_kind": c.grid,
            "delta": c.delta,
            "procedure": c.procedure,
            "pvalue": c.pvalue,
            "coverage": c.coverage,
            "split_fractions": list(c.split_fractions),
            "seed": c.seed,
            "calibration_split": self.calibration_split,
            "max_hops": self.max_hops,
            "max_paths": self.max_paths,
            "encoder": self.encoder.cache_key,  # the relation scorer's weights decide every distance score
            "llm": None
            if self.llm is None
            else {
                "backend": self.llm.backend.cache_key,
                **{
                    k: getattr(self.llm, k)
                    for k in ("constrained", "max_paths", "instances_per_path", "max_new_tokens", "temperature")
                },
            },  # fmt: skip
            "calibration_data": self._calibration_data,
            "baselines": self.baselines,
            "sampler": self.sampler is not None,
            "alphas": self.alphas,
        }

    def get_extra_state(self) -> dict[str, Any]:
        """The fitted LTT selections and baselines (plain tensors, numbers and strings), keyed by alpha."""
        return {
            "settings": self._fitted_for,
            "selections": {a: dataclasses.asdict(c) for a, c in self.selections.items()},
            "baselines": {a: {m: dict(vars(b)) for m, b in v.items()} for a, v in self.fitted_baselines.items()},
            "empty_pools": self.empty_pools,
        }

    def set_extra_state(self, state: Any) -> None:
        if not state or not state.get("selections"):
            return
        self._fitted_for = state["settings"]
        self.selections = {float(a): UAGCalibration(**d) for a, d in state["selections"].items()}
        kinds = {"split_cp": SplitCP, "top_k": TopK}
        self.fitted_baselines = {}
        for a, fitted in state["baselines"].items():
            self.fitted_baselines[float(a)] = {}
            for m, attrs in fitted.items():
                b = kinds[m](attrs["coverage"])
                vars(b).update(attrs)
                self.fitted_baselines[float(a)][m] = b
        self.empty_pools = int(state["empty_pools"])

    def calibrate(self, pool: Sequence[KGQARecord]) -> dict[float, UAGCalibration]:
        """Fit the controller on ``pool`` and select a configuration for every level in :attr:`alphas`."""
        start = time.perf_counter()
        self.controller.fit(self.score(pool, desc=f"UAG calibration ({self.calibration_split})"))
        pool_scores = self.controller.pool
        self.empty_pools = sum(s.num_entities == 0 for s in pool_scores)
        if self.empty_pools:
            rank_zero_info(
                f"UAG: {self.empty_pools} of {len(pool_scores)} calibration questions have no candidate "
                "(no topic entity in the graph, or no path from it); they count as misses"
            )
        self.selections = {a: self.controller.select(a) for a in self.alphas}
        self.fitted_baselines = {}
        if self.baselines:
            for a in self.alphas:
                self.fitted_baselines[a] = {
                    "split_cp": SplitCP(self.coverage).fit(pool_scores, a),
                    "top_k": TopK(self.coverage).fit(pool_scores, a),
                }
        if self.sampler is not None:
            self.fit_sampling(pool)
        self.calibration_seconds = time.perf_counter() - start
        self._fitted_for = self.fit_settings()
        return self.selections

    def fit_sampling(self, pool: Sequence[KGQARecord]) -> dict[float, dict[str, Any]]:
        """Sample the pool's answers and fit, at every level, Top-K and split CP on the LLM's scores (the whole
        pool, like the distance baselines), LoFreeCP and CLM (on the controller's three splits)."""
        if self.sampler is None:
            raise RuntimeError("no sampler configured")
        sampled = self.sampler.sample(pool)
        quant, cal, sel = ([sampled[i] for i in idx.tolist()] for idx in
                           split_indices(len(pool), self.controller.split_fractions, self.controller.seed))  # fmt: skip
        rank_by = "likelihood" if self.sampler.quality == "logprob" else "frequency"
        self.fitted_sampling = {
            a: {
                "split_cp_llm": SampleSplitCP(rank_by, self.coverage).fit(sampled, a),
                "top_k_llm": SampleTopK(rank_by, self.coverage).fit(sampled, a),
                "clm": copy.copy(self.clm_settings).fit(cal, sel, a),
                "lofree_cp": LoFreeCP.tune(quant, a, coverage=self.coverage).fit(cal, a),
            }
            for a in self.alphas
        }
        return self.fitted_sampling

    def output_files(self) -> list[Path]:
        """The files written at the end of ``predict`` (``ltt.json``, the fitted state, is not among them)."""
        names = ("predictions.jsonl", "metrics.json", *SWEEP_FILES)
        return [self.run_dir() / n for n in names]

    def on_predict_start(self) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None or not hasattr(datamodule, "split_records"):
            raise RuntimeError("UAGReasoner needs a data module with split_records() (e.g. KGQADataModule)")
        if getattr(datamodule, "predict_split", None) == self.calibration_split:
            raise ValueError(
                f"UAGReasoner calibrates on the {self.calibration_split!r} split and the data module predicts on it "
                "too: the coverage guarantee needs questions the calibration has not seen (set data.predict_split "
                "or model.calibration_split to another split)"
            )
        self.rows = []
        if self.trainer.is_global_zero:  # a run killed before its outputs leaves none of an earlier run behind
            clear_outputs(self.output_files())
        key = getattr(datamodule, "dataset_key", None)
        self._calibration_data = key(self.calibration_split) if callable(key) else None
        reuse = bool(self.selections) and self._fitted_for == self.fit_settings() and self.sampler is None
        if reuse:
            rank_zero_info("UAG: using the LTT selections of the loaded state (no calibration)")
        else:
            if self.selections:
                rank_zero_info("UAG: the loaded LTT selections were fitted with other settings; calibrating again")
            self.calibrate(datamodule.split_records(self.calibration_split))
        main = self.selections[self.alpha]
        rank_zero_info(describe(main))
        use = evaluator_usage(self.selections)
        rank_zero_info(
            f"UAG: over {use['levels']} levels, LTT certified {use['certified']}, kept the evaluator (alpha3 > 0) at "
            f"{use['alpha3_positive']}, and it filtered candidates (finite threshold) at {use['filtering']}"
        )
        if self.trainer.is_global_zero:
            self.run_dir().mkdir(parents=True, exist_ok=True)
            payload = {
                "main": main.summary(),
                "levels": {alpha_key(a): c.summary() for a, c in self.selections.items()},
                "baselines": {
                    alpha_key(a): {m: b.summary() for m, b in v.items()} for a, v in self.fitted_baselines.items()
                },
                "sampling_baselines": {
                    alpha_key(a): {m: b.summary() for m, b in v.items()} for a, v in self.fitted_sampling.items()
                },
                "evaluator": evaluator_usage(self.selections),
                "calibration_split": self.calibration_split,
                "calibration_questions_without_candidates": self.empty_pools,
                "calibration_seconds": 0.0 if reuse else round(self.calibration_seconds, 2),
                "from_loaded_state": reuse,
            }
            write_text_atomic(self.run_dir() / "ltt.json", json.dumps(payload, indent=2) + "\n")

    def _methods(self, alpha: float, s: QuestionScores) -> dict[str, tuple[Any, bool]]:
        """Each method's set (``(A,)`` bool) at level ``alpha`` and whether it abstained."""
        cal = self.selections[alpha]
        out = {"uag": (members_at(s, *cal.selected_thresholds), cal.abstained)}
        for name, b in self.fitted_baselines.get(alpha, {}).items():
            out[name] = (b.member(s), b.abstained)
        return out

    def predict_step(self, batch: list[KGQARecord], batch_idx: int) -> list[dict[str, Any]]:
        # each question's own texts, kept for its walk below so that the walk reads the rows the grid read
        scratches = None if self.store_question_texts else [TransientEmbeddings(self.cache) for _ in batch]
        scores = self.score(batch, desc="UAG test scores", scratches=scratches)
        sampled: list[SampledAnswers | None] = [None] * len(batch)
        if self.sampler is not None:
            sampled = list(self.sampler.sample(batch))
        main = self.selections[self.alpha]
        traversal = UAGTraversal(self.cache, self.max_hops)
        rows = []
        for i, (record, s, sq) in enumerate(zip(batch, scores, sampled)):
            kg = KGIndex.from_record(record)
            own = self.cache if scratches is None else scratches[i]
            res = traversal.run(record, *main.selected_thresholds, kg=kg, llm_answer=s.llm_answer, scratch=own)
            row: dict[str, Any] = {
                "id": record.id,
                "question": record.question,
                "answer": record.answer,
                "a_entity": record.a_entity,
                "prediction": res.answers,
                "abstained": main.abstained,
                "set_size": len(res.answers),
                "covered": None,  # from the sweep entry of alpha below
                "num_candidates": s.num_entities,
                "llm_answer": s.llm_answer,
                "paths": {a: [" -> ".join(p) for p in res.paths[a][:3]] for a in res.answers[:20]},
                "baselines": {},
                "sweep": {},
            }
            if sq is not None:
                row["sampled_answers"] = list(sq.samples)
            for a in self.alphas:
                methods = self._methods(a, s)
                key = alpha_key(a)
                row["sweep"][key] = {
                    m: [covers(s, member, self.coverage), int(member.sum())] for m, (member, _) in methods.items()
                }
                for m, b in self.fitted_sampling.get(a, {}).items() if sq is not None else ():
                    names = b.member(sq)
                    row["sweep"][key][m] = [set_covers(names, sq.gold, self.coverage), len(names)]
                    if a == self.alpha:
                        row.setdefault("sampling_baselines", {})[m] = {
                            "prediction": sorted(names),
                            "abstained": b.abstained,
                        }
                if a == self.alpha:
                    row["covered"] = row["sweep"][key]["uag"][0]
                    row["baselines"] = {
                        m: {"prediction": [s.entities[i] for i in member.nonzero().flatten().tolist()], "abstained": ab}
                        for m, (member, ab) in methods.items()
                        if m != "uag"
                    }
            rows.append(row)
        self.rows.extend(rows)
        return rows

    def on_predict_epoch_end(self) -> None:
        rows = gather_unique_rows(self.rows)
        if not self.trainer.is_global_zero or not rows:
            return
        self.write_outputs(rows)

    def write_outputs(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """``predictions.jsonl``, ``metrics.json`` and (with ``sweep_alphas``) the sweep table and plot."""
        out = self.run_dir()
        out.mkdir(parents=True, exist_ok=True)
        with atomic_write(out / "predictions.jsonl") as f:
            for row in rows:
                f.write(json.dumps({k: v for k, v in row.items() if k != "sweep"}) + "\n")
        abstained = {
            alpha_key(a): {"uag": cal.abstained}
            | {m: b.abstained for m, b in self.fitted_baselines.get(a, {}).items()}
            | {m: b.abstained for m, b in self.fitted_sampling.get(a, {}).items()}
            for a, cal in self.selections.items()
        }
        main = sweep_results(rows, [self.alpha], abstained)[0]
        metrics = {"alpha": self.alpha, "n": len(rows), "ltt": self.selections[self.alpha].summary()}
        metrics.update({m: main[m] for m in METHODS if m in main})
        metrics["questions_without_candidates"] = sum(row["num_candidates"] == 0 for row in rows)
        if self.llm is not None:  # over calibration and test questions, this process
            metrics["llm_no_answer"] = self.llm.num_no_answer
            rank_zero_info(f"UAG: the LLM gave no readable answer for {self.llm.num_no_answer} questions")
        if self.sampler is not None:  # over calibration and test questions, this process
            metrics["sampler"] = dict(self.sampler.counts)
        write_text_atomic(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
        rank_zero_info(f"UAG on {len(rows)} questions:\n{sweep_markdown([main])}")
        if self.sweep_alphas:
            results = sweep_results(rows, self.sweep_alphas, abstained)
            meta = {
                "delta": self.controller.delta,
                "coverage": self.coverage,
                "calibration_split": self.calibration_split,
            }
            paths = write_sweep(results, out, meta)
            rank_zero_info(f"alpha sweep:\n{sweep_markdown(results)}\nwrote {paths['md']} and {paths['png']}")
        rank_zero_info(f"wrote the predictions and metrics to {out}")
        return metrics

    def configure_optimizers(self) -> Any:
        raise RuntimeError(f"UAGReasoner has nothing to train; run `predict` ({RELATION_SCORER_HINT} first)")
