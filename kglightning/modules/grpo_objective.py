"""The GRPO objective as pure tensor functions (Shao et al. 2024; DoublyCal §4.2 Eq. 5), with TRL's conventions.

:class:`~kglightning.modules.ProxyGRPO` composes them; they are public so that a subclass, a test or another trainer
can reuse one piece. Names and meanings follow ``trl.GRPOConfig``/``trl.GRPOTrainer``:

* :func:`group_advantages`: ``A_i = (r_i − mean_group(r)) / (std + 1e-4)``, with ``scale_rewards`` ``"group"``,
  ``"batch"`` or ``"none"`` (Dr. GRPO); a completion whose reward is NaN (no reward function could score it) is left
  out of its group's mean and std and gets advantage 0;
* :func:`per_token_kl`: the ``k3`` estimator ``exp(ref − logp) − (ref − logp) − 1`` (0 where the two agree);
* :func:`grpo_loss`: the clipped surrogate ``−min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A) + β·KL`` per token, aggregated
  as ``loss_type`` says: ``"grpo"`` (mean over each sequence's tokens, then over sequences), ``"bnpo"`` (mean over all
  tokens of the batch), ``"dr_grpo"`` (sum over tokens divided by ``batch · max_completion_length``) or ``"dapo"``
  (sum over tokens divided by the number of completion tokens of the global batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

__all__ = [
    "LossType",
    "PolicyLoss",
    "ScaleRewards",
    "completion_mask",
    "group_advantages",
    "group_reward_std",
    "grpo_loss",
    "per_token_kl",
    "std_from_sums",
    "token_log_probs",
]

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
ScaleRewards = Literal["group", "batch", "none"]


def completion_mask(completion_ids: Tensor, eos_token_id: int) -> Tensor:
    """``1`` on the tokens of each completion up to and including its first EOS, ``0`` after (padding).

    Example:
        >>> completion_mask(torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8]]), eos_token_id=2)
        tensor([[1, 1, 0, 0],
                [1, 1, 1, 1]])
    """
    is_eos = completion_ids == eos_token_id
    seen_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (seen_before == 0).long()


class _RowLogSumExp(torch.autograd.Function):
    """``logsumexp(logits / T)`` over the vocabulary, one sequence at a time, in float32; the backward pass recomputes
    each sequence's softmax instead of keeping a float32 copy of the logits for it (``torch.logsumexp`` saves its
    float32 input: one full float32 copy of the batch's logits until ``backward``)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, temperature: float) -> Tensor:
        ctx.save_for_backward(logits)
        ctx.temperature = temperature
        acc = torch.promote_types(logits.dtype, torch.float32)
        return torch.stack([torch.logsumexp(row.to(acc) / temperature, dim=-1) for row in logits])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (logits,) = ctx.saved_tensors
        t = ctx.temperature
        acc = torch.promote_types(logits.dtype, torch.float32)
        out = torch.empty_like(logits)
        for b, row in enumerate(logits):
            out[b] = (torch.softmax(row.to(acc) / t, dim=-1) * (grad[b].unsqueeze(-1) / t)).to(logits.dtype)
        return out, None


