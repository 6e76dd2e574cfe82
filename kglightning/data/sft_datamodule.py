"""LightningDataModule for the DoublyCal proxy's SFT stage (DoublyCal §4.2, App. A.1, App. D.2).

Each record becomes (prompt, completion) pairs. The *evidence* task pairs :func:`~kglightning.evidence.format.sft_input`
with one mined evidence written by :func:`~kglightning.evidence.format.format_evidence` (relations, optional
constraint, Bayesian confidence), one example per evidence, best confidence first. The optional auxiliary *QA* task
(RoG's multi-task setup, which DoublyCal follows) pairs :func:`~kglightning.evidence.format.qa_input` over the
question's grounded shortest paths with :func:`~kglightning.evidence.format.qa_target` of its answers.

Mined evidence is cached on disk per dataset, split, ``max_records`` and builder configuration, so mining (and the
reading of the raw records) happens once. A record without any evidence (no path from a topic entity to an answer
within ``builder.max_hops``) gives no training example: it is counted and logged, never dropped silently.

Prompts are rendered with the tokenizer's chat template (``prompt_style="chat"``) or as the bare instruction and a
newline (``"plain"``). The completion is the target followed by the EOS token. Training batches are right-padded
and their ``labels`` are ``-100`` on prompt and padding tokens, so the loss covers completion tokens only. Predict
batches hold one left-padded prompt per question.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from kglightning.data.cache import default_cache_root
from kglightning.data.sft_examples import (
    IGNORE_INDEX,
    PromptStyle,
    SFTExample,
    SFTStats,
    Split,
    collate_prompts,
    collate_sft,
    mine_row,
    render_prompt,
    row_examples,
    sft_tokenizer,
)
from kglightning.data.sources.loaders import read_records
from kglightning.data.splits import SPLITS, locate_splits
from kglightning.evidence.builder import EvidenceBuilder
from kglightning.evidence.format import sft_input
from kglightning.llm.backends.local_hf import BUNDLED_SMOLLM2

__all__ = [  # the example-level helpers live in kglightning.data.sft_examples and are re-exported here
    "IGNORE_INDEX",
    "ProxySFTDataModule",
    "collate_prompts",
    "collate_sft",
    "mine_row",
    "render_prompt",
    "row_examples",
    "sft_tokenizer",
]


class ProxySFTDataModule(L.LightningDataModule):
    """(prompt, completion) batches for the proxy's SFT, mined from KGQA records.

    Args:
        tokenizer: the model whose tokenizer is used (a folder, a ``.gguf`` file, or ``"bundled:smollm2"``); the
            CLI links it to ``model.init_args.model``.
        gguf_file: GGUF file name inside the ``tokenizer`` folder (not linked; a ``.gguf`` path needs none).
        data_dir: dataset folder (see :func:`~kglightning.data.splits.locate_splits`) or ``None`` for the embedded
            benchmark.
        builder: mines and scores the evidence (default: :class:`EvidenceBuilder` with the paper's settings).
        max_evidence: evidence examples per question, best confidence first (``None``: all).
        qa_task: add RoG's auxiliary QA example per question.
        qa_max_paths: grounded paths in a QA input.
        digits: decimals of the confidence in targets.
        prompt_style: ``"chat"`` (the tokenizer's chat template) or ``"plain"`` (see :func:`render_prompt`).
        system_prompt: system turn of chat prompts; ``None`` leaves the template's default.
        max_length: longest prompt + completion in tokens; longer training examples are dropped (counted).
        batch_size: examples (or questions, for predict) per batch.
        num_workers: DataLoader workers.
        max_records: read at most this many records per split.
        on_bad_record: ``"raise"`` on the first invalid record, or ``"skip"`` it (counted and logged).
        predict_split: the split whose questions ``predict`` serves.
        benchmark_seed: seed of the embedded benchmark.
        cache_dir: cache root for the benchmark and the mined evidence (default ``$KGLIGHTNING_CACHE``).
    """

    def __init__(
        self,
        tokenizer: str = BUNDLED_SMOLLM2,
        gguf_file: str | None = None,
        data_dir: str | None = None,
        builder: EvidenceBuilder | None = None,
        max_evidence: int | None = 3,
        qa_task: bool = True,
        qa_max_paths: int = 5,
        digits: int = 2,
        prompt_style: PromptStyle = "chat",
        system_prompt: str | None = None,
        max_length: int = 256,
        batch_size: int = 8,
        num_workers: int = 0,
        max_records: int | None = None,
        on_bad_record: Literal["raise", "skip"] = "raise",
        predict_split: Split = "test",
        benchmark_seed: int = 0,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        if max_evidence is not None and max_evidence < 1:
            raise ValueError(f"max_evidence must be >= 1 or None, got {max_evidence}")
        self.tokenizer_name = tokenizer
        self.gguf_file = gguf_file
        self.data_dir = data_dir
        self.builder = builder or EvidenceBuilder()
        self.max_evidence = max_evidence
        self.qa_task = qa_task
        self.qa_max_paths = qa_max_paths
        self.digits = digits
        self.prompt_style = prompt_style
        self.system_prompt = system_prompt
        self.max_length = max_length
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.max_records = max_records
        self.on_bad_record = on_bad_record
        self.predict_split = predict_split
        self.benchmark_seed = benchmark_seed
        self.cache_root = Path(cache_dir) if cache_dir is not None else default_cache_root()
        self.datasets: dict[str, list[dict[str, Any]]] = {}
        self.stats: dict[str, SFTStats] = {}
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, loaded on first use."""
        if self._tokenizer is None:
            self._tokenizer = sft_tokenizer(self.tokenizer_name, self.gguf_file)
        return self._tokenizer

    def _files(self) -> dict[str, tuple[str, str | None]]:
        return locate_splits(self.data_dir, self.benchmark_seed, str(self.cache_root))

    def cache_path(self, split: str) -> Path:
        """The jsonl of mined rows of ``split``, keyed by dataset, split, ``max_records`` and builder config."""
        path, name = self._files()[split]
        if self.data_dir is None:
            ident = f"embedded-seed{self.benchmark_seed}:{Path(path).parent.name}:{Path(path).name}"
        else:
            p = Path(path)
            stamp = f"{p.stat().st_size}-{p.stat().st_mtime_ns}" if p.is_file() else ""
            ident = f"{p.resolve() if p.exists() else path}:{name}:{stamp}"
        data_key = hashlib.sha1(f"{ident}:{self.max_records}:{self.on_bad_record}".encode()).hexdigest()[:12]
        config = {k: v for k, v in sorted(vars(self.builder).items()) if not k.startswith("_")}
        config.update(builder=type(self.builder).__qualname__, qa_max_paths=self.qa_max_paths)
        builder_key = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
        return self.cache_root / "proxy_sft" / data_key / builder_key / f"{split}.jsonl"

    def rows(self, split: str) -> list[dict[str, Any]]:
        """The mined rows of ``split`` (see :func:`mine_row`), from the cache or mined now and cached."""
        cache = self.cache_path(split)
        if cache.exists():
            with cache.open(encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        path, name = self._files()[split]
        records = read_records(path, split=name, on_bad_record=self.on_bad_record, limit=self.max_records)
        rank_zero_info(f"mining evidence for {len(records)} {split} questions")
        rows = [mine_row(r, self.builder, self.qa_max_paths) for r in records]
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        with tmp.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        tmp.replace(cache)
        return rows

    def prepare_data(self) -> None:
        """Build the benchmark and mine every split once (rank 0 only under DDP)."""
        for split in SPLITS:
            self.rows(split)

    def _prompt_ids(self, instruction: str) -> list[int]:
        text = render_prompt(self.tokenizer, instruction, self.prompt_style, self.system_prompt)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode(self, example: SFTExample, prompt_ids: list[int] | None = None) -> dict[str, Any]:
        """Token ids of one example: ``input_ids`` (prompt, target, EOS) and ``prompt_len``.

        Args:
            example: the example.
            prompt_ids: the rendered prompt's ids, when already known (examples of one question share them).
        """
        prompt = self._prompt_ids(example.instruction) if prompt_ids is None else prompt_ids
        target = self.tokenizer(example.target, add_special_tokens=False)["input_ids"]
        ids = prompt + target + [self.tokenizer.eos_token_id]
        return {"input_ids": ids, "prompt_len": len(prompt), "task": example.task, "id": example.qid}

    def build_split(self, split: str) -> tuple[list[dict[str, Any]], SFTStats]:
        """Tokenized training examples of ``split`` and what became of its records."""
        rows = self.rows(split)
        stats = SFTStats(records=len(rows))
        items = []
        for row in rows:
            if not row["evidence"]:
                stats.without_evidence.append(row["id"])
                continue
            evidence_prompt = self._prompt_ids(sft_input(row["question"]))
            for example in row_examples(row, self.max_evidence, self.qa_task, self.digits):
                item = self.encode(example, evidence_prompt if example.task == "evidence" else None)
                if len(item["input_ids"]) > self.max_length:
                    stats.too_long += 1
                    continue
                items.append(item)
                stats.evidence_examples += example.task == "evidence"
                stats.qa_examples += example.task == "qa"
        return items, stats

    def predict_items(self, split: str) -> list[dict[str, Any]]:
        """One prompt per question of ``split`` (every record, with or without mined evidence)."""
        rows = self.rows(split)
        keep = ("id", "question", "answer")
        return [{"prompt_ids": self._prompt_ids(sft_input(r["question"])), **{k: r[k] for k in keep}} for r in rows]

    def setup(self, stage: str | None = None) -> None:
        wanted = {"fit": ["train", "validation"], "validate": ["validation"], "test": ["test"]}.get(stage or "", [])
        if stage == "predict" and f"predict:{self.predict_split}" not in self.datasets:
            self.datasets[f"predict:{self.predict_split}"] = self.predict_items(self.predict_split)
        for split in wanted:
            if split in self.datasets:
                continue
            items, stats = self.build_split(split)
            self.datasets[split], self.stats[split] = items, stats
            rank_zero_info(stats.summary(split))
            if stats.without_evidence:
                rank_zero_warn(
                    f"{split}: skipped {len(stats.without_evidence)} of {stats.records} records without evidence (no "
                    f"path from a topic entity to an answer within {self.builder.max_hops} hops), e.g. "
                    f"{stats.without_evidence[:3]}"
                )
            if not items:
                raise ValueError(f"split {split!r} gives no SFT example: {stats.summary(split)}")

    def _loader(self, key: str, collate: Any, shuffle: bool = False) -> DataLoader:
        if key not in self.datasets:
            self.setup({"train": "fit", "validation": "fit", "test": "test"}.get(key, "predict"))
        return DataLoader(
            self.datasets[key],
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=functools.partial(collate, pad_id=self.tokenizer.pad_token_id),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", collate_sft, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", collate_sft)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", collate_sft)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(f"predict:{self.predict_split}", collate_prompts)
