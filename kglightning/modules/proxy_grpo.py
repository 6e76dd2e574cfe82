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
    group_reward_std,
    grpo_loss,
    std_from_sums,
    token_log_probs,
)
from kglightning.modules.grpo_rollouts import RewardFunc, Rollouts, reward_name, score_completions
from kglightning.modules.grpo_stats import StepStats
from kglightning.modules.manual_optimization import HandOptimized
from kglightning.modules.proxy_sft import ProxySFT

__all__ = ["ProxyGRPO", "RewardFunc", "Rollouts"]

REFERENCE = "reference"


STEP_ONLY = ("reward_std", "reward_group_std", "clip_ratio", "frac_reward_zero_std", "unscorable")
"""Training statistics logged per step only (under their plain names, ``train/clip_ratio``...)."""


class ProxyGRPO(HandOptimized, ProxySFT):
    """The evidence proxy refined by GRPO (see the module docstring); predicts and saves adapters like ProxySFT.

    Logs, per step (``train/``) and per validation epoch (``val/``, one greedy completion per prompt):
    ``reward`` and ``rewards/<name>`` per reward function, ``invalid_rate`` (completions without a well-formed
    ``<PATH confidence=...>``), ``completion_length``; in training also, as TRL's ``GRPOTrainer`` logs them, ``reward_std`` (the
    std of every scored reward of the global batch), ``frac_reward_zero_std`` (the share of completions whose
    advantage scale is 0: their group's std, or the batch's under ``scale_rewards="batch"``), ``kl`` (only when
    ``beta > 0``) and ``clip_ratio`` (per completion token), then ``loss``, ``reward_group_std`` (the mean std within
    groups) and ``unscorable`` (completions no reward function scored). Every value is a mean over all processes
    (:mod:`kglightning.modules.grpo_stats`), so one GPU and several log the same numbers for the same completions.

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
        scale_rewards: ``"group"``, ``"batch"`` or ``"none"``; ``"batch"`` divides by the std of the rewards of
            every process (TRL's global batch).
        steps_per_generation: micro-batches per rollout batch (TRL's name, in TRL's default case where it equals
            ``gradient_accumulation_steps``): the ``B * G`` completions of a step are scored by the policy (and the
            reference) in this many forward/backward passes, with gradients accumulated into one optimizer step,
            so peak memory falls with it and the update does not change.
        max_grad_norm: clip the gradient norm to this before each step, after a mixed-precision scaler unscaled
            the gradients (TRL's name; ``None``: no clipping). The module optimises by hand (one step per rollout
            batch; schedulers are stepped as Lightning would, see :class:`~kglightning.modules.manual_optimization.
            HandOptimized`), so the Trainer's ``gradient_clip_val`` and ``accumulate_grad_batches`` do not apply:
            use these and a larger data ``batch_size``.
        **kwargs: :class:`~kglightning.modules.ProxySFT`'s arguments: ``model``, ``adapter_path`` (the SFT adapter:
            the start and the reference), ``lora`` (a fresh adapter's shape, without ``adapter_path``),
            ``save_adapter_dir``, ``export`` (which weights it writes: ``best`` by the checkpoint callback's monitor,
            else the last step's), ``optimizer`` (default AdamW with the paper's lr 1.41e-5), ``generation``
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
        steps_per_generation: int = 1,
        max_grad_norm: float | None = None,
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
        if steps_per_generation < 1 or (max_grad_norm is not None and max_grad_norm <= 0):
            raise ValueError(
                f"need steps_per_generation >= 1 and max_grad_norm > 0 (or None), got {steps_per_generation}, "
                f"{max_grad_norm}"
            )
        self.automatic_optimization = False  # micro-batches: several backward passes per optimizer step
        self.steps_per_generation = steps_per_generation
        self.max_grad_norm = max_grad_norm
        self.reward_weights = torch.tensor(weights, device="cpu")
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
    def rollout_config(self, greedy: bool = False) -> Any:
        """The ``GenerationConfig`` of rollouts: every setting the sampling distribution depends on is set here
        (``generate`` takes nothing from the checkpoint's own config, see :mod:`kglightning.llm.generation`)."""
        from transformers import GenerationConfig

        sampling = {"temperature": self.temperature, "top_p": self.top_p, "top_k": 0, "repetition_penalty": 1.0}
        return GenerationConfig(
            max_new_tokens=self.max_completion_length,
            do_sample=not greedy,
            num_return_sequences=1 if greedy else self.num_generations,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            bos_token_id=self.model.generation_config.bos_token_id,
            **({"repetition_penalty": 1.0} if greedy else sampling),
        )

    @torch.no_grad()
    def rollout(
        self, input_ids: Tensor, attention_mask: Tensor, tries: Sequence[KGTrie] | None = None, greedy: bool = False
    ) -> Tensor:
        """Completions of left-padded prompts, group by group: ``num_generations`` samples per prompt (``(B * G, T)``
        ids), or one greedy completion per prompt (``greedy=True``, how validation and test score the policy)."""
        if input_ids.shape[0] == 0:  # an empty batch: no completion (the step still takes part in every collective)
            return input_ids.new_zeros((0, 0))
        out = self.run_generate(input_ids, attention_mask, self.rollout_config(greedy), tries)
        return out[:, input_ids.shape[1] :]

    def score(
        self, prompts: Sequence[str], completions: Sequence[str], completion_ids: Sequence[Sequence[int]], batch: dict
    ) -> Tensor:
        """``(N, F)`` rewards of ``N`` completions under the ``F`` reward functions, on the module's device (see
        :func:`~kglightning.modules.grpo_rollouts.score_completions`)."""
        rows = score_completions(self.reward_funcs, self.reward_names, prompts, completions, completion_ids, batch)
        return torch.tensor(rows, dtype=torch.float32, device=self.device).view(len(rows), len(self.reward_funcs))

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

    def rollouts(self, batch: dict[str, Any], greedy: bool = False) -> Rollouts:
        """Sample (or greedily decode) the batch's completions and score them (see :class:`Rollouts`)."""
        prompt_ids, prompt_mask = batch["input_ids"], batch["attention_mask"]
        completions = self.rollout(prompt_ids, prompt_mask, batch.get("tries"), greedy=greedy)
        mask = completion_mask(completions, self.tokenizer.eos_token_id)
        prompts = self.tokenizer.batch_decode(prompt_ids, skip_special_tokens=True)
        ids, texts = self._decode(completions, mask)
        per_func = self.score(prompts, texts, ids, batch)
        g = 1 if greedy else self.num_generations
        return Rollouts(
            input_ids=torch.cat([prompt_ids.repeat_interleave(g, 0), completions], dim=1),
            attention_mask=torch.cat([prompt_mask.repeat_interleave(g, 0), mask], dim=1),
            mask=mask,
            per_func=per_func,
            rewards=self._weighted(per_func),
            texts=texts,
        )

    def _weighted(self, per_func: Tensor) -> Tensor:
        weights = self.reward_weights.to(per_func)
        rewards = (per_func * weights).nansum(dim=1)
        return torch.where(torch.isnan(per_func).all(dim=1), torch.full_like(rewards, math.nan), rewards)

    # ------------------------------------------------------------------ statistics
    def _reward_stats(self, roll: Rollouts) -> StepStats:
        stats = StepStats(self.device)
        scored = ~torch.isnan(roll.rewards)
        stats.add("reward", roll.rewards[scored].sum(), scored.sum())
        for j, name in enumerate(self.reward_names):
            col = roll.per_func[:, j]
            stats.add(f"rewards/{name}", col.nansum(), (~torch.isnan(col)).sum())
        invalid = sum(not parse_evidence(t, require_confidence=True).evidence for t in roll.texts)
        stats.add("invalid_rate", invalid, len(roll.texts))
        stats.add("completion_length", roll.mask.sum(), len(roll.texts))
        return stats

    def _log_stats(self, stage: str, stats: StepStats, on_step: bool) -> None:
        """Log global means, weighted by their global counts (``unscorable``: the global count itself).

        A training step with nothing to average for a statistic (no completion scored, for ``reward``) logs nothing
        for it: a 0 would read as a real reward; such a step is counted in ``unscorable``. Validation, logged per
        epoch, logs every key with weight 0 there (the epoch mean stays exact and is NaN when nothing at all was
        scored, and a monitored ``val/reward`` always exists). The statistics of a single step (``STEP_ONLY``) are
        logged per step only, under their plain names, as before. The keys a step logs depend only on global
        counts, so every process logs the same ones.
        """
        for name, value in stats.reduce().items():
            key, step_only = f"{stage}/{name}", on_step and name in STEP_ONLY
            if name == "unscorable":
                self.log(key, value.total, on_step=on_step, on_epoch=not step_only, reduce_fx="sum")
                continue
            if on_step and not value.count:
                continue
            self.log(
                key,
                value.mean if value.count else 0.0,
                batch_size=int(round(value.count)),
                prog_bar=name in ("reward", "kl", "invalid_rate"),
                on_step=on_step,
                on_epoch=not step_only,
            )

    # ------------------------------------------------------------------ steps
    def on_fit_start(self) -> None:
        if self.trainer.accumulate_grad_batches != 1:  # Lightning refuses it first; this says what to do instead
            raise ValueError(
                "ProxyGRPO optimises once per rollout batch: raise the data's batch_size (and steps_per_generation "
                "to bound memory) instead of accumulate_grad_batches"
            )

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        """One GRPO update: rollouts, rewards and advantages, then the loss in ``steps_per_generation`` micro-batches
        (each a policy forward and backward, gradients accumulated), then one optimizer step. Every process takes
        part in the same collectives, also with an empty batch."""
        if batch["input_ids"].shape[0] == 0:
            self.skipped_batches += 1
            rank_zero_info(f"empty GRPO batch {batch_idx} ({self.skipped_batches} so far): a zero update")
        optimizer = self.optimizers()
        optimizer.zero_grad()
        loss, stats = self.grpo_step(batch, self.manual_backward)
        optimizer.step()  # clips to max_grad_norm first (on_before_optimizer_step, after unscaling)
        self.step_schedulers("step")
        self._log_stats("train", stats, on_step=True)
        return loss

    def grpo_step(self, batch: dict[str, Any], backward: Callable[[Tensor], None]) -> tuple[Tensor, StepStats]:
        """Rollouts, advantages and the loss, ``backward`` called once per micro-batch; returns the batch's loss
        (detached: the sum of the micro-batch losses) and its statistics (not yet reduced over processes)."""
        roll = self.rollouts(batch)
        n, width = roll.mask.shape
        tokens = roll.mask.sum()
        scored = ~torch.isnan(roll.rewards)
        # what the loss needs from every process, in one collective (the same on every process: the config decides)
        pre = StepStats(self.device)
        values = roll.rewards[scored].double()
        pre.add("rewards", values.sum(), scored.sum())
        pre.add("squares", (values**2).sum(), 0)
        pre.add("tokens", tokens, 1)  # its mean over processes: global tokens / processes, TRL's dapo normaliser
        total = pre.reduce()
        batch_std = std_from_sums(total["rewards"].count, total["rewards"].total, total["squares"].total)
        items = torch.tensor(total["tokens"].mean, device=self.device) if self.loss_type == "dapo" else tokens.float()
        advantages, std_zero = group_advantages(roll.rewards, self.num_generations, self.scale_rewards, batch_std)
        if self.scale_rewards == "batch":  # TRL: the scale that was used, the batch's
            std_zero = torch.full_like(std_zero, math.isclose(batch_std, 0.0, abs_tol=1e-8))
        loss_sum = torch.zeros((), device=self.device)
        kl_sum, clip_sum = torch.zeros((), device=self.device), torch.zeros((), device=self.device)
        for rows in torch.arange(n, device=self.device).tensor_split(self.steps_per_generation):
            if rows.numel() == 0:  # a backward all the same: under DDP every process reduces the same buckets
                backward(sum((p * 0).sum() for p in self.parameters() if p.requires_grad))
                continue
            ids, attention, mask = roll.input_ids[rows], roll.attention_mask[rows], roll.mask[rows]
            ref = self.completion_log_probs(ids, attention, width, reference=True) if self.beta != 0 else None
            log_probs = self.completion_log_probs(ids, attention, width)
            out = grpo_loss(
                log_probs,
                log_probs.detach(),
                advantages[rows],
                mask,
                ref,
                beta=self.beta,
                epsilon=self.epsilon,
                epsilon_high=self.epsilon_high,
                loss_type=self.loss_type,
                max_completion_length=self.max_completion_length,
                num_items_in_batch=items,
                num_sequences=n,
                num_tokens=tokens,
            )
            backward(out.loss)
            loss_sum = loss_sum + out.loss.detach()
            kl_sum = kl_sum + out.kl * mask.sum()
            clip_sum = clip_sum + out.clip_ratio * mask.sum()
        stats = self._reward_stats(roll)
        stats.add("reward_std", torch.tensor(batch_std, device=self.device), 1)  # global: the same on every process
        stats.add("reward_group_std", group_reward_std(roll.rewards, self.num_generations).sum(), n)
        stats.add("loss", loss_sum, 1)  # the mean over processes of each process's loss
        if self.beta > 0:  # TRL logs no kl without a reference model
            stats.add("kl", kl_sum, tokens)
        stats.add("clip_ratio", clip_sum, tokens)
        stats.add("frac_reward_zero_std", std_zero.float().sum(), n)
        stats.add("unscorable", (~scored).sum(), 0)
        return loss_sum, stats

    def _eval_step(self, batch: dict[str, Any], batch_idx: int, stage: str) -> None:  # type: ignore[override]
        """One greedy completion per prompt (through the tries, if any), scored and logged under ``stage/``."""
        self._log_stats(stage, self._reward_stats(self.rollouts(batch, greedy=True)), on_step=False)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer is None:
            return torch.optim.AdamW(params, lr=1.41e-5)
        return self.optimizer(params)
