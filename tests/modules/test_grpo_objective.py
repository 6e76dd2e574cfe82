"""The GRPO objective against hand-computed values and TRL's definitions."""

from __future__ import annotations

import math

import pytest
import torch

from kglightning.modules.grpo_objective import (
    completion_mask,
    group_advantages,
    grpo_loss,
    per_token_kl,
    token_log_probs,
)


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    adv, flat = group_advantages(rewards, 3, "group")
    # group 1: mean 2, unbiased std 1; group 2: all equal
    torch.testing.assert_close(adv, torch.tensor([-1 / 1.0001, 0.0, 1 / 1.0001, 0.0, 0.0, 0.0]))
    assert flat.tolist() == [False] * 3 + [True] * 3
    none, _ = group_advantages(rewards, 3, "none")
    torch.testing.assert_close(none, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]))
    batch, _ = group_advantages(rewards, 3, "batch")
    torch.testing.assert_close(batch, none / (rewards.std() + 1e-4))


def test_unscorable_rewards_are_left_out_and_get_zero_advantage():
    adv, _ = group_advantages(torch.tensor([0.0, math.nan, 2.0, math.nan, math.nan, math.nan]), 3, "none")
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]))
    assert not torch.isnan(group_advantages(torch.full((4,), math.nan), 2)[0]).any()


def test_group_advantages_reject_bad_shapes():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(torch.zeros(4), 2, "std")


def test_completion_mask_stops_after_first_eos():
    ids = torch.tensor([[7, 2, 2, 9], [2, 5, 5, 5], [4, 4, 4, 4]])
    assert completion_mask(ids, 2).tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]


def test_token_log_probs_match_log_softmax():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 11, (2, 3), generator=torch.Generator().manual_seed(1))
    want = torch.log_softmax(logits / 0.7, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_log_probs(logits, ids, 0.7), want)


def test_token_log_probs_gradients_and_saved_memory():
    """The gradient equals log_softmax's (double-precision gradcheck), and autograd keeps no float32 copy of bf16
    logits: what the graph saves is the logits themselves."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 7, (2, 3), generator=gen)
    assert torch.autograd.gradcheck(lambda x: token_log_probs(x, ids, 0.7), (logits,))
    bf16 = torch.randn(4, 16, 1000, generator=gen).bfloat16().requires_grad_()
    saved: dict[int, int] = {}  # storage -> bytes: a tensor saved by two nodes is one tensor in memory

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = token_log_probs(bf16, torch.zeros(4, 16, dtype=torch.long))
    assert (
        sum(saved.values()) <= bf16.numel() * bf16.element_size() + 4 * 16 * 8
    )  # the logits once, plus the gather index
    out.sum().backward()
    want = torch.autograd.grad(torch.log_softmax(bf16.float(), -1)[..., 0].sum(), bf16)[0]
    torch.testing.assert_close(bf16.grad.float(), want.float(), atol=1e-2, rtol=1e-2)


def test_kl_is_zero_when_policies_agree_and_positive_otherwise():
    lp = torch.log(torch.tensor([[0.2, 0.5, 0.9]]))
    assert per_token_kl(lp, lp).abs().max().item() == 0.0
    assert (per_token_kl(lp, lp - 0.3) > 0).all()


def _inputs():
    lp = torch.log(torch.tensor([[0.5, 0.4, 0.3], [0.6, 0.2, 0.1]]))
    old = lp - torch.tensor([[0.0, 0.5, -0.5], [0.1, 0.0, 0.0]])  # ratios e^0, e^0.5, e^-0.5, e^0.1, 1, 1
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return lp, old, torch.tensor([1.0, -2.0]), mask


def _per_token(lp, old, adv, eps_low=0.2, eps_high=0.2):
    ratio = torch.exp(lp - old)
    a = adv.unsqueeze(1)
    return -torch.min(ratio * a, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a)


def test_loss_types_aggregate_as_trl_does():
    lp, old, adv, mask = _inputs()
    tok = _per_token(lp, old, adv) * mask
    m = mask.float()
    want = {
        "grpo": ((tok.sum(1) / m.sum(1)).mean()),
        "bnpo": tok.sum() / m.sum(),
        "dr_grpo": tok.sum() / (2 * 10),
        "dapo": tok.sum() / 7.0,
    }
    for loss_type, value in want.items():
        out = grpo_loss(lp, old, adv, mask, loss_type=loss_type, max_completion_length=10, num_items_in_batch=7.0)
        torch.testing.assert_close(out.loss, value, msg=loss_type)
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(lp, old, adv, mask, loss_type="ppo")  # type: ignore[arg-type]


def test_clipping_and_clip_higher():
    lp, old, adv, mask = _inputs()
    out = grpo_loss(lp, old, adv, mask)
    # ratio e^0.5 = 1.65 with A = +1 is clipped at 1.2; e^-0.5 = 0.61 with A = +1 is not (min keeps the ratio)
    assert out.clip_ratio.item() == pytest.approx(1 / 5)
    loose = grpo_loss(lp, old, adv, mask, epsilon_high=1.0)
    assert loose.clip_ratio.item() == 0.0
    torch.testing.assert_close(loose.loss, ((_per_token(lp, old, adv, 0.2, 1.0) * mask).sum(1) / mask.sum(1)).mean())


def test_kl_penalty_adds_beta_times_kl_and_needs_a_reference():
    lp, old, adv, mask = _inputs()
    ref = lp - 0.25
    base = grpo_loss(lp, old, adv, mask, loss_type="bnpo")
    with_kl = grpo_loss(lp, old, adv, mask, ref, beta=0.1, loss_type="bnpo")
    kl = per_token_kl(lp, ref)
    torch.testing.assert_close(with_kl.loss - base.loss, 0.1 * (kl * mask).sum() / mask.sum())
    torch.testing.assert_close(with_kl.kl, (kl * mask).sum() / mask.sum())
    with pytest.raises(ValueError, match="ref_log_probs"):
        grpo_loss(lp, old, adv, mask, beta=0.1)


def test_on_policy_gradient_is_the_advantage_weighted_score():
    logits = torch.zeros(1, 1, 3, requires_grad=True)
    ids = torch.tensor([[2]])
    lp = token_log_probs(logits, ids)
    grpo_loss(lp, lp.detach(), torch.tensor([1.0]), torch.ones(1, 1)).loss.backward()
    # d(-log softmax_2)/d logits = softmax - onehot(2) = [1/3, 1/3, -2/3]: the step raises the sampled token
    torch.testing.assert_close(logits.grad, torch.tensor([[[1 / 3, 1 / 3, -2 / 3]]]))
