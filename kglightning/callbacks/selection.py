"""One ``predict`` run that keeps an LLM's answers with a guarantee: calibrate, select, write the answers and a report.

:class:`SelectionCallback` works with any module whose ``predict_step`` returns, per question, a dict with ``id``,
``prediction`` (its answers), a per-answer score column (``hallucination_logit``, the default, and
``hallucination_prob`` for :class:`~kglightning.modules.HallucinationDetector`) and, on labelled data,
``hallucinated``. When ``predict``
starts it runs ``predict_step`` over a labelled calibration split of the datamodule (the validation split by
default), and when ``predict`` ends it keeps each predicted question's answers with its
:class:`~kglightning.conformal.AnswerSelector` and writes, in ``output_dir``:

* ``trusted_answers.jsonl``: per question (in dataset order) its answers, scores and groups, ``kept``,
  ``kept_scores``, ``dropped``, ``abstained`` and ``selection`` (rule, alpha, the cut of each group), and, when the
  records carry ``prediction_paths``, ``cited_paths`` per answer and ``kept_paths`` per kept answer;
* ``report.md`` and ``report.json``: what was kept per group (calibration size, ``too_small`` flags) and, when the
  predicted split is labelled, the achieved FDR, power, abstention and per-question error per group, and a sweep
  of ``report_alphas`` (``selection.png``: achieved rate and power against alpha);
* ``reliability.png``: the reliability diagram of the scores (``1 - score`` against being right) on the predicted
  split when it is labelled, else on the calibration split.

Calibration questions without labels (records without gold answers) are left out of calibration, with a warning
that counts them; with none labelled, ``predict`` stops. The guarantee assumes the calibration and predicted
questions exchangeable (drawn alike), which the selector checks on their list lengths; a checkpoint chosen on the
calibration split (early stopping on validation) bends that a little, so calibrate on a split that chose nothing
when there is one (``calibration_split``). Under DDP every process calibrates on the whole calibration loader,
the predicted rows are gathered (each question once) and process 0 writes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from kglightning.callbacks.prediction_writer import check_apart_from_data
from kglightning.conformal.selection import CLUSTERED_NOTE, AnswerSelector
from kglightning.conformal.selection_io import ScoredFile, json_number, lookup_key, scored_rows, selected_rows
from kglightning.conformal.selection_report import report_markdown, summarize, write_report
from kglightning.data.devices import all_gather_objects
from kglightning.data.records import RecordError
from kglightning.fileio import atomic_write, clear_outputs, predicted_split, split_folder, write_text_atomic
from kglightning.metrics.functional.selection import grouped_selection_metrics

#: what a predict run writes into ``output_dir``
OUTPUT_FILES = ("trusted_answers.jsonl", "report.md", "report.json", "selection.png", "reliability.png")

log = logging.getLogger(__name__)

GroupBy = Literal["grounded", "grounding", "record", "none"]
GROUP_KEY = "selection_group"


def _with_groups(rows: list[dict[str, Any]], group_by: GroupBy) -> list[dict[str, Any]]:
    """Rows with a per-answer ``selection_group``: grounded or not (``grounded``), the grounding kind, or as given
    (``record`` and ``none``)."""
    if group_by in ("none", "record"):
        return rows
    out = []
    for row in rows:
        kinds = row.get("grounding")
        if not isinstance(kinds, list):
            raise ValueError(
                f"group_by={group_by!r} needs a 'grounding' list in every predicted row (id {row.get('id')!r})"
            )
        names = kinds if group_by == "grounding" else ["ungrounded" if k == "ungrounded" else "grounded" for k in kinds]
        out.append({**row, GROUP_KEY: names})
    return out


def _cited(row: dict[str, Any], prediction: list[str], paths: list[list[list[str]]]) -> list[list[list[str]]]:
    """Per answer of ``row``, the distinct paths the record cites for the prediction entries behind it: by
    ``prediction_entries`` (the detector's: repeats and other spellings of one node), else by the answer's text."""
    names = row["prediction"].split("\n") if isinstance(row["prediction"], str) else list(row["prediction"])
    behind = row.get("prediction_entries")
    if not (isinstance(behind, list) and len(behind) == len(names)):
        behind = [[k for k, entry in enumerate(prediction) if entry == name] for name in names]
    out = []
    for ks in behind:
        cited: list[list[str]] = []
        for k in ks:
            for p in paths[k] if 0 <= k < len(paths) else []:
                if p not in cited:
                    cited.append(p)
        out.append(cited)
    return out


def _probabilities(scored: ScoredFile) -> torch.Tensor | None:
    """The answers' hallucination probabilities: the rows' ``hallucination_prob`` when every row has them (a
    selection on logits, whose values may all fall in [0, 1] and still be no probabilities), else the scores when
    they are in [0, 1], else ``None``."""
    flat: list[float] = []
    for row, names in zip(scored.rows, scored.names):
        p = row.get("hallucination_prob")
        if not isinstance(p, list) or len(p) != len(names):
            break
        flat += p
    else:
        return torch.tensor(flat, dtype=torch.float64, device="cpu")
    s = scored.answers.scores
    return s if bool(((s >= 0) & (s <= 1)).all()) else None


def _dataset_order(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of every process in dataset order, each question once.

    A distributed sampler without shuffling gives process ``r`` of ``W`` the items ``r, r + W, r + 2W, ...`` and
    pads the last shard with repeats; interleaving the parts restores the order, and a repeat (the same row again)
    is dropped. Two different rows with one id are an error, not a repeat.
    """
    width = len(parts)
    ordered = [
        r for i in range(max((len(p) for p in parts), default=0)) for p in parts[:width] if i < len(p) for r in [p[i]]
    ]
    seen: dict[str, dict[str, Any]] = {}
    for row in ordered:
        key = str(row["id"])
        if key in seen:
            if seen[key] != row:
                raise RuntimeError(f"SelectionCallback: two different predicted rows for question id {row['id']!r}")
            continue
        seen[key] = row
    return list(seen.values())


class SelectionCallback(Callback):
    """Calibrates an answer selector when ``predict`` starts; keeps answers and writes a report when it ends.

    Args:
        output_dir: the folder for ``trusted_answers.jsonl``, ``report.md``, ``report.json``, ``selection.png`` and
            ``reliability.png``, one subfolder per predicted split (``outputs/trust/test/``); ``{split}`` in it
            places the split's name elsewhere (:func:`~kglightning.fileio.split_folder`).
        selector: the rule and its levels (default: ``AnswerSelector(rule="top")``: each question's best answer, FDR
            at 0.1 over questions).
        group_by: ``"grounded"`` (grounded answers and ungrounded ones calibrated apart), ``"grounding"`` (each
            grounding kind apart), ``"record"`` (by ``group_field`` of each question's record) or ``"none"``.
        group_field: with ``group_by="record"``, the record field (dotted for nested values) whose value groups the
            questions: a field of the records' own (``extra``) such as a question type or the LLM that answered.
        calibration_split: the labelled split of the datamodule to calibrate on.
        score: the per-answer score column of ``predict_step``'s rows (higher = more likely hallucinated); the
            detector's logits by default, which rank its answers as its probabilities do, without their ties near 1.
        report_alphas: the levels of the report's sweep (on a labelled predicted split).
    """

    def __init__(
        self,
        output_dir: str = "outputs/trust",
        selector: AnswerSelector | None = None,
        group_by: GroupBy = "grounded",
        group_field: str | None = None,
        calibration_split: str = "validation",
        score: str = "hallucination_logit",
        report_alphas: list[float] | None = None,
    ) -> None:
        super().__init__()
        if group_by not in ("grounded", "grounding", "record", "none"):
            raise ValueError(f"group_by must be 'grounded', 'grounding', 'record' or 'none', got {group_by!r}")
        if (group_by == "record") != (group_field is not None):
            raise ValueError("group_field names the record field to group by, and only with group_by='record'")
        self.group_field = group_field
        self.output_dir = Path(output_dir)
        self.run_dir = split_folder(output_dir, "predict")  # the predicted split's folder, set when predict starts
        self.selector = selector if selector is not None else AnswerSelector(rule="top")
        self.group_by, self.calibration_split, self.score = group_by, calibration_split, score
        self.report_alphas = list(report_alphas) if report_alphas is not None else [0.05, 0.1, 0.15, 0.2, 0.25, 0.3]
        if not all(0.0 < a < 1.0 for a in self.report_alphas):
            raise ValueError(f"report_alphas must lie in (0, 1), got {self.report_alphas}")
        self.calibration: ScoredFile | None = None
        self._rows: list[dict[str, Any]] = []

    def _from_records(self, trainer: L.Trainer, split: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each row with what its record holds: ``cited_paths`` (per answer, the paths the LLM cited for it, when
        the records carry ``prediction_paths``) and, with ``group_by="record"``, its group."""
        dm = trainer.datamodule
        getter = getattr(dm, "records", None) or getattr(dm, "split_records", None)
        if getter is None:
            if self.group_by == "record":
                raise RuntimeError("group_by='record' needs a datamodule with records(split) or split_records(split)")
            return rows
        by_id = {str(r.id): r for r in getter(split)}
        out = []
        for row in rows:
            rec = by_id.get(str(row["id"]))
            if rec is None:
                raise RuntimeError(f"SelectionCallback: no record of the {split!r} split has id {row['id']!r}")
            extra: dict[str, Any] = {}
            if rec.prediction_paths is not None and rec.prediction is not None:
                extra["cited_paths"] = _cited(row, rec.prediction, rec.prediction_paths)
            if self.group_by == "record":
                fields = {"id": rec.id, "question": rec.question, **rec.extra}
                where = f"{split} split, record {rec.id!r}"
                try:
                    value = lookup_key(fields, self.group_field)
                except KeyError:
                    raise RecordError("missing (named by group_field)", source=where, field=self.group_field) from None
                if isinstance(value, (list, dict)) or value is None:
                    raise RecordError(f"expected one string, number or boolean per question, got "
                                      f"{type(value).__name__}", source=where, field=self.group_field)  # fmt: skip
                extra[GROUP_KEY] = value  # one value for the row: the reader spreads it over the answers
            out.append({**row, **extra})
        return out

    def _scored(self, rows: list[dict[str, Any]], source: str) -> ScoredFile:
        group = None if self.group_by == "none" else GROUP_KEY
        return scored_rows(enumerate(_with_groups(rows, self.group_by), 1), source, self.score, group_by=group)

    @torch.no_grad()
    def calibrate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> ScoredFile:
        """Run ``predict_step`` over the calibration split and keep its scored, labelled answers."""
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "split_dataloader"):
            raise RuntimeError("SelectionCallback needs a kglightning datamodule (split_dataloader) to calibrate on")
        was_training = pl_module.training
        pl_module.eval()
        rows: list[dict[str, Any]] = []
        transfer = getattr(
            pl_module, "_apply_batch_transfer_handler", None
        )  # Lightning's own: the hooks, then the move
        try:
            # as Lightning's predict loop runs predict_step: under the precision plugin's context (bf16 autocast),
            # so that calibration and test scores are computed alike
            with trainer.precision_plugin.predict_step_context():
                for i, batch in enumerate(dm.split_dataloader(self.calibration_split)):
                    if transfer is not None:
                        batch = transfer(batch, pl_module.device, 0)
                    else:
                        batch = pl_module.transfer_batch_to_device(batch, pl_module.device, 0)
                    rows += pl_module.predict_step(batch, i)
        finally:
            pl_module.train(was_training)
        rows = self._from_records(trainer, self.calibration_split, rows)
        if not rows:
            raise RuntimeError(
                f"SelectionCallback: the {self.calibration_split!r} split has no question to calibrate on"
            )
        cal = self._scored(rows, f"<{self.calibration_split} split>")
        if not cal.labelled_rows:
            raise RuntimeError(
                f"SelectionCallback: {len(cal.rows)} of {len(cal.rows)} questions of the {self.calibration_split!r} "
                "split have no 'hallucinated' labels from predict_step (no gold answers); calibration needs labelled "
                "questions"
            )
        if not cal.labelled:  # questions without gold answers: left out, one by one, and said so
            unlabelled = [str(r["id"]) for r, ok in zip(cal.rows, cal.row_labelled) if not ok]
            log.warning(
                "SelectionCallback: left %d of %d questions of the %r split out of calibration, which have no "
                "'hallucinated' labels (no gold answers), e.g. id %s; the guarantee is for questions drawn like the "
                "labelled ones", len(unlabelled), len(cal.rows), self.calibration_split, unlabelled[0],
            )  # fmt: skip
            cal = self._scored([r for r, ok in zip(rows, cal.row_labelled) if ok], f"<{self.calibration_split} split>")
        return cal

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        split = predicted_split(trainer)
        self.run_dir = split_folder(self.output_dir, split)
        outputs = [self.run_dir / name for name in OUTPUT_FILES]
        check_apart_from_data(trainer, outputs)
        if trainer.is_global_zero:  # a run that fails before its end leaves none of an earlier run's files behind
            clear_outputs(outputs)
        if split == self.calibration_split:
            log.warning("SelectionCallback: the predicted split is the calibration split (%r): its questions are "
                        "calibrated on and selected on, and the guarantee does not hold for them", self.calibration_split)  # fmt: skip
        self._rows = []
        self.calibration = self.calibrate(trainer, pl_module)
        log.info(
            "SelectionCallback: calibrated on %d answers of %d questions (%s split)",
            len(self.calibration.answers), len(self.calibration.rows), self.calibration_split,
        )  # fmt: skip

    def on_predict_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        self._rows += list(outputs)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        gathered = all_gather_objects(self._rows)  # every process takes part
        self._rows = []
        if trainer.global_rank != 0:
            return
        rows = _dataset_order(gathered)
        if not rows:
            log.warning("SelectionCallback: no predicted question; nothing written")
            return
        rows = self._from_records(trainer, predicted_split(trainer), rows)
        self.write(rows)

    def write(self, rows: list[dict[str, Any]]) -> Path:
        """Select on ``rows`` (predicted questions) with the fitted calibration and write every output.

        Everything is computed first and written after, so that an error leaves no partial output behind."""
        if self.calibration is None:
            raise RuntimeError("SelectionCallback has not calibrated yet (predict must start first)")
        test = self._scored(rows, "<predicted split>")
        s = self.selector
        sel = s.select(self.calibration.answers, test.answers)
        selected = selected_rows(test.rows, test.names, test.answers, sel, s)
        meta: dict[str, Any] = {
            "rule": s.rule, "alpha": s.alpha, "delta": s.delta, "calibration_split": self.calibration_split,
            "questions": len(test.rows), "answers": len(test.answers), "kept": int(sel.keep.sum()),
            "groups": {g: vars(info) for g, info in sel.groups.items()},
        }  # fmt: skip
        lines = [
            f"Rule {s.rule} at alpha {s.alpha:g} (delta {s.delta:g}), calibrated on the {self.calibration_split} split "
            f"({len(self.calibration.rows)} questions); {meta['kept']} of {meta['answers']} answers kept over "
            f"{meta['questions']} questions.",
            "",
            "| group | calibration | too small | test answers | kept |",
            "|---|---:|---|---:|---:|",
            *(f"| {g} | {i.n_calibration} | {'**yes**' if i.too_small else 'no'} | {i.n_test} | {i.n_kept} |"
              for g, i in sel.groups.items()),
            "",
            *([f"**fdr on answer lists**: the questions carry several answers; {CLUSTERED_NOTE}", ""] if any(i.clustered for i in sel.groups.values())
              else []),
        ]  # fmt: skip
        summary: list[dict[str, Any]] | None = None
        if test.labelled:
            t = test.answers
            meta["achieved"] = grouped_selection_metrics(sel.keep, t.hallucinated, t.question, t.group)
            sweep = []
            for alpha in self.report_alphas:
                keep = s.with_alpha(alpha).select(self.calibration.answers, t, False, warn_clustered=False).keep
                metrics = grouped_selection_metrics(keep, t.hallucinated, t.question, t.group)
                sweep += [{"split": 0, "rule": s.rule, "alpha": alpha, "group": g, **m} for g, m in metrics.items()]
            summary = summarize(sweep, s.delta)
        elif test.labelled_rows:
            log.warning(
                "SelectionCallback: %d of %d predicted questions have gold answers, so what the selection achieved is "
                "not reported", test.labelled_rows, len(test.rows),
            )  # fmt: skip
        out = self.run_dir
        out.mkdir(parents=True, exist_ok=True)
        with atomic_write(out / "trusted_answers.jsonl") as f:
            f.writelines(json.dumps(json_number(r), allow_nan=False) + "\n" for r in selected)
        if summary is not None:
            title = "Trusted answers: one calibration, the predicted split, achieved against alpha"
            write_report(summary, out, title, s.delta, **{k: v for k, v in meta.items() if k != "delta"})
            table = report_markdown(summary, title, s.delta)
            write_text_atomic(out / "report.md", "\n".join([f"# {title}", "", *lines, *table.split("\n")[2:]]))
        else:
            write_text_atomic(out / "report.md", "\n".join(["# Trusted answers", "", *lines]))
            write_text_atomic(out / "report.json", json.dumps(json_number(meta), indent=2, allow_nan=False) + "\n")
        from kglightning.metrics.plots import plot_reliability_diagram

        shown, where = (test, "predicted") if test.labelled else (self.calibration, self.calibration_split)
        probs = _probabilities(shown)
        if probs is None:
            log.info("SelectionCallback: the scores are not probabilities and the rows have no hallucination_prob: "
                     "no reliability diagram")  # fmt: skip
        else:
            plot_reliability_diagram(1 - probs, ~shown.answers.hallucinated, out / "reliability.png",
                                     title=f"1 - hallucination probability against being right ({where} split)")  # fmt: skip
        log.info("SelectionCallback: wrote %s (kept %d of %d answers)", out, meta["kept"], meta["answers"])
        return out
