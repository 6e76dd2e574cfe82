"""Workers for the GRPO DDP tests; a separate module so that spawned processes can import it in any import mode.

Rollouts are fixed (the same completions and rewards whatever the process), so that one process with both prompts
and two processes with one prompt each can be compared number for number.
"""

from __future__ import annotations

import datetime
import math
import os
from typing import Any

import torch
import torch.distributed as dist

from kglightning.llm.lora import LoRASettings
from kglightning.modules import ProxyGRPO
from kglightning.modules.grpo_objective import completion_mask
from kglightning.modules.grpo_rollouts import Rollouts

PROMPTS = ["capital of France?", "which languages are spoken in Peru?"]
COMPLETIONS = [
    ["Paris", "Paris is the capital of France", "the yen", "capital"],
    ["Spanish and Quechua", "Lima", "the currency of Kenya is the shilling", "Peru"],
]
REWARDS = [[1.0, 0.5, -3.0, 0.25], [2.0, 2.0, 1.0, math.nan]]
CONFIGS = [("dapo", "batch"), ("grpo", "batch"), ("dr_grpo", "group")]


def build(model_dir: str, loss_type: str = "grpo", scale_rewards: str = "group", **kwargs: Any) -> ProxyGRPO:
    """A GRPO module whose LoRA B is seeded away from zero (so that the policy differs from the reference)."""
    torch.manual_seed(0)  # LoRA A's initialisation
    module = ProxyGRPO(
        model=model_dir,
        lora=LoRASettings(r=4, lora_alpha=8, lora_dropout=0.0),
        num_generations=4,
        max_completion_length=12,
        loss_type=loss_type,
        scale_rewards=scale_rewards,
        **{"beta": 0.1, **kwargs},
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if "lora_B" in name and ".default." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return module


def fixed_rollouts(module: ProxyGRPO, which: list[int]) -> Rollouts:
    """The completions of ``PROMPTS[i]`` for ``i`` in ``which``, as :meth:`ProxyGRPO.rollouts` lays them out."""
    tok = module.tokenizer
    prompts = [tok(PROMPTS[i])["input_ids"] for i in which]
    width = max(len(p) for p in prompts)
    prompt_ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    texts = [c for i in which for c in COMPLETIONS[i]]
    rows = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
    length = max(len(r) for r in rows)
    completions = torch.tensor([r + [tok.eos_token_id] * (length - len(r)) for r in rows])
    mask = completion_mask(completions, tok.eos_token_id)
    per_func = torch.tensor([r for i in which for r in REWARDS[i]]).view(-1, 1)
    return Rollouts(
        input_ids=torch.cat([prompt_ids.repeat_interleave(4, 0), completions], dim=1),
        attention_mask=torch.cat([prompt_mask.repeat_interleave(4, 0), mask], dim=1),
        mask=mask,
        per_func=per_func,
        rewards=module._weighted(per_func),
        texts=texts,
    )


def step(model_dir: str, which: list[int], loss_type: str, scale_rewards: str, micro: int = 2) -> dict[str, Any]:
    """One GRPO step on fixed rollouts in ``micro`` micro-batches: the LoRA gradients (averaged over processes, as
    DDP does) and the global statistics (means; sums for those without a count)."""
    module = build(model_dir, loss_type, scale_rewards, steps_per_generation=micro)
    roll = fixed_rollouts(module, which)
    module.rollouts = lambda batch, greedy=False: roll  # type: ignore[method-assign]
    _, stats = module.grpo_step({}, backward=lambda loss: loss.backward())
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
    if dist.is_initialized():
        for g in grads.values():
            dist.all_reduce(g)
            g /= dist.get_world_size()
    values = {k: v.mean if v.count else v.total for k, v in stats.reduce().items()}
    return {"grads": grads, "stats": values}


def stats_worker(rank: int, world_size: int, init_file: str, model_dir: str, expected: dict) -> None:
    """Each process scores one prompt; the averaged gradients and the statistics equal one process's on both (up to
    float noise from the prompts' left padding, which differs between the two layouts)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=120),
    )  # fmt: skip
    try:
        for loss_type, scale in CONFIGS:
            got = step(model_dir, [rank], loss_type, scale)
            want = expected[(loss_type, scale)]
            for name, value in want["stats"].items():
                assert math.isclose(got["stats"][name], value, rel_tol=1e-5, abs_tol=1e-6), (loss_type, name)
            for name, g in want["grads"].items():
                torch.testing.assert_close(
                    got["grads"][name], g, rtol=1e-3, atol=1e-5, msg=lambda m, n=name, t=loss_type: f"{t} {n}: {m}"
                )
    finally:
        dist.destroy_process_group()


def trainer_worker(rank: int, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    """``Trainer(strategy="ddp")`` on 2 processes, rank 1's first batch empty: both finish with the same weights."""
    import lightning as L
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size), RANK=str(rank),
        LOCAL_RANK=str(rank), NODE_RANK="0",
    )  # fmt: skip
    module = build(model_dir, max_grad_norm=1.0)
    module.reward_funcs, module.reward_names = [_first_token_is_even], ["first_token_is_even"]
    tok = module.tokenizer
    ids = torch.tensor([tok(PROMPTS[0])["input_ids"]])
    full = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "id": ["q"]}
    empty = {"input_ids": ids[:0], "attention_mask": ids[:0], "id": []}
    batches = [full, full] if rank == 0 else [empty, full]
    trainer = L.Trainer(
        accelerator="cpu", devices=world_size, strategy="ddp", max_steps=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
    )  # fmt: skip
    trainer.fit(module, DataLoader(batches, batch_size=None))
    weights = {n: p.detach() for n, p in module.named_parameters() if p.requires_grad}
    torch.save({"weights": weights, "skipped": module.skipped_batches, "step": trainer.global_step},
               os.path.join(out_dir, f"rank{rank}.pt"))  # fmt: skip


def _first_token_is_even(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    return [float(bool(ids) and ids[0] % 2 == 0) for ids in completion_ids]
