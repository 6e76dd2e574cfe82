"""The DoublyCal reasoning proxy, RL stage: GRPO on the LoRA adapter with a calibration-aware reward (§4.2, App. B.2).

Per training batch of prompts (:class:`~kglightning.datamodules.ProxyGRPODataModule`), :class:`ProxyGRPO`

1. samples ``num_generations`` completions per prompt from the current policy (``temperature``, ``top_p``;
   through each question's KG-Trie when the batch carries ``tries``);
2. scores them with every reward function (TRL's signature ``f(prompts=, completions=, completion_ids=, **columns)
   -> list[float | None]``; the batch's other columns, e.g. ``gold_evidence``, arrive one value per completion) and
   sums them with ``reward_weights``;
3. turns the rewards into group-relative advantages and minimises the clipped GRPO objective with a KL penalty
   ``beta`` to the reference policy (:mod:`kglightning.modules.grpo_objective`).

The reference policy is the SFT proxy: the base model with the SFT adapter (``adapter_path``) loaded a second time as
a frozen PEFT adapter named ``"reference"``, so there is one copy of the base weights; reference log-probabilities
come from the same model with ``adapter_names=["reference", ...]``. Without ``adapter_path`` the policy starts from a
fresh adapter and the reference is the base model (adapters disabled).

The argument names and meanings are those of ``trl.GRPOConfig`` where they apply. One optimisation step is taken per
rollout batch (TRL's default ``num_iterations=1``), so the sampling policy is the current one: the importance ratio
is 1 at the step and clipping only bounds it away from there, as in TRL. With KG-Trie rollouts the samples come from
the constrained distribution while the log-probabilities are the model's own, as in GCR-style constrained decoding.

At scale, rollouts are the cost: TRL's ``GRPOTrainer`` with ``use_vllm=True`` (a ``trl vllm-serve`` server) takes
the same reward functions, and this module's adapter folder (``save_adapter_dir``) is a PEFT adapter it can start
from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from kglightning.datamodules.sft_examples import ProxyPrompt
from kglightning.evidence.format import parse_evidence
from kglightning.evidence.rewards import EvidenceReward
from kglightning.llm.trie import KGTrie
from kglightning.modules.grpo_objective import (
    LossType,
    ScaleRewards,
    completion_mask,
    group_advantages,
    grpo_loss,
    token_log_probs,
)
from kglightning.modules.proxy_sft import ProxySFT

__all__ = ["ProxyGRPO", "RewardFunc"]

RewardFunc = Callable[..., Sequence[float | None]]
"""A reward function with TRL's signature: ``f(prompts=, completions=, completion_ids=, **columns)``."""

_TENSOR_KEYS = ("input_ids", "attention_mask", "tries")
REFERENCE = "reference"


def reward_name(func: Any) -> str:
    """The name a reward function's mean is logged under (``__name__``, else its class name)."""
    return str(getattr(func, "__name__", type(func).__name__))


