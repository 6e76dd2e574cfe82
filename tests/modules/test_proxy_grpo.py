"""ProxyGRPO on a tiny random Llama: a toy task with a known optimum, the SFT reference, the DataModule, bad input."""

from __future__ import annotations

import importlib
import math
import sys
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from kglightning.datamodules import ProxyGRPODataModule
from kglightning.llm.lora import LoRASettings
from kglightning.llm.trie import TrieConfig
from kglightning.modules import ProxyGRPO, ProxySFT
from kglightning.testing import quiet_trainer

LORA = LoRASettings(r=4, lora_alpha=8, lora_dropout=0.0)


pytestmark = pytest.mark.usefixtures("single_torch_thread")  # tiny models only lose from more threads


def _lora_weights(module: ProxySFT, adapter: str = "default") -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if "lora_" in n and f".{adapter}." in n}


def _first_token_probs(module: ProxyGRPO, prompt: torch.Tensor) -> torch.Tensor:
    module.model.eval()
    with torch.no_grad():
        logits = module.model(input_ids=prompt, attention_mask=torch.ones_like(prompt)).logits[0, -1]
    module.model.train()
    return torch.softmax(logits.float(), -1)


class FirstToken:
    """Reward 1 when a completion starts with ``token``: the expected reward is p(token | prompt), optimum 1."""

    __name__ = "first_token"

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, completions, completion_ids, **kwargs):
        return [float(bool(ids) and ids[0] == self.token) for ids in completion_ids]


@pytest.mark.heavy
def test_grpo_raises_the_expected_reward_on_a_toy_task_and_trains_only_the_adapter(tiny_chat_model_dir, tmp_path):
    L.seed_everything(0)
    module = ProxyGRPO(
        model=tiny_chat_model_dir,
        lora=LORA,
        rewards=[FirstToken(0)],  # placeholder, replaced below once the prompt's distribution is known
        num_generations=8,
        max_completion_length=2,
        beta=0.0,
        optimizer=partial(torch.optim.AdamW, lr=3e-2),
    )
    prompt = torch.tensor([module.tokenizer("capital of France?")["input_ids"]])
    before = _first_token_probs(module, prompt)
    target = int(torch.argsort(before, descending=True)[2])  # sampled now and then, far from certain
    module.reward_funcs, module.reward_names = [FirstToken(target)], ["first_token"]
    frozen = {n: p.detach().clone() for n, p in module.named_parameters() if not p.requires_grad}
    lora = _lora_weights(module)
    batch = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt), "id": ["q"]}
    loader = DataLoader([batch] * 12, batch_size=None)
    quiet_trainer(tmp_path, max_steps=12).fit(module, loader)
    after = _first_token_probs(module, prompt)
    assert after[target] > before[target] + 0.2, (before[target].item(), after[target].item())
    assert any(not torch.equal(p, _lora_weights(module)[n]) for n, p in lora.items())
    assert all(torch.equal(p, dict(module.named_parameters())[n]) for n, p in frozen.items())


def _completion_batch(module: ProxyGRPO) -> tuple[torch.Tensor, torch.Tensor, int]:
    ids = torch.tensor([module.tokenizer("capital of France? <PATH confidence=0.5>capital</PATH>")["input_ids"]])
    return ids, torch.ones_like(ids), 6


