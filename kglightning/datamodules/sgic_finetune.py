"""SGIC's uncertainty-aware fine-tuning set (SGIC §3.3), built with the base model, written as inspectable jsonl."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from lightning.pytorch.utilities import rank_zero_info

from kglightning.data.text import neutralize_special_tokens, tokenizer_special_tokens
from kglightning.datamodules.sft_examples import IGNORE_INDEX, _pad, collate_prompts, sft_tokenizer
from kglightning.datamodules.sgic import SGICDataModule
from kglightning.fileio import atomic_write, write_text_atomic
from kglightning.llm.backends.local_hf import BUNDLED_SMOLLM2, LocalHFBackend
from kglightning.llm.sgic_rounds import SelfCalibration, split_mean

__all__ = ["SGICFinetuneDataModule"]

#: the version of the set's records (part of each split's key)
SET_FORMAT = 2


class SGICFinetuneDataModule(SGICDataModule):
    """Prompt/target pairs of SGIC's self-calibration set, for :class:`~kglightning.modules.SGICCalibrator`.

    ``prepare_data`` runs the rounds of ``calibration`` on each split's questions (documents as in
    :class:`SGICDataModule`) and writes ``<dataset_dir>/<split>.jsonl``: one record per kept or calibrated
    question with its ``messages`` (the Table 1 prompt), ``target``, ``kind``, ``correct_round`` and the whole
    ``history`` of answers and uncertainties (see :meth:`~kglightning.llm.sgic_rounds.SelfCalibration.training_records`),
    plus ``<split>.stats.json`` (counts, ``s̄``). A later run with the same data and settings reads the files back.

    Args:
        calibration: the rounds that build the set (default: 5 rounds of the model named by ``tokenizer``, the one
            being fine-tuned, as the paper does).
        tokenizer: the fine-tuned model, whose tokenizer and chat template render the prompts (the CLI links it to
            ``model.init_args.model``).
        gguf_file: its GGUF file name, if any.
        answer_mean: ``s̄`` of Eq. 2; ``None`` = each split's mean round-0 confidence.
        target: ``"answer"`` (the model's own correct answer) or ``"gold"`` (the first accepted answer).
        max_length: longer prompt + target sequences are dropped (counted).
        dataset_dir: where the set is written.
        batch_size: examples per training batch (the paper: 16).
        **kwargs: :class:`SGICDataModule`'s arguments (``source``, ``documents``, ``data_dir``, ``max_records``...).
    """

    #: fit builds the sets of train and validation only (building one costs LLM rounds over the split)
    prepare_splits: ClassVar[dict[str, tuple[str, ...] | None]] = {
        "fit": ("train", "validation"),
        "validate": ("validation",),
        "test": ("test",),
        "predict": None,
    }

    def __init__(
        self,
        calibration: SelfCalibration | None = None,
        tokenizer: str = BUNDLED_SMOLLM2,
        gguf_file: str | None = None,
        answer_mean: float | None = None,
        target: Literal["answer", "gold"] = "answer",
        max_length: int = 1024,
        dataset_dir: str = "outputs/sgic_finetune/dataset",
        batch_size: int = 16,
        **kwargs: Any,
    ) -> None:
        super().__init__(batch_size=batch_size, **kwargs)
        if target not in ("answer", "gold"):
            raise ValueError(f"target must be 'answer' or 'gold', got {target!r}")
        if answer_mean is not None and not 0 < answer_mean < 1:
            raise ValueError(f"answer_mean must be in (0, 1), got {answer_mean}")
        self.calibration = calibration
        self.model_name = tokenizer
        self.gguf_file = gguf_file
        self.answer_mean = answer_mean
        self.target = target
        self.max_length = max_length
        self.dataset_dir = Path(dataset_dir)
        self._tokenizer: Any = None
        self.dropped_too_long: dict[str, int] = {}

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = sft_tokenizer(self.model_name, self.gguf_file)
        return self._tokenizer

    def engine(self) -> SelfCalibration:
        if self.calibration is None:
            self.calibration = SelfCalibration(LocalHFBackend(self.model_name, self.gguf_file, batch_size=16))
        return self.calibration

    def _key(self, split: str) -> str:
        e = self.engine()
        estimator = [
            f"{type(e.estimator).__module__}.{type(e.estimator).__qualname__}",
            sorted(vars(e.estimator).items()),
        ]
        parts = [self.dataset_key(split), self.source, e.backend.cache_key, e.rounds, e.prompt.cache_key]
        parts += [estimator, e.params.to_dict(), self.answer_mean, self.target, e.correct_if]
        parts += [self.documents.cache_key if self.documents is not None else None, SET_FORMAT]
        return hashlib.sha1(json.dumps(parts, default=str).encode()).hexdigest()[:16]

    def dataset_path(self, split: str) -> Path:
        """The set's jsonl file for ``split``."""
        return self.dataset_dir / f"{split}.jsonl"

    def prepare_split(self, split: str) -> None:
        path, stats_path = self.dataset_path(split), self.dataset_dir / f"{split}.stats.json"
        key = self._key(split)
        if path.is_file() and stats_path.is_file() and json.loads(stats_path.read_text()).get("key") == key:
            rank_zero_info(f"SGIC {split} set: reusing {path}")
            return
        examples = list(super().build_split(split))
        engine = self.engine()
        mean = self.answer_mean
        if mean is None:
            total, count = engine.mean_confidence(examples, self.batch_size, ("build",))
            mean = split_mean(total, count)
        records, counts = [], {"kept": 0, "calibrated": 0, "dropped": 0}
        for start in range(0, len(examples), self.batch_size):
            got, c = engine.training_records(examples[start : start + self.batch_size], mean, self.target)
            records += got
            counts = {k: counts[k] + c[k] for k in counts}
        self.dataset_dir.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        stats = {"key": key, "questions": len(examples), **counts, "answer_mean": mean}
        write_text_atomic(stats_path, json.dumps(stats, indent=2) + "\n")
        rank_zero_info(
            f"SGIC {split} set: {counts['kept']} kept (right at round 0), {counts['calibrated']} calibrated, "
            f"{counts['dropped']} dropped (still wrong after {engine.rounds} rounds) of {len(examples)} -> {path}"
        )

    def encode(self, record: dict[str, Any]) -> dict[str, Any]:
        """Token ids of one record: the chat-templated prompt, the target and EOS.

        Special-token strings in the messages (a passage may hold one) are broken up as at inference
        (:meth:`~kglightning.llm.backends.base.LLMBackend.as_text`), so training and inference see the same text.
        """
        tok = self.tokenizer
        specials = tokenizer_special_tokens(tok)
        messages = [{**m, "content": neutralize_special_tokens(m["content"], specials)} for m in record["messages"]]
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        target = tok(record["target"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return {
            "input_ids": prompt_ids + target,
            "prompt_len": len(prompt_ids),
            "id": record["id"],
            "target": record["target"],
        }

    def build_split(self, split: str) -> list[dict[str, Any]]:
        path = self.dataset_path(split)
        self.prepare_split(split)  # reuses the file only when its key is this configuration's
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        items = [self.encode(r) for r in records]
        kept = [it for it in items if len(it["input_ids"]) <= self.max_length]
        self.dropped_too_long[split] = len(items) - len(kept)
        if self.dropped_too_long[split]:
            rank_zero_info(f"SGIC {split} set: {self.dropped_too_long[split]} examples over max_length dropped")
        if not kept:
            raise ValueError(
                f"the SGIC {split} set {path} has no example (see {split}.stats.json): no question was answered "
                "correctly within the rounds, or every example was over max_length. A model that answers in "
                "sentences never scores an exact match; try --data.init_args.calibration.init_args.correct_if hit"
            )
        return kept

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        pad = self.tokenizer.pad_token_id
        ids = [it["input_ids"] for it in items]
        labels = [[IGNORE_INDEX] * it["prompt_len"] + it["input_ids"][it["prompt_len"] :] for it in items]
        prompts = [{"prompt_ids": it["input_ids"][: it["prompt_len"]], "id": it["id"], "question": ""} for it in items]
        return {
            "input_ids": _pad(ids, pad, left=False),
            "attention_mask": _pad([[1] * len(x) for x in ids], 0, left=False),
            "labels": _pad(labels, IGNORE_INDEX, left=False),
            "prompt": collate_prompts(prompts, pad),
            "target": [it["target"] for it in items],
        }
