"""GRPO step memory at a real vocabulary size: ProxyGRPO's micro-batched step vs one full-batch step.

The loss of a GRPO step needs the log-probability of every completion token, which comes from ``(B*G, T+1, V)``
logits: about 1.3 GB in float32 at ``B*G = 32``, ``T = 64`` and Qwen2.5's ``V = 151,936``. Side by side, each in a
fresh process so that its peak memory is its own, on the same model, prompts, completions and rewards:

* ``baseline``: the straightforward step (what ProxyGRPO did before): the reference and the policy score all
  ``B*G`` sequences in one forward each, and the log-probabilities come from a float32 ``logits / T`` copy and a
  ``logsumexp`` over the whole batch;
* ``ours S=k``: ``ProxyGRPO.grpo_step`` with ``steps_per_generation=k``: the same update in ``k`` micro-batches, the
  log-normaliser taken one sequence at a time (``token_log_probs``).

The model is a 2-layer Llama of hidden size 64 over a 151,936-token vocabulary, so the logits dominate as they do
for a 7B model at this vocabulary (there, the activations add to both sides alike). Reported: the step's time, the
peak memory of the step (RSS above the process's peak before the step on a CPU; ``max_memory_allocated`` on a GPU),
and the largest gradient difference to the baseline (the update must not change).

    python tools/bench/bench_grpo_memory.py [--prompts 4 --generations 8 --tokens 64 --vocab 151936 --micro 1 4 8]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import tempfile
import time
from typing import Any


def _model_dir(vocab: int) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kglightning.testing import tiny_bpe_tokenizer

    root = tempfile.mkdtemp(prefix="bench_grpo_memory_")
    tok = tiny_bpe_tokenizer(["what is the capital of France? Paris is the capital of France."] * 4, vocab_size=300)
    tok.save_pretrained(root)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(root)
    return root


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _setup(args: argparse.Namespace, micro: int) -> tuple[Any, Any]:
    import torch

    from kglightning.llm.lora import LoRASettings
    from kglightning.modules import ProxyGRPO
    from kglightning.modules.grpo_rollouts import Rollouts

    torch.manual_seed(0)
    module = ProxyGRPO(
        model=args.model_dir, lora=LoRASettings(r=8, lora_alpha=16, lora_dropout=0.0), num_generations=args.generations,
        max_completion_length=args.tokens, beta=0.04, steps_per_generation=micro,
    )  # fmt: skip
    device = "cuda" if torch.cuda.is_available() else "cpu"
    module.to(device)
    gen = torch.Generator().manual_seed(1)
    n = args.prompts * args.generations
    prompt = torch.randint(300, (args.prompts, 32), generator=gen).repeat_interleave(args.generations, 0)
    completions = torch.randint(args.vocab, (n, args.tokens), generator=gen)
    mask = torch.ones_like(completions)
    rewards = torch.rand(n, 1, generator=gen)
    roll = Rollouts(
        input_ids=torch.cat([prompt, completions], 1).to(device),
        attention_mask=torch.ones(n, 32 + args.tokens, dtype=torch.long, device=device),
        mask=mask.to(device),
        per_func=rewards.to(device),
        rewards=rewards[:, 0].to(device),
        texts=[""] * n,
    )
    module.rollouts = lambda batch, greedy=False: roll  # the same completions and rewards on every side
    return module, roll


def _baseline_step(module: Any, roll: Any) -> None:
    """One forward per model over the whole batch and float32 log-softmax copies of all of it."""
    import torch

    from kglightning.modules.grpo_objective import group_advantages, grpo_loss

    def log_probs(reference: bool) -> torch.Tensor:
        width = roll.mask.shape[1]
        kwargs = {"input_ids": roll.input_ids, "attention_mask": roll.attention_mask, "logits_to_keep": width + 1}
        if reference:
            with torch.no_grad(), module.model.disable_adapter():
                logits = module.model(**kwargs).logits
        else:
            logits = module.model(**kwargs).logits
        logits = logits[:, :-1].float() / module.temperature
        picked = logits.gather(-1, roll.input_ids[:, -width:].unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)

    advantages, _ = group_advantages(roll.rewards, module.num_generations)
    ref = log_probs(True)
    lp = log_probs(False)
    grpo_loss(lp, lp.detach(), advantages, roll.mask, ref, beta=module.beta).loss.backward()


def _run(side: str, micro: int, args: argparse.Namespace, queue: Any) -> None:
    import torch

    torch.set_num_threads(args.threads)
    module, roll = _setup(args, micro)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.max_memory_allocated() / 2**20
    else:
        before = _rss_mb()
    start = time.perf_counter()
    if side == "baseline":
        _baseline_step(module, roll)
    else:
        module.grpo_step({}, backward=lambda loss: loss.backward())
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _rss_mb()
    grads = {n: p.grad.detach().float().cpu() for n, p in module.named_parameters() if p.grad is not None}
    path = f"{args.model_dir}/grads-{side}-{micro}.pt"  # a file: tensors sent through a queue die with this process
    torch.save(grads, path)
    queue.put({"seconds": seconds, "step_mb": peak - before, "peak_mb": peak, "grads": path})


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--micro", type=int, nargs="+", default=[1, 4, 8], help="steps_per_generation values of ours")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    args.model_dir = _model_dir(args.vocab)
    ctx = mp.get_context("spawn")
    n = args.prompts * args.generations
    print(f"B*G = {n} completions of {args.tokens} tokens, vocabulary {args.vocab:,}")
    print("| side | step s | step peak MB | process peak MB | max grad diff vs baseline |")
    print("|---|---:|---:|---:|---:|")
    baseline = None
    for side, micro in [("baseline", 1)] + [("ours", k) for k in args.micro]:
        queue = ctx.Queue()
        proc = ctx.Process(target=_run, args=(side, micro, args, queue))
        proc.start()
        out = queue.get()
        proc.join()
        grads = torch.load(out["grads"])
        baseline = grads if baseline is None else baseline
        diff = max(float((grads[k] - g).abs().max()) for k, g in baseline.items())
        name = "baseline (one full-batch forward)" if side == "baseline" else f"ProxyGRPO, steps_per_generation={micro}"
        print(f"| {name} | {out['seconds']:.1f} | {out['step_mb']:.0f} | {out['peak_mb']:.0f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