@pytest.mark.heavy
def test_kl_to_the_sft_reference_is_zero_at_the_start_and_the_reference_stays_frozen(
    tiny_chat_model_dir, tiny_sft_adapter, capitals_dir, tmp_path
):
    module = ProxyGRPO(
        model=tiny_chat_model_dir,
        adapter_path=tiny_sft_adapter,
        num_generations=2,
        max_completion_length=8,
        optimizer=partial(torch.optim.AdamW, lr=1e-2),
    )
    ids, mask, width = _completion_batch(module)
    module.model.eval()
    policy = module.completion_log_probs(ids, mask, width).detach()
    reference = module.completion_log_probs(ids, mask, width, reference=True)
    torch.testing.assert_close(policy, reference, rtol=0, atol=1e-6)
    with module.model.disable_adapter(), torch.no_grad():  # the reference is the SFT model, not the base
        base = module.completion_log_probs(ids, mask, width)
    assert (base - reference).abs().max() > 1e-3
    ref_weights = _lora_weights(module, "reference")
    assert ref_weights and all(not p.requires_grad for n, p in module.named_parameters() if ".reference." in n)

    dm = ProxyGRPODataModule(
        tokenizer=tiny_chat_model_dir, data_dir=capitals_dir, cache_dir=str(tmp_path / "cache"), batch_size=3
    )
    quiet_trainer(tmp_path, max_steps=3, limit_val_batches=1).fit(module, dm)
    after = module.completion_log_probs(ids, mask, width).detach()
    assert (after - module.completion_log_probs(ids, mask, width, reference=True)).abs().max() > 1e-4
    assert all(torch.equal(p, _lora_weights(module, "reference")[n]) for n, p in ref_weights.items())
    metrics = module.trainer.callback_metrics
    for key in ("train/reward", "train/rewards/evidence_reward", "train/kl", "train/invalid_rate",
                "train/completion_length", "val/reward", "val/invalid_rate"):  # fmt: skip
        assert key in metrics and math.isfinite(float(metrics[key])), key
    assert float(metrics["train/kl"]) > 0
    module.save_adapter(str(tmp_path / "grpo_adapter"))
    assert (tmp_path / "grpo_adapter" / "adapter_config.json").is_file()
    assert not (tmp_path / "grpo_adapter" / "reference").exists()  # only the policy is saved
    reloaded = ProxyGRPO(model=tiny_chat_model_dir, adapter_path=str(tmp_path / "grpo_adapter"))
    reloaded.model.eval()
    torch.testing.assert_close(reloaded.completion_log_probs(ids, mask, width).detach(), after)


def test_datamodule_items_carry_gold_evidence_and_tries(tiny_chat_model_dir, capitals_dir, tmp_path):
    dm = ProxyGRPODataModule(
        tokenizer=tiny_chat_model_dir,
        data_dir=capitals_dir,
        cache_dir=str(tmp_path / "cache"),
        batch_size=4,
        trie=TrieConfig(max_hops=2),
        trie_cache=2,
    )
    dm.prepare_data()
    dm.setup("fit")
    assert not dm._tries  # built per batch, not for every question up front
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 4 and len(batch["tries"]) == 4
    assert len(dm._tries) == 2  # the last trie_cache tries are kept
    by_id = {it["id"]: it for it in dm.datasets["train"]}
    again = dm.collate([by_id[i] for i in batch["id"]])["tries"]  # rebuilt or cached: the same tries
    assert [t.bodies() for t in again] == [t.bodies() for t in batch["tries"]]
    dm.setup("predict")  # predict (and compare-proxies) decode through the tries too
    assert len(next(iter(dm.predict_dataloader()))["tries"]) == 4
    gold = batch["gold_evidence"][0]
    assert {"items": ["capital"], "confidence": 0.75, "f1": 1.0} in gold
    text = dm.tokenizer.decode(batch["input_ids"][0], skip_special_tokens=True)
    assert "enhanced relation path" in text  # App. A.2's RL instruction by default
    assert dm.grpo_stats["train"].prompts == 6


def test_questions_without_evidence_are_skipped_and_counted(tiny_chat_model_dir, capitals_dir, tmp_path):
    dm = ProxyGRPODataModule(
        tokenizer=tiny_chat_model_dir, data_dir=capitals_dir, cache_dir=str(tmp_path / "cache"), max_length=5
    )
    with pytest.raises(ValueError, match="gives no GRPO prompt: train: 6 records, 0 prompts, 0 without evidence"):
        dm.build_split("train")
    assert len(dm.grpo_stats["train"].too_long) == 6


def test_bad_rewards_and_empty_batches_never_crash_or_give_nan(tiny_chat_model_dir, tmp_path):
    def picky(completions, **kwargs):  # unscorable (None / NaN) for most completions
        return [None if i % 3 else (math.nan if i % 2 else 1.0) for i in range(len(completions))]

    module = ProxyGRPO(
        model=tiny_chat_model_dir, lora=LORA, rewards=[picky], num_generations=4, max_completion_length=3
    )
    prompt = torch.tensor([module.tokenizer("capital of Peru?")["input_ids"]] * 2)
    batch = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt), "id": ["a", "b"]}
    losses = []
    loss, stats = module.grpo_step(batch, backward=lambda x: losses.append(x) or x.backward())
    assert torch.isfinite(loss) and len(losses) == 1
    assert stats.reduce()["unscorable"].total == 6  # 8 completions, 2 of them scored
    empty = {"input_ids": torch.zeros(0, 3, dtype=torch.long), "attention_mask": torch.zeros(0, 3), "id": []}
    losses.clear()
    loss, stats = module.grpo_step(empty, backward=lambda x: losses.append(x) or x.backward())
    # an empty batch still takes one backward per micro-batch (DDP reduces the same buckets on every process)
    assert loss.item() == 0 and len(losses) == 1 and losses[0].item() == 0
    assert stats.reduce()["reward"].count == 0

    def short(completions, **kwargs):
        return [1.0]

    module.reward_funcs, module.reward_names = [short], ["short"]
    with pytest.raises(ValueError, match="'short' returned 1 rewards for 8 completions"):
        module.grpo_step(batch, backward=lambda x: x.backward())


