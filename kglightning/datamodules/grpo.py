"""LightningDataModule for the DoublyCal proxy's RL stage (DoublyCal §4.2, App. A.2, App. B.2).

Each question with mined evidence becomes one *prompt item*: the rendered evidence prompt (``ProxyPrompt``; the RL
stage uses App. A.2's instruction, ``instruction: rl``) and the reward's targets, ``gold_evidence``: one
:func:`~kglightning.evidence.rewards.gold_target` per mined evidence (items, Bayesian confidence, answer F1), so that
:class:`~kglightning.evidence.rewards.EvidenceReward` can take the max over all of them. With ``trie`` set, every item
also gets its question's :class:`~kglightning.llm.trie.KGTrie`, and the policy's rollouts are decoded through it
(every ``<PATH>`` block walkable in the question's graph). Tries are built when a batch is collated (in the
DataLoader's workers, when it has any) and the last ``trie_cache`` of them kept, so memory does not grow with the
number of questions and no process builds the tries of questions it never serves.

A question without mined evidence has nothing to reward against: it is skipped, counted and logged. The evidence
mining is :class:`~kglightning.datamodules.ProxySFTDataModule`'s, cached the same way (an SFT run on the same data
and builder has already mined it).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from kglightning.data.records import KGQARecord
from kglightning.datamodules.sft import ProxySFTDataModule
from kglightning.datamodules.sft_examples import ProxyPrompt, collate_prompts
from kglightning.evidence.rewards import gold_target
from kglightning.evidence.schema import Evidence
from kglightning.llm.trie import KGTrie, TrieConfig

__all__ = ["GRPOStats", "ProxyGRPODataModule"]


@dataclass
class GRPOStats:
    """What one split turned into: records, records without evidence (skipped), prompts too long (dropped)."""

    records: int = 0
    without_evidence: list[str] = field(default_factory=list)
    too_long: list[str] = field(default_factory=list)

    @property
    def prompts(self) -> int:
        """Prompt items built."""
        return self.records - len(self.without_evidence) - len(self.too_long)

    def summary(self, split: str) -> str:
        """One line for the log.

        Example:
            >>> GRPOStats(10, ["q3"], []).summary("train")
            'train: 10 records, 9 prompts, 1 without evidence (skipped), 0 prompts longer than max_length (dropped)'
        """
        return (
            f"{split}: {self.records} records, {self.prompts} prompts, {len(self.without_evidence)} without evidence "
            f"(skipped), {len(self.too_long)} prompts longer than max_length (dropped)"
        )


class ProxyGRPODataModule(ProxySFTDataModule):
    """Prompt batches with the reward's gold evidence, for :class:`~kglightning.modules.ProxyGRPO`.

    A batch holds left-padded ``input_ids``/``attention_mask`` of ``batch_size`` prompts, their ``id``, ``question``
    and ``answer``, ``gold_evidence`` (a list of :func:`~kglightning.evidence.rewards.gold_target` dicts per prompt)
    and ``tries`` (one KG-Trie per prompt, or ``None``). Every column other than the tensors and ``tries`` reaches
    the reward functions as a keyword argument, one value per completion, as in TRL.

    Args:
        trie: build each question's KG-Trie with these settings, so that rollouts stay walkable (``None``: free
            sampling).
        prompt_format: how prompts are rendered; default App. A.2's RL instruction in the chat template (the CLI
            links it from ``model.init_args.prompt_format``).
        max_length: longest prompt in tokens; a longer one is dropped (counted and logged).
        trie_cache: KG-Tries kept per process, most recently used first (each is built again when evicted).
        **kwargs: :class:`~kglightning.datamodules.ProxySFTDataModule`'s arguments (``tokenizer``, ``builder``,
            ``batch_size``, ``data_dir``, ``max_records``, ...); ``max_evidence``, ``qa_task`` and ``digits`` do not
            apply here.

    Example:
        >>> ProxyGRPODataModule(max_length=0)
        Traceback (most recent call last):
        ...
        ValueError: max_length must be >= 1, got 0
    """

    def __init__(
        self,
        trie: TrieConfig | None = None,
        prompt_format: ProxyPrompt = ProxyPrompt(instruction="rl"),
        max_length: int = 256,
        trie_cache: int = 256,
        **kwargs: Any,
    ) -> None:
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        if trie_cache < 0:
            raise ValueError(f"trie_cache must be >= 0, got {trie_cache}")
        super().__init__(prompt_format=prompt_format, max_length=max_length, **kwargs)
        self.trie = trie
        self.trie_cache = trie_cache
        self._tries: OrderedDict[tuple[str, int], tuple[Any, KGTrie]] = OrderedDict()
        self.grpo_stats: dict[str, GRPOStats] = {}

    def gold_evidence(self, split: str) -> dict[str, list[dict[str, Any]]]:
        """The reward's targets per question id of ``split``: one :func:`gold_target` per mined evidence (``[]``
        for a question without any)."""
        records = {r.id: r for r in self.read_split(split)}
        return {
            row["id"]: [
                gold_target(Evidence.from_dict(z), len(dict.fromkeys(records[row["id"]].a_entity)))
                for z in row["evidence"]
            ]
            for row in self.rows(split)
        }

    def build_split(self, split: str) -> list[dict[str, Any]]:
        rows = self.rows(split)
        records = {r.id: r for r in self.read_split(split)}
        gold = self.gold_evidence(split)
        stats = GRPOStats(records=len(rows))
        items = []
        for row in rows:
            if not row["evidence"]:
                stats.without_evidence.append(row["id"])
                continue
            ids = self._prompt_ids(self.prompt_format.evidence_instruction(row["question"]))
            if len(ids) > self.max_length:
                stats.too_long.append(row["id"])
                continue
            record = records[row["id"]]
            item = {
                "prompt_ids": ids,
                "id": row["id"],
                "question": row["question"],
                "answer": row["answer"],
                "gold_evidence": gold[row["id"]],
            }
            if self.trie is not None:
                item["trie_record"] = record  # its trie is built when a batch is collated
            items.append(item)
        self.grpo_stats[split] = stats
        rank_zero_info(stats.summary(split))
        if stats.without_evidence:
            rank_zero_warn(
                f"{split}: skipped {len(stats.without_evidence)} of {stats.records} questions without evidence to "
                f"reward against (no path from a topic entity to an answer within {self.builder.max_hops} hops), "
                f"e.g. {stats.without_evidence[:3]}"
            )
        if stats.too_long:
            rank_zero_warn(f"{split}: dropped {len(stats.too_long)} prompts over {self.max_length} tokens")
        if not items:
            raise ValueError(f"split {split!r} gives no GRPO prompt: {stats.summary(split)}")
        return items

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        batch = collate_prompts(items, pad_id=self.tokenizer.pad_token_id)
        batch["gold_evidence"] = [it["gold_evidence"] for it in items]
        batch["tries"] = self._batch_tries(items)
        return batch

    def build_predict(self, split: str) -> list[dict[str, Any]]:
        """One prompt per question (as for SFT), with its KG-Trie when ``trie`` is set: ``predict`` and
        ``compare-proxies`` then decode through it, like the rollouts."""
        items = super().build_predict(split)
        if self.trie is not None:
            records = {r.id: r for r in self.read_split(split)}
            for item in items:
                item["trie_record"] = records[item["id"]]
        return items

    def collate_predict(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().collate_predict(items)
        batch["tries"] = self._batch_tries(items)
        return batch

    def _batch_tries(self, items: list[dict[str, Any]]) -> list[KGTrie] | None:
        """The batch's KG-Tries (``None`` when its items have none)."""
        if not items or "trie_record" not in items[0]:
            return None
        return [self._trie(it["trie_record"]) for it in items]

    def _trie(self, record: KGQARecord) -> KGTrie:
        """The record's KG-Trie, from the cache of the last ``trie_cache`` ones, else built (and cached)."""
        assert self.trie is not None
        key = (record.id, id(record.graph))  # the graph object: a record of another split may share the id
        hit = self._tries.get(key)
        if hit is not None and hit[0] is record.graph:  # the very graph (an id can be reused once one is freed)
            self._tries.move_to_end(key)
            return hit[1]
        trie = self.trie.build(self.tokenizer, self.builder.index(record), record.q_entity)
        if self.trie_cache:
            self._tries[key] = (record.graph, trie)
            while len(self._tries) > self.trie_cache:
                self._tries.popitem(last=False)
        return trie
        trie = self.trie.build(self.tokenizer, self.builder.index(record), record.q_entity)
        if self.trie_cache:
            self._tries[key] = trie
            while len(self._tries) > self.trie_cache:
                self._tries.popitem(last=False)
        return trie