class ProxyGRPO(ProxySFT):
    """The evidence proxy refined by GRPO (see the module docstring); predicts and saves adapters like ProxySFT.

    Logs, per step (``train/``) and per validation epoch (``val/``, one greedy completion per prompt):
    ``reward`` and ``rewards/<name>`` per reward function, ``invalid_rate`` (completions without a well-formed
    ``<PATH confidence=...>``), ``completion_length``; in training also ``reward_std``, ``kl``, ``clip_ratio``,
    ``frac_reward_zero_std`` (groups that teach nothing) and ``unscorable`` (completions no reward function scored).

    Args:
        rewards: reward functions (class_path or dotted path in a config); default
            :class:`~kglightning.evidence.rewards.EvidenceReward` with the paper's settings.
        reward_weights: one weight per reward function (default all 1).
        num_generations: completions per prompt (``G``).
        max_completion_length: longest completion in tokens.
        temperature: sampling temperature (the log-probabilities are taken at the same temperature).
        top_p: nucleus sampling mass.
        beta: KL coefficient to the reference (the paper's ``β' = 0.01``; 0 skips the reference forward).
        epsilon: lower clipping bound (and upper, unless ``epsilon_high``).
        epsilon_high: upper clipping bound.
        loss_type: ``"grpo"`` (the paper's), ``"bnpo"``, ``"dr_grpo"`` or ``"dapo"`` (TRL's default).
        scale_rewards: ``"group"``, ``"batch"`` or ``"none"``.
        **kwargs: :class:`~kglightning.modules.ProxySFT`'s arguments: ``model``, ``adapter_path`` (the SFT adapter:
            the start and the reference), ``lora`` (a fresh adapter's shape, without ``adapter_path``),
            ``save_adapter_dir``, ``optimizer`` (default AdamW with the paper's lr 1.41e-5), ``generation``
            (predict-time decoding), ``prompt_format`` (default App. A.2's RL instruction in the chat template).
    """

    hparams_ignore: ClassVar[tuple[str, ...]] = ("optimizer", "rewards")

    def __init__(
        self,
        rewards: Sequence[RewardFunc] | None = None,
        reward_weights: Sequence[float] | None = None,
        num_generations: int = 8,
        max_completion_length: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        beta: float = 0.01,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        loss_type: LossType = "grpo",
        scale_rewards: ScaleRewards = "group",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("prompt_format", ProxyPrompt(instruction="rl"))
        super().__init__(**kwargs)
        self.reward_funcs = list(rewards) if rewards is not None else [EvidenceReward()]
        if not self.reward_funcs:
            raise ValueError("need at least one reward function")
        weights = [1.0] * len(self.reward_funcs) if reward_weights is None else [float(w) for w in reward_weights]
        if len(weights) != len(self.reward_funcs):
            raise ValueError(f"{len(weights)} reward_weights for {len(self.reward_funcs)} reward functions")
        if num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 (advantages are relative to the group), got {num_generations}"
            )
        if max_completion_length < 1 or temperature <= 0 or not 0 < top_p <= 1:
            raise ValueError(
                f"need max_completion_length >= 1, temperature > 0 and 0 < top_p <= 1, got {max_completion_length}, "
                f"{temperature}, {top_p}"
            )
        if loss_type not in ("grpo", "bnpo", "dr_grpo", "dapo"):
            raise ValueError(f"loss_type must be 'grpo', 'bnpo', 'dr_grpo' or 'dapo', got {loss_type!r}")
        if scale_rewards not in ("group", "batch", "none"):
            raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
        self.reward_weights = torch.tensor(weights)
        self.reward_names = [reward_name(f) for f in self.reward_funcs]
        self.num_generations = num_generations
        self.max_completion_length = max_completion_length
        self.temperature = temperature
        self.top_p = top_p
        self.beta = beta
        self.epsilon = epsilon
        self.epsilon_high = epsilon_high
        self.loss_type: LossType = loss_type
        self.scale_rewards: ScaleRewards = scale_rewards
        self.has_reference_adapter = kwargs.get("adapter_path") is not None
        if self.has_reference_adapter:
            self.model.load_adapter(kwargs["adapter_path"], adapter_name=REFERENCE, is_trainable=False)
        self.skipped_batches = 0

    # ------------------------------------------------------------------ rollouts and rewards
    @torch.no_grad()
    def rollout(
        self, input_ids: Tensor, attention_mask: Tensor, tries: Sequence[KGTrie] | None = None, greedy: bool = False
    ) -> Tensor:
        """Completions of left-padded prompts, group by group: ``num_generations`` samples per prompt (``(B * G, T)``
        ids), or one greedy completion per prompt (``greedy=True``, how validation and test score the policy)."""
        from transformers import GenerationConfig

        sampling = {"temperature": self.temperature, "top_p": self.top_p, "top_k": 0}
        config = GenerationConfig(
            max_new_tokens=self.max_completion_length,
            do_sample=not greedy,
            num_return_sequences=1 if greedy else self.num_generations,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            bos_token_id=self.model.generation_config.bos_token_id,
            **({} if greedy else sampling),
        )
        out = self.run_generate(input_ids, attention_mask, config, tries)
        return out[:, input_ids.shape[1] :]

    def score(
        self, prompts: Sequence[str], completions: Sequence[str], completion_ids: Sequence[Sequence[int]], batch: dict
    ) -> Tensor:
        """``(N, F)`` rewards of ``N`` completions under the ``F`` reward functions (NaN where a function gave None
        or a non-finite value); ``batch``'s columns are repeated to one value per completion."""
        n = len(completions)
        per = n // max(len(prompts), 1)
        columns = {
            k: [v for v in values for _ in range(per)]
            for k, values in batch.items()
            if k not in _TENSOR_KEYS and isinstance(values, list)
        }
        out = torch.full((n, len(self.reward_funcs)), math.nan)
        for j, (func, name) in enumerate(zip(self.reward_funcs, self.reward_names)):
            values = list(
                func(
                    prompts=[p for p in prompts for _ in range(per)],
                    completions=list(completions),
                    completion_ids=[list(c) for c in completion_ids],
                    **columns,
                )
            )
            if len(values) != n:
                raise ValueError(f"reward function {name!r} returned {len(values)} rewards for {n} completions")
            for i, v in enumerate(values):
                if v is not None and math.isfinite(float(v)):
                    out[i, j] = float(v)
        return out

    def _decode(self, ids: Tensor, mask: Tensor) -> tuple[list[list[int]], list[str]]:
        rows = [row[: int(m.sum())] for row, m in zip(ids.tolist(), mask)]
        return rows, [self.tokenizer.decode(r, skip_special_tokens=True) for r in rows]

    def completion_log_probs(
        self, input_ids: Tensor, attention_mask: Tensor, width: int, reference: bool = False
    ) -> Tensor:
        """Log-probabilities of the last ``width`` tokens of ``input_ids`` (prompt + completion, left-padded) under
        the policy, or under the reference (``reference=True``: no gradient, eval mode)."""
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "logits_to_keep": width + 1,
        }
        if not reference:
            logits = self.model(**kwargs).logits
        else:
            was_training = self.model.training
            self.model.eval()
            try:
                with torch.no_grad():
                    if self.has_reference_adapter:
                        logits = self.model(**kwargs, adapter_names=[REFERENCE] * input_ids.shape[0]).logits
                    else:
                        with self.model.disable_adapter():
                            logits = self.model(**kwargs).logits
            finally:
                self.model.train(was_training)
        return token_log_probs(logits[:, :-1], input_ids[:, -width:], self.temperature)

    def _rollout_rewards(self, batch: dict[str, Any], completions: Tensor, mask: Tensor) -> tuple[Tensor, list[str]]:
        prompts = self.tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True)
        ids, texts = self._decode(completions, mask)
        return self.score(prompts, texts, ids, batch), texts

    def _log_rewards(
        self, stage: str, per_func: Tensor, rewards: Tensor, texts: Sequence[str], lengths: Tensor
    ) -> None:
        size = len(texts)
        prog = stage == "train"
        on_step = stage == "train"
        mean = torch.nanmean(rewards) if (~torch.isnan(rewards)).any() else torch.tensor(0.0)
        self.log(
            f"{stage}/reward", mean, batch_size=size, prog_bar=True, on_step=on_step, on_epoch=True, sync_dist=True
        )
        for j, name in enumerate(self.reward_names):
            col = per_func[:, j]
            value = torch.nanmean(col) if (~torch.isnan(col)).any() else torch.tensor(0.0)
            self.log(f"{stage}/rewards/{name}", value, batch_size=size, on_step=on_step, on_epoch=True, sync_dist=True)
        invalid = sum(not parse_evidence(t, require_confidence=True).evidence for t in texts) / max(size, 1)
        self.log(
            f"{stage}/invalid_rate", float(invalid), batch_size=size, prog_bar=prog, on_step=on_step, on_epoch=True
        )
        self.log(f"{stage}/completion_length", lengths.float().mean(), batch_size=size, on_step=on_step, on_epoch=True)

    def _weighted(self, per_func: Tensor) -> Tensor:
        weights = self.reward_weights.to(per_func)
        rewards = (per_func * weights).nansum(dim=1)
        return torch.where(torch.isnan(per_func).all(dim=1), torch.full_like(rewards, math.nan), rewards)

    # ------------------------------------------------------------------ steps
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        prompt_ids, prompt_mask = batch["input_ids"], batch["attention_mask"]
        if prompt_ids.shape[0] == 0:  # an empty group of prompts: nothing to sample or learn from
            self.skipped_batches += 1
            rank_zero_info(f"skipped empty GRPO batch {batch_idx} ({self.skipped_batches} so far)")
            return None
        g = self.num_generations
        completions = self.rollout(prompt_ids, prompt_mask, batch.get("tries"))
        mask = completion_mask(completions, self.tokenizer.eos_token_id)
        per_func, texts = self._rollout_rewards(batch, completions, mask)
        rewards = self._weighted(per_func)
        advantages, std_zero = group_advantages(rewards.to(self.device), g, self.scale_rewards)
        input_ids = torch.cat([prompt_ids.repeat_interleave(g, 0), completions], dim=1)
        attention = torch.cat([prompt_mask.repeat_interleave(g, 0), mask], dim=1)
        width = completions.shape[1]
        log_probs = self.completion_log_probs(input_ids, attention, width)
        ref = self.completion_log_probs(input_ids, attention, width, reference=True) if self.beta != 0 else None
        items = mask.sum().float()
        if self.loss_type == "dapo" and self._trainer is not None:
            items = self.trainer.strategy.reduce(items, reduce_op="mean")  # global tokens / number of processes
        out = grpo_loss(
            log_probs,
            log_probs.detach(),
            advantages,
            mask,
            ref,
            beta=self.beta,
            epsilon=self.epsilon,
            epsilon_high=self.epsilon_high,
            loss_type=self.loss_type,
            max_completion_length=self.max_completion_length,
            num_items_in_batch=items,
        )
        size = len(texts)
        self._log_rewards("train", per_func, rewards, texts, mask.sum(1))
        finite = rewards[~torch.isnan(rewards)]
        self.log("train/reward_std", finite.std() if finite.numel() > 1 else torch.tensor(0.0), batch_size=size)
        self.log("train/loss", out.loss.detach(), batch_size=size, on_step=True, on_epoch=True)
        self.log("train/kl", out.kl, batch_size=size, prog_bar=self.beta != 0, on_step=True, on_epoch=True)
        self.log("train/clip_ratio", out.clip_ratio, batch_size=size)
        self.log("train/frac_reward_zero_std", std_zero.float().mean(), batch_size=size)
        self.log("train/unscorable", torch.isnan(rewards).float().sum(), batch_size=size, reduce_fx="sum")
        return out.loss

    def _eval_step(self, batch: dict[str, Any], batch_idx: int, stage: str) -> None:  # type: ignore[override]
        """One greedy completion per prompt (through the tries, if any), scored and logged under ``stage/``."""
        prompt_ids, prompt_mask = batch["input_ids"], batch["attention_mask"]
        if prompt_ids.shape[0] == 0:
            return
        completions = self.rollout(prompt_ids, prompt_mask, batch.get("tries"), greedy=True)
        mask = completion_mask(completions, self.tokenizer.eos_token_id)
        per_func, texts = self._rollout_rewards(batch, completions, mask)
        self._log_rewards(stage, per_func, self._weighted(per_func), texts, mask.sum(1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer is None:
            return torch.optim.AdamW(params, lr=1.41e-5)
        return self.optimizer(params)