def test_rollouts_sample_from_the_distribution_grpo_optimises(tiny_chat_model_dir):
    """Under a checkpoint whose generation config samples otherwise (top_k 2, repetition penalty, temperature 0.3),
    the rollouts' sampling log-probabilities equal the policy's forward-pass log-probabilities at the module's
    temperature, which the GRPO loss uses."""
    from transformers import GenerationConfig

    from kglightning.modules.grpo_objective import completion_mask

    module = ProxyGRPO(
        model=tiny_chat_model_dir, lora=LORA, num_generations=4, max_completion_length=6, temperature=0.7
    )
    tok = module.tokenizer
    base = module.model.get_base_model()
    base.generation_config = GenerationConfig(
        repetition_penalty=3.0, top_k=2, temperature=0.3, do_sample=True, no_repeat_ngram_size=1,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    prompt = torch.tensor([tok("capital of Peru?")["input_ids"]])
    config = module.rollout_config()
    config.update(output_scores=True, return_dict_in_generate=True)
    torch.manual_seed(0)
    out = module.run_generate(prompt, torch.ones_like(prompt), config)
    completions = out.sequences[:, prompt.shape[1] :]
    sampled = torch.log_softmax(torch.stack(out.scores, dim=1).float(), -1).gather(-1, completions[..., None])[..., 0]
    mask = completion_mask(completions, tok.eos_token_id).bool()
    ids = torch.cat([prompt.repeat(4, 1), completions], dim=1)
    attention = torch.cat([torch.ones_like(prompt).repeat(4, 1), mask.long()], dim=1)
    module.model.eval()
    with torch.no_grad():
        forward = module.completion_log_probs(ids, attention, completions.shape[1])
    torch.testing.assert_close(sampled[mask], forward[mask], rtol=1e-4, atol=1e-4)


def _ddp_worker():
    here = str(Path(__file__).parent)
    if here not in sys.path:
        sys.path.insert(0, here)  # spawned children inherit sys.path, so they can import it too
    return importlib.import_module("_grpo_ddp_worker")


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_micro_batches_give_the_gradient_of_the_whole_batch(loss_type, tiny_chat_model_dir):
    w = _ddp_worker()
    whole = w.step(tiny_chat_model_dir, [0, 1], loss_type, "batch", micro=1)
    split = w.step(tiny_chat_model_dir, [0, 1], loss_type, "batch", micro=3)  # 8 completions: 3 + 3 + 2
    assert any(g.abs().max() > 0 for g in whole["grads"].values())
    for name, g in whole["grads"].items():
        torch.testing.assert_close(split["grads"][name], g, rtol=1e-4, atol=1e-7)
    for name, value in whole["stats"].items():
        assert split["stats"][name] == pytest.approx(value, rel=1e-5, abs=1e-7), name


def test_logged_statistics_follow_trl(tiny_chat_model_dir):
    """reward_std is the std of every scored reward (TRL's nanstd), frac_reward_zero_std the share of completions
    whose advantage scale is 0 (the batch's std under scale_rewards="batch"), and kl is logged only with beta > 0."""
    w = _ddp_worker()
    for scale in ("group", "batch"):
        module = w.build(tiny_chat_model_dir, "grpo", scale)
        roll = w.fixed_rollouts(module, [0, 1])
        module.rollouts = lambda batch, greedy=False, r=roll: r  # type: ignore[method-assign]
        stats = {k: v.mean for k, v in module.grpo_step({}, backward=lambda loss: None)[1].reduce().items() if v.count}
        rewards = roll.rewards[~torch.isnan(roll.rewards)]
        assert stats["reward_std"] == pytest.approx(float(rewards.std()), rel=1e-5)
        groups = roll.rewards.view(-1, 4)
        flat_groups = [bool(torch.isclose(g[~torch.isnan(g)].std(), torch.zeros(()))) if (~torch.isnan(g)).sum() > 1
                       else True for g in groups]  # fmt: skip
        want = 0.0 if scale == "batch" else sum(flat_groups) / len(flat_groups)
        assert stats["frac_reward_zero_std"] == pytest.approx(want)
        assert "kl" in stats
    module = w.build(tiny_chat_model_dir, "grpo", "group", beta=0.0)
    roll = w.fixed_rollouts(module, [0, 1])
    module.rollouts = lambda batch, greedy=False: roll  # type: ignore[method-assign]
    assert "kl" not in module.grpo_step({}, backward=lambda loss: None)[1].reduce()


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_two_processes_give_the_global_statistics_and_gradients_of_one(tiny_chat_model_dir, tmp_path):
    """TRL's semantics under DDP: ``scale_rewards="batch"`` divides by the std of every process's rewards, ``dapo``
    by the global token count, and the logged statistics are global means."""
    w = _ddp_worker()
    expected = {config: w.step(tiny_chat_model_dir, [0, 1], *config) for config in w.CONFIGS}
    assert expected[("dapo", "batch")]["stats"]["unscorable"] == 1
    mp.spawn(w.stats_worker, args=(2, str(tmp_path / "init"), tiny_chat_model_dir, expected), nprocs=2, join=True)


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_an_empty_batch_on_one_process_neither_hangs_nor_splits_ddp(tiny_chat_model_dir, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    w = _ddp_worker()
    mp.spawn(w.trainer_worker, args=(2, port, tiny_chat_model_dir, str(tmp_path)), nprocs=2, join=True)
    first, second = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert first["step"] == second["step"] == 2 and (first["skipped"], second["skipped"]) == (0, 1)
    for name, weight in first["weights"].items():
        torch.testing.assert_close(second["weights"][name], weight, rtol=0, atol=0)


def test_argument_checks(tiny_chat_model_dir):
    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        ProxyGRPO(model=tiny_chat_model_dir, num_generations=1)
    with pytest.raises(ValueError, match="2 reward_weights for 1 reward functions"):
        ProxyGRPO(model=tiny_chat_model_dir, reward_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="loss_type"):
        ProxyGRPO(model=tiny_chat_model_dir, loss_type="ppo")  # type: ignore[arg-type]


@pytest.mark.e2e
def test_cli_fit_from_an_tiny_sft_adapter_and_under_ddp(tiny_chat_model_dir, tiny_sft_adapter, capitals_dir, tmp_path):
    """configs/proxy_grpo.yaml as a user runs it, on a tiny model: one process, then DDP on 2 CPU processes."""
    import csv
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    args = [
        sys.executable, "-m", "kglightning", "fit", "--config", str(root / "configs/proxy_grpo.yaml"),
        "--model.init_args.model", tiny_chat_model_dir, "--model.init_args.adapter_path", tiny_sft_adapter,
        "--model.init_args.max_completion_length", "8", "--model.init_args.optimizer.init_args.lr", "0.01",
        "--data.init_args.data_dir", capitals_dir, "--data.init_args.trie", "{max_hops: 2}",
        "--data.init_args.batch_size", "2", "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "1",
    ]  # fmt: skip
    env = dict(os.environ, KGLIGHTNING_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", PYTHONPATH=str(root))
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = tmp_path / "outputs/proxy_grpo"
    assert (out / "adapter/adapter_config.json").is_file() and (out / "checkpoints/last.ckpt").is_file()
    rows = list(csv.DictReader((out / "smollm2_lora/version_0/metrics.csv").open()))
    logged = {k for row in rows for k, v in row.items() if v}
    assert {"train/reward_step", "train/kl_step", "train/invalid_rate_step", "val/reward"} <= logged
    steps = [row for row in rows if row.get("train/reward_step")]
    assert len(steps) == 3  # 6 questions, 2 per step
    ddp = [*args, "--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu",
           "--trainer.logger.init_args.name", "ddp"]  # fmt: skip
    proc = subprocess.run(ddp, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "MEMBER: 2/2" in proc.stderr + proc.stdout
    rows = list(csv.DictReader((out / "ddp/version_0/metrics.csv").open()))
    assert len([row for row in rows if row.get("train/reward_step")]) == 2  # 6 questions over 2 ranks, 2 per step
