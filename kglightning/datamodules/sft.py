"""LightningDataModule for the DoublyCal proxy's SFT stage (DoublyCal §4.2, App. A.1, App. D.2).

Each record becomes (prompt, completion) pairs. The *evidence* task pairs the evidence instruction (App. A.1's
:func:`~kglightning.evidence.format.sft_input` unless ``prompt_format.instruction`` says ``rl``) with one mined
evidence written by :func:`~kglightning.evidence.format.format_evidence` (relations, optional constraint, Bayesian
confidence), one example per evidence, best confidence first. The optional auxiliary *QA* task
(RoG's multi-task setup, which DoublyCal follows) pairs :func:`~kglightning.evidence.format.qa_input` over the
question's grounded shortest paths with :func:`~kglightning.evidence.format.qa_target` of its answers.

Mined evidence is cached on disk per dataset, split, ``max_records`` and builder configuration, so mining (and the
reading of the raw records) happens once. A record without any evidence (no path from a topic entity to an answer
within ``builder.max_hops``) gives no training example: it is counted and logged, never dropped silently.

Prompts are rendered as the :class:`ProxyPrompt` says: with the tokenizer's chat template (``style: chat``) or as the
bare instruction and a newline (``"plain"``). The completion is the target followed by the EOS token. Training batches are right-padded
and their ``labels`` are ``-100`` on prompt and padding tokens, so the loss covers completion tokens only. Predict
batches hold one left-padded prompt per question.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from kglightning.data.records import VALIDATION_VERSION
from kglightning.data.relation_pairs import PROGRESS_MIN_RECORDS
from kglightning.data.store.stage_map import cached_map, stage_state, stored_map
from kglightning.datamodules.base import KGQADataModule
from kglightning.datamodules.sft_examples import (
    IGNORE_INDEX,
    ProxyPrompt,
    SFTExample,
    SFTStats,
    collate_prompts,
    collate_sft,
    mine_row,
    render_prompt,
    row_examples,
    sft_tokenizer,
)
from kglightning.evidence.builder import EvidenceBuilder
from kglightning.evidence.format import ConfidencePosition
from kglightning.llm.backends.local_hf import BUNDLED_SMOLLM2

__all__ = [  # the example-level helpers live in kglightning.datamodules.sft_examples and are re-exported here
    "IGNORE_INDEX",
    "ProxyPrompt",
    "ProxySFTDataModule",
    "collate_prompts",
    "collate_sft",
    "mine_row",
    "render_prompt",
    "row_examples",
    "sft_tokenizer",
]


MINE_CHUNK = 64  # questions per call of the mining map step
#: part of the mined rows' cache key: raise it when :func:`mine_row`'s rows change (the records' own reading is
#: covered by :data:`~kglightning.data.records.VALIDATION_VERSION`, the files by ``dataset_key``)
MINE_VERSION = 2


class ProxySFTDataModule(KGQADataModule):
    """(prompt, completion) batches for the proxy's SFT, mined from KGQA records.

    Args:
        tokenizer: the model whose tokenizer is used (a folder, a ``.gguf`` file, or ``"bundled:smollm2"``); the
            CLI links it to ``model.init_args.model``.
        gguf_file: GGUF file name inside the ``tokenizer`` folder (not linked; a ``.gguf`` path needs none).
        builder: mines and scores the evidence (default: :class:`EvidenceBuilder` with the paper's settings).
        max_evidence: evidence examples per question, best confidence first (``None``: all).
        qa_task: add RoG's auxiliary QA example per question.
        qa_max_paths: grounded paths in a QA input.
        digits: decimals of the confidence in targets.
        confidence_position: where targets write the confidence: ``"open"``, in the opening tag as in the paper, or
            ``"after"`` the path, in a trailing ``<CONFIDENCE>`` element, so that the model states it conditioned on
            the evidence it has written (:mod:`kglightning.evidence.format`).
        prompt_format: how prompts are rendered (:class:`ProxyPrompt`: chat template or plain text, system turn);
            the CLI links it from ``model.init_args.prompt_format``, so that the proxy generates from the prompts
            it was trained on.
        max_length: longest prompt + completion in tokens; longer training examples are dropped (counted).
        batch_size: examples (or questions, for predict) per batch.
        mine_workers: processes that mine the evidence (a cached ``datasets`` map with ``num_proc``; the cached
            rows are the same for any number, and a stopped run resumes).
        **kwargs: the record-reading arguments of :class:`~kglightning.datamodules.KGQADataModule` (``data_dir``,
            ``max_records``, ``on_bad_record``, ``predict_split``, ``cache_dir``, ...); the cache also holds the mined
            evidence.
    """

    def __init__(
        self,
        tokenizer: str = BUNDLED_SMOLLM2,
        gguf_file: str | None = None,
        builder: EvidenceBuilder | None = None,
        max_evidence: int | None = 3,
        qa_task: bool = True,
        qa_max_paths: int = 5,
        digits: int = 2,
        confidence_position: ConfidencePosition = "open",
        prompt_format: ProxyPrompt = ProxyPrompt(),
        max_length: int = 256,
        batch_size: int = 8,
        mine_workers: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(batch_size=batch_size, **kwargs)
        if mine_workers < 1:
            raise ValueError(f"mine_workers must be >= 1, got {mine_workers}")
        self.mine_workers = mine_workers
        if max_evidence is not None and max_evidence < 1:
            raise ValueError(f"max_evidence must be >= 1 or None, got {max_evidence}")
        self.tokenizer_name = tokenizer
        self.gguf_file = gguf_file
        self.builder = builder or EvidenceBuilder()
        self.max_evidence = max_evidence
        self.qa_task = qa_task
        self.qa_max_paths = qa_max_paths
        self.digits = digits
        if confidence_position not in ("open", "after"):
            raise ValueError(f"confidence_position must be 'open' or 'after', got {confidence_position!r}")
        self.confidence_position = confidence_position
        self.prompt_format = prompt_format
        self.max_length = max_length
        self.stats: dict[str, SFTStats] = {}
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, loaded on first use."""
        if self._tokenizer is None:
            self._tokenizer = sft_tokenizer(self.tokenizer_name, self.gguf_file)
        return self._tokenizer

    def cache_path(self, split: str) -> Path:
        """The folder of ``split``'s mined rows, keyed by :meth:`dataset_key`, the builder configuration,
        :data:`MINE_VERSION` and the records' :data:`~kglightning.data.records.VALIDATION_VERSION`."""
        config = {k: v for k, v in sorted(vars(self.builder).items()) if not k.startswith("_")}
        config.update(builder=type(self.builder).__qualname__, qa_max_paths=self.qa_max_paths, rows=MINE_VERSION,
                      validation=VALIDATION_VERSION)  # fmt: skip
        builder_key = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
        return self.cache_root / "proxy_sft" / self.dataset_key(split) / builder_key / split

    def rows(self, split: str) -> list[dict[str, Any]]:
        """The mined rows of ``split`` (see :func:`mine_row`): a cached ``datasets`` map over its questions
        (:func:`~kglightning.data.store.stage_map.cached_map`, ``mine_workers`` processes), kept in :meth:`cache_path`; a
        run stopped part-way mines only the questions it had not finished, and a rerun reads them all (without
        reading the split's records, once every piece is stored)."""
        import datasets

        folder = self.cache_path(split)  # once: its dataset key stats the files (or opens a hub dataset)
        done = stored_map(folder)  # a finished map is read without reading the records
        if done is not None:
            return [json.loads(text) for text in done["row"]]
        records = self.read_split(split)
        rank_zero_info(f"evidence of {len(records)} {split} questions: {folder}")
        questions = datasets.Dataset.from_dict({"index": list(range(len(records)))})
        out = cached_map(
            questions, _mine_batch, datasets.Features({"row": datasets.Value("large_string")}), folder,
            state=(records, self.builder, self.qa_max_paths), workers=self.mine_workers, batch_size=MINE_CHUNK,
            desc=f"mining {split} evidence", progress=len(records) >= PROGRESS_MIN_RECORDS,
        )  # fmt: skip
        return [json.loads(text) for text in out["row"]]

    def prepare_split(self, split: str) -> None:
        """Mine ``split``'s evidence once (cached)."""
        self.rows(split)

    def _prompt_ids(self, instruction: str) -> list[int]:
        text = self.prompt_format.render(self.tokenizer, instruction)
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

    def examples(self, split: str) -> tuple[list[dict[str, Any]], SFTStats]:
        """Tokenized training examples of ``split`` and what became of its records."""
        rows = self.rows(split)
        stats = SFTStats(records=len(rows))
        items = []
        for row in rows:
            if not row["evidence"]:
                stats.without_evidence.append(row["id"])
                continue
            evidence_prompt = self._prompt_ids(self.prompt_format.evidence_instruction(row["question"]))
            made = row_examples(
                row, self.max_evidence, self.qa_task, self.digits, self.confidence_position, stats.unwritable
            )
            for example in made:
                item = self.encode(example, evidence_prompt if example.task == "evidence" else None)
                if len(item["input_ids"]) > self.max_length:
                    stats.too_long += 1
                    continue
                items.append(item)
                stats.evidence_examples += example.task == "evidence"
                stats.qa_examples += example.task == "qa"
        return items, stats

    def build_predict(self, split: str) -> list[dict[str, Any]]:
        """One prompt per question of ``split`` (every record, with or without mined evidence)."""
        rows = self.rows(split)
        keep = ("id", "question", "answer")
        return [
            {
                "prompt_ids": self._prompt_ids(self.prompt_format.evidence_instruction(r["question"])),
                **{k: r[k] for k in keep},
            }
            for r in rows
        ]

    def build_split(self, split: str) -> list[dict[str, Any]]:
        items, stats = self.examples(split)
        self.stats[split] = stats
        rank_zero_info(stats.summary(split))
        if stats.without_evidence:
            rank_zero_warn(
                f"{split}: skipped {len(stats.without_evidence)} of {stats.records} records without evidence (no "
                f"path from a topic entity to an answer within {self.builder.max_hops} hops), e.g. "
                f"{stats.without_evidence[:3]}"
            )
        if stats.unwritable:
            rank_zero_warn(f"{split}: dropped {len(stats.unwritable)} evidence, e.g. {stats.unwritable[:3]}")
        if not items:
            raise ValueError(f"split {split!r} gives no SFT example: {stats.summary(split)}")
        return items

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return collate_sft(items, pad_id=self.tokenizer.pad_token_id)

    def collate_predict(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return collate_prompts(items, pad_id=self.tokenizer.pad_token_id)


def _mine_batch(batch: dict[str, list]) -> dict[str, list]:
    """The map step of :meth:`ProxySFTDataModule.rows`: :func:`mine_row` of each question, as JSON."""
    records, builder, qa_max_paths = stage_state()
    return {"row": [json.dumps(mine_row(records[i], builder, qa_max_paths)) for i in batch["index"]]}