def token_log_probs(logits: Tensor, ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``log p(ids)`` under ``softmax(logits / temperature)``, without a full log-softmax tensor.

    The log-normaliser is computed in float32 one sequence at a time (as TRL's ``selective_log_softmax`` loops over
    rows), and its backward pass recomputes each sequence's softmax, so that autograd keeps no float32 copy of the
    ``(B, T, V)`` logits (about 1.3 GB at ``B = 32``, ``T = 64`` and a 152k vocabulary): only the logits themselves,
    in their own dtype, and at most one ``(T, V)`` float32 row at a time.

    Args:
        logits: ``(B, T, V)`` next-token logits aligned with ``ids`` (any floating dtype; the result is float32, or float64 for float64 logits).
        ids: ``(B, T)`` the tokens whose log-probabilities are wanted.
        temperature: the sampling temperature (the log-probabilities are those of the sampling distribution).

    Example:
        >>> logits = torch.log(torch.tensor([[[0.25, 0.75]]]))
        >>> token_log_probs(logits, torch.tensor([[1]])).exp()
        tensor([[0.7500]])
    """
    acc = torch.promote_types(logits.dtype, torch.float32)
    picked = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1).to(acc) / temperature
    if logits.shape[0] == 0:
        return picked
    return picked - _RowLogSumExp.apply(logits, temperature)


def _group_moments(rewards: Tensor, num_generations: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(grouped, valid, mean, std)``: the rewards as ``(groups, G)``, their non-NaN mask, and each group's mean and
    unbiased std over its scorable rewards (``(groups, 1)``; std 0 for fewer than two)."""
    if num_generations < 1 or rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {num_generations}")
    grouped = rewards.float().view(-1, num_generations)
    valid = ~torch.isnan(grouped)
    count = valid.sum(dim=1, keepdim=True)
    filled = torch.where(valid, grouped, torch.zeros_like(grouped))
    mean = filled.sum(dim=1, keepdim=True) / count.clamp(min=1)
    # unbiased std as torch.std (and TRL's nanstd); a single valid reward has std 0
    sq = torch.where(valid, (grouped - mean) ** 2, torch.zeros_like(grouped)).sum(dim=1, keepdim=True)
    return grouped, valid, mean, torch.sqrt(sq / (count - 1).clamp(min=1))


def group_reward_std(rewards: Tensor, num_generations: int) -> Tensor:
    """Per completion, the (unbiased) standard deviation of its group's scorable rewards (0 for fewer than two).

    Example:
        >>> group_reward_std(torch.tensor([1.0, 3.0, 2.0, float("nan")]), 2)
        tensor([1.4142, 1.4142, 0.0000, 0.0000])
    """
    grouped, _, _, std = _group_moments(rewards, num_generations)
    return std.expand_as(grouped).reshape(-1)


def group_advantages(
    rewards: Tensor,
    num_generations: int,
    scale_rewards: ScaleRewards = "group",
    batch_std: Tensor | float | None = None,
) -> tuple[Tensor, Tensor]:
    """Group-relative advantages of ``rewards`` laid out group by group (``num_generations`` per prompt).

    Args:
        rewards: ``(N,)`` with ``N`` a multiple of ``num_generations``; NaN marks an unscorable completion.
        num_generations: completions per prompt (``G``).
        scale_rewards: divide by the group's std (``"group"``), the batch's std (``"batch"``), or not (``"none"``).
        batch_std: the std that ``"batch"`` divides by (a float or 0-dim tensor); default the std of this batch's
            scorable rewards. Under DDP pass the std of the global batch (TRL's semantics), e.g. from
            :func:`std_from_sums`.

    Returns:
        ``(advantages, std_is_zero)``: advantages (0 for NaN rewards) and, per completion, whether its group's
        rewards were all equal (the group gives no learning signal).

    Example:
        >>> adv, flat = group_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), num_generations=2)
        >>> [round(a, 3) for a in adv.tolist()], flat.tolist()
        ([0.707, -0.707, 0.0, 0.0], [False, False, True, True])
        >>> group_advantages(torch.tensor([1.0, float("nan"), 3.0]), 3, "none")[0]
        tensor([-1.,  0.,  1.])
    """
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    grouped, valid, mean, group_std = _group_moments(rewards, num_generations)
    std = group_std.expand_as(grouped).reshape(-1)
    advantages = torch.where(valid, grouped - mean, torch.zeros_like(grouped)).reshape(-1)
    std_is_zero = torch.isclose(std, torch.zeros_like(std))
    if scale_rewards == "group":
        advantages = advantages / (std + 1e-4)
    elif scale_rewards == "batch":
        if batch_std is None:
            flat = rewards.float()[~torch.isnan(rewards)]
            batch_std = flat.std() if flat.numel() > 1 else torch.zeros((), device=rewards.device)
        advantages = advantages / (torch.as_tensor(batch_std, device=advantages.device).to(advantages) + 1e-4)
    return advantages, std_is_zero


def std_from_sums(count: float, total: float, squares: float) -> float:
    """The unbiased standard deviation of values given their count, sum and sum of squares (0 for ``count < 2``);
    sums of this kind add up across processes, so one ``all_reduce`` gives the global std.

    Example:
        >>> values = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
        >>> round(std_from_sums(3, values.sum().item(), (values**2).sum().item()), 6), round(values.std().item(), 6)
        (1.527525, 1.527525)
    """
    if count < 2:
        return 0.0
    return math.sqrt(max((squares - total**2 / count) / (count - 1), 0.0))


def per_token_kl(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """The ``k3`` estimate of ``KL(π ‖ π_ref)`` per token: ``exp(ref − logp) − (ref − logp) − 1 ≥ 0``.

    Example:
        >>> per_token_kl(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0]))
        tensor([0.0000, 0.7183])
    """
    delta = ref_log_probs - log_probs
    return torch.exp(delta) - delta - 1


@dataclass
class PolicyLoss:
    """What :func:`grpo_loss` returns: the loss to minimise and detached statistics for logging."""

    loss: Tensor
    kl: Tensor
    clip_ratio: Tensor


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def grpo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_log_probs: Tensor | None = None,
    beta: float = 0.0,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    loss_type: LossType = "grpo",
    max_completion_length: int | None = None,
    num_items_in_batch: Tensor | float | None = None,
    num_sequences: int | None = None,
    num_tokens: Tensor | float | None = None,
) -> PolicyLoss:
    """The clipped GRPO surrogate with a KL penalty, aggregated as ``loss_type`` says (see the module docstring).

    Args:
        log_probs: ``(B, T)`` completion-token log-probabilities under the current policy (with gradient).
        old_log_probs: ``(B, T)`` the same under the policy that sampled them (``log_probs.detach()`` on-policy).
        advantages: ``(B,)`` one advantage per completion.
        mask: ``(B, T)`` 1 on completion tokens.
        ref_log_probs: ``(B, T)`` under the reference policy; needed when ``beta != 0``.
        beta: KL coefficient.
        epsilon: lower clipping bound ``ε_low`` (and the upper one when ``epsilon_high`` is ``None``).
        epsilon_high: upper clipping bound (DAPO's clip-higher).
        loss_type: ``"grpo"``, ``"bnpo"``, ``"dr_grpo"`` or ``"dapo"``.
        max_completion_length: the constant of ``"dr_grpo"`` (default: ``T``).
        num_items_in_batch: the number of completion tokens in the global batch for ``"dapo"``, divided by the
            number of processes (default: this batch's ``mask.sum()``).
        num_sequences, num_tokens: the sequences and completion tokens of the whole (local) batch when these rows are
            one micro-batch of it (default: these rows'); with them, the losses of the micro-batches add up to the
            loss of the whole batch, for every ``loss_type``.

    Example:
        >>> lp = torch.log(torch.tensor([[0.5, 0.5], [0.25, 1.0]]))
        >>> out = grpo_loss(lp, lp, torch.tensor([1.0, -1.0]), torch.tensor([[1, 1], [1, 0]]))
        >>> out.loss  # on-policy: -(mean over tokens of A), averaged over sequences
        tensor(0.)
    """
    mask = mask.to(log_probs.dtype)
    if beta != 0.0 and ref_log_probs is None:
        raise ValueError("beta != 0 needs ref_log_probs")
    ratio = torch.exp(log_probs - old_log_probs)
    high = epsilon if epsilon_high is None else epsilon_high
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + high)
    adv = advantages.unsqueeze(1).to(log_probs.dtype)
    per_token = -torch.min(ratio * adv, clipped * adv)
    kl = torch.zeros_like(per_token)
    if beta != 0.0 and ref_log_probs is not None:
        kl = per_token_kl(log_probs, ref_log_probs)
        per_token = per_token + beta * kl
    sequences = per_token.shape[0] if num_sequences is None else num_sequences
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / max(sequences, 1)
    elif loss_type == "bnpo":
        tokens = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, device=mask.device)
        loss = (per_token * mask).sum() / tokens.clamp(min=1)
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (max(sequences, 1) * (max_completion_length or per_token.shape[1]))
    elif loss_type == "dapo":
        items = mask.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch, device=mask.device)
        loss = (per_token * mask).sum() / items.clamp(min=1)
    else:
        raise ValueError(f"loss_type must be 'grpo', 'bnpo', 'dr_grpo' or 'dapo', got {loss_type!r}")
    is_clipped = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > 1 + high) & (adv > 0))
    return PolicyLoss(loss, _masked_mean(kl.detach(), mask), _masked_mean(is_clipped.to(mask.dtype), mask))
