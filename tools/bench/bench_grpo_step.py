"""GRPO benchmark: ProxyGRPO under Lightning vs a plain ``trl.GRPOTrainer`` step, same model, prompts and reward.

Both sides train a fresh LoRA (r=8 on q/k/v/o) of the same base model (default the bundled SmolLM2-135M-Instruct)
on the same ``--prompts`` questions of the embedded benchmark (App. A.2's RL prompt in the chat template), with
``--generations`` completions of at most ``--tokens`` tokens per prompt, ``EvidenceReward``, beta 0.01 (the
reference is the base model with the adapter disabled, as TRL does with a PEFT model) and lr 1.41e-5. Each side runs
in its own fresh process (so that peak memory is its own), one after the other, ``--repeats`` times with the order
alternating. Reported per side:

* rollout throughput: completions per second of sampling alone (ours: ``ProxyGRPO.rollout``; TRL: the generation
  time TRL itself logs, ``profiling/Time taken: GRPOTrainer._generate``... when present, else not reported);
* GRPO step time: one optimisation step including sampling, rewards, the policy and reference forwards, backward
  and AdamW (ours: Lightning batch start to end; TRL: ``on_step_begin`` to ``on_step_end``), the first step dropped;
* peak memory: the process's peak RSS on CPU, ``torch.cuda.max_memory_allocated`` on a GPU.

    python tools/bench/bench_grpo_step.py [--prompts 4 --generations 4 --tokens 48 --steps 3 --repeats 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import time
from functools import partial
from typing import Any


def _prompts(n: int) -> list[dict[str, Any]]:
    from kglightning.datamodules import ProxyGRPODataModule

    dm = ProxyGRPODataModule(max_records=4 * n, batch_size=n)
    items = dm.build_split("train")[:n]
    text = [dm.tokenizer.decode(it["prompt_ids"]) for it in items]
    return [
        {"prompt": t, "prompt_ids": it["prompt_ids"], "gold_evidence": it["gold_evidence"]}
        for t, it in zip(text, items)
    ]


def _peak_mb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _ours(args: argparse.Namespace, prompts: list[dict[str, Any]]) -> dict[str, Any]:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    from kglightning.datamodules.sft_examples import collate_prompts
    from kglightning.modules import ProxyGRPO

    module = ProxyGRPO(
        num_generations=args.generations,
        max_completion_length=args.tokens,
        optimizer=partial(torch.optim.AdamW, lr=1.41e-5),
    )
    pad = module.tokenizer.pad_token_id
    batch = collate_prompts([{**p, "id": str(i), "question": ""} for i, p in enumerate(prompts)], pad)
    batch["gold_evidence"] = [p["gold_evidence"] for p in prompts]
    batch["tries"] = None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    module.to(device)
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    start = time.perf_counter()
    out = module.rollout(ids, mask)
    rollout_s = time.perf_counter() - start

    class Timer(L.Callback):
        times: list[float] = []

        def on_train_batch_start(self, *a: Any) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, *a: Any) -> None:
            self.times.append(time.perf_counter() - self.start)

    timer = Timer()
    trainer = L.Trainer(
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        accelerator="auto",
        devices=1,
        callbacks=[timer],
    )
    trainer.fit(module, train_dataloaders=DataLoader([batch] * args.steps, batch_size=None))
    return {"rollout_cps": out.shape[0] / rollout_s, "steps": timer.times, "peak_mb": _peak_mb()}


def _trl(args: argparse.Namespace, prompts: list[dict[str, Any]]) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from kglightning.datamodules.sft import sft_tokenizer
    from kglightning.evidence import EvidenceReward
    from kglightning.llm.backends.local_hf import BUNDLED_SMOLLM2, load_causal_lm
    from kglightning.llm.lora import LoRASettings

    tokenizer = sft_tokenizer(BUNDLED_SMOLLM2)
    model = load_causal_lm(BUNDLED_SMOLLM2, None, "float32", tokenizer.pad_token_id)
    # transformers marks a model read from GGUF as quantized although its weights were de-quantized to float32,
    # and Trainer refuses to train such a model: clear the mark (ProxyGRPO trains the same float32 weights)
    model.hf_quantizer, model.is_quantized = None, False

    class Timer(TrainerCallback):
        times: list[float] = []

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.times.append(time.perf_counter() - self.start)

    rows = [{"prompt": p["prompt"], "gold_evidence": p["gold_evidence"]} for p in prompts] * args.steps
    config = GRPOConfig(
        output_dir="/tmp/bench_grpo_trl",
        per_device_train_batch_size=len(prompts) * args.generations,
        num_generations=args.generations,
        max_completion_length=args.tokens,
        max_steps=args.steps,
        learning_rate=1.41e-5,
        beta=0.01,
        loss_type="grpo",
        temperature=1.0,
        use_cpu=not torch.cuda.is_available(),
        gradient_checkpointing=False,  # ProxyGRPO does not recompute activations either
        bf16=False,  # float32 on both sides (bf16 autocast on a CPU without bf16 units is many times slower)
        fp16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    timer = Timer()
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[EvidenceReward()],
        args=config,
        train_dataset=Dataset.from_list(rows),
        peft_config=LoRASettings().to_peft(),
        callbacks=[timer],
    )
    trainer.train()
    n = len(prompts) * args.generations
    gen = [v for h in trainer.state.log_history for k, v in h.items() if "_generate" in k and "Time" in k]
    return {"rollout_cps": n / statistics.median(gen) if gen else None, "steps": timer.times, "peak_mb": _peak_mb()}


def _run(side: str, args: argparse.Namespace, prompts: list[dict[str, Any]], queue: Any) -> None:
    import torch

    torch.manual_seed(0)
    queue.put((_ours if side == "kglightning" else _trl)(args, prompts))


def _summary(side: str, runs: list[dict[str, Any]]) -> str:
    steps = [t for run in runs for t in run["steps"][1:]] or [t for run in runs for t in run["steps"]]
    cps = [run["rollout_cps"] for run in runs if run["rollout_cps"]]
    rollout = f"{statistics.median(cps):.2f} completions/s" if cps else "n/a"
    peak = max(run["peak_mb"] for run in runs)
    all_steps = ", ".join(f"{t:.1f}" for run in runs for t in run["steps"])
    return (
        f"{side}: step {statistics.median(steps):.2f} s (median of {len(steps)}; all: {all_steps}), "
        f"rollout {rollout}, peak {peak:.0f} MB"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--sides", nargs="+", default=["kglightning", "trl"], choices=["kglightning", "trl"])
    args = p.parse_args()
    prompts = _prompts(args.prompts)
    ctx = mp.get_context("spawn")
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in args.sides}
    print(f"{args.prompts} prompts x {args.generations} completions of <= {args.tokens} tokens, {args.steps} steps")
    for r in range(args.repeats):
        for side in args.sides if r % 2 == 0 else args.sides[::-1]:
            queue = ctx.Queue()
            proc = ctx.Process(target=_run, args=(side, args, prompts, queue))
            proc.start()
            while proc.is_alive() and queue.empty():
                proc.join(timeout=5)
            if queue.empty():
                raise SystemExit(f"the {side} run died (exit code {proc.exitcode}); see its output above")
            results[side].append(queue.get())
            proc.join()
            print(_summary(side, results[side][-1:]), flush=True)  # each run as soon as it ends
    for side, runs in results.items():
        print("overall " + _summary(side, runs))


if __name__ == "__main__":
    main()
