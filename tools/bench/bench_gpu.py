"""GPU benchmarks for BENCHMARKS.md: what a CPU cannot show (bf16 steps, GPU encoding rate, peak GPU memory).

Models are built from configs with the shapes of the real ones and random weights (nothing is downloaded, and the
bundled files do not travel to a lent GPU machine): SmolLM2-135M's Llama shape for the LLM steps and
all-MiniLM-L6-v2's BERT shape for encoding. Random weights cost the same time and memory as trained ones. Rows:

* proxy SFT step, ``--sft-batch`` x ``--sft-tokens`` tokens, LoRA r=16, bf16-mixed vs fp32 (forward, backward, AdamW);
* GRPO step (``ProxyGRPO.grpo_step``: reference and policy forwards, backward) on ``B*G`` fixed completions, with
  ``steps_per_generation`` 1 and 4;
* detector epoch (GraphTransformer, hidden 128 as in configs/detector.yaml) over random graphs of the embedded
  benchmark's size, bf16-mixed vs fp32;
* text encoding rate of the MiniLM-shaped encoder (texts/s, fp32 and bf16 autocast).

Each row reports the median of ``--repeats`` timed runs after one warm-up, and the peak memory
(``torch.cuda.max_memory_allocated``). ``--smoke`` runs every row at toy sizes on whatever device is there (a check
of this script, not a measurement).

    python tools/bench/bench_gpu.py [--repeats 5] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152)  # fmt: skip
TOY_LLM = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=1024)  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(fn: Callable[[], Any], device: torch.device, repeats: int) -> tuple[float, float]:
    """Median seconds of ``repeats`` calls after one warm-up, and the peak memory (MB) over them."""
    fn()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")
    return statistics.median(times), peak


def _llm_dir(shape: dict[str, int]) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    from kglightning.testing import tiny_bpe_tokenizer

    root = tempfile.mkdtemp(prefix="bench_gpu_llm_")
    tok = tiny_bpe_tokenizer(["what is the capital of France? Paris is the capital of France."] * 4, vocab_size=300)
    tok.save_pretrained(root)
    config = LlamaConfig(**shape, max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(root)
    return root


def sft_step(args: argparse.Namespace, device: torch.device, model_dir: str) -> list[str]:
    from kglightning.llm.lora import LoRASettings
    from kglightning.modules import ProxySFT

    module = ProxySFT(model=model_dir, lora=LoRASettings(r=16, lora_alpha=32)).to(device)
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-4)
    vocab = module.model.config.vocab_size
    ids = torch.randint(vocab, (args.sft_batch, args.sft_tokens), device=device)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    rows = []
    for precision in ("bf16", "fp32"):

        def step(precision: str = precision) -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = module._loss(batch)
            loss.backward()
            opt.step()
            opt.zero_grad()

        seconds, peak = _measure(step, device, args.repeats)
        tokens = args.sft_batch * args.sft_tokens
        rows.append(f"| proxy SFT step, {args.sft_batch}x{args.sft_tokens} tokens, {precision} | {seconds:.3f} s "
                    f"({tokens / seconds:,.0f} tokens/s) | {peak:,.0f} MB |")  # fmt: skip
    return rows


def grpo_step(args: argparse.Namespace, device: torch.device, model_dir: str) -> list[str]:
    from kglightning.llm.lora import LoRASettings
    from kglightning.modules import ProxyGRPO
    from kglightning.modules.grpo_rollouts import Rollouts

    rows = []
    for micro in (1, 4):
        torch.manual_seed(0)
        module = ProxyGRPO(model=model_dir, lora=LoRASettings(r=16, lora_alpha=32), num_generations=args.generations,
                           max_completion_length=args.tokens, steps_per_generation=micro).to(device)  # fmt: skip
        n, vocab = args.prompts * args.generations, module.model.config.vocab_size
        ids = torch.randint(vocab, (n, 64 + args.tokens), device=device)
        mask = torch.ones(n, args.tokens, dtype=torch.long, device=device)
        rewards = torch.rand(n, 1, device=device)
        roll = Rollouts(ids, torch.ones_like(ids), mask, rewards, rewards[:, 0], [""] * n)
        module.rollouts = lambda batch, greedy=False, roll=roll: roll

        def step(module: Any = module) -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                module.grpo_step({}, backward=lambda loss: loss.backward())
            module.zero_grad(set_to_none=True)

        seconds, peak = _measure(step, device, args.repeats)
        rows.append(f"| GRPO loss step, {n} completions x {args.tokens} tokens, steps_per_generation={micro}, bf16 "
                    f"| {seconds:.3f} s | {peak:,.0f} MB |")  # fmt: skip
    return rows


def detector_epoch(args: argparse.Namespace, device: torch.device) -> list[str]:
    from torch_geometric.data import Batch, Data

    from kglightning.modules import HallucinationDetector
    from kglightning.nn import GraphTransformerEncoder

    gen = torch.Generator().manual_seed(0)
    graphs = []
    for _ in range(args.graphs):
        n, e, a = 40, 80, 3
        graphs.append(Data(
            x_text=torch.randn(n, 384, generator=gen), topic_mask=torch.arange(n) == 0,
            answer_mask=(torch.arange(n) > 0) & (torch.arange(n) <= a), edge_index=torch.randint(n, (2, e), generator=gen),
            edge_text_emb=torch.randn(e, 384, generator=gen), edge_kind=torch.randint(2, (e,), generator=gen),
            answer_index=torch.arange(1, a + 1), question=torch.randn(a, 384, generator=gen),
            y=torch.randint(2, (a,), generator=gen).float(), num_nodes=n,
        ))  # fmt: skip
    batches = [Batch.from_data_list(graphs[i : i + 32]).to(device) for i in range(0, len(graphs), 32)]
    rows = []
    for precision in ("bf16", "fp32"):
        torch.manual_seed(0)
        model = HallucinationDetector(encoder=partial(GraphTransformerEncoder, hidden_channels=128, heads=8),
                                      mlp_hidden=128).to(device)  # fmt: skip
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)

        def epoch(model: Any = model, opt: Any = opt, precision: str = precision) -> None:
            for batch in batches:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch).float(), batch.y)
                loss.backward()
                opt.step()
                opt.zero_grad()

        seconds, peak = _measure(epoch, device, args.repeats)
        rows.append(f"| detector epoch, {args.graphs:,} graphs, GraphTransformer h128, {precision} | {seconds:.2f} s "
                    f"| {peak:,.0f} MB |")  # fmt: skip
    return rows


def encoding_rate(args: argparse.Namespace, device: torch.device) -> list[str]:
    from transformers import BertConfig, BertModel

    shape = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    if args.smoke:
        shape = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=30522, **shape)).to(device).eval()
    ids = torch.randint(30522, (256, 16), device=device)  # 256 node/relation names of 16 word pieces
    rows = []
    for precision in ("bf16", "fp32"):

        def encode(precision: str = precision) -> None:
            with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                for _ in range(args.encode_batches):
                    model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.mean(1)

        seconds, peak = _measure(encode, device, args.repeats)
        rate = 256 * args.encode_batches / seconds
        rows.append(f"| MiniLM-L6 encoding, batches of 256 x 16 tokens, {precision} | {rate:,.0f} texts/s "
                    f"| {peak:,.0f} MB |")  # fmt: skip
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sft-batch", type=int, default=8)
    p.add_argument("--sft-tokens", type=int, default=512)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--graphs", type=int, default=3000)
    p.add_argument("--encode-batches", type=int, default=40)
    p.add_argument("--smoke", action="store_true", help="toy sizes on any device: checks the script, measures nothing")
    args = p.parse_args()
    if args.smoke:
        args.repeats, args.sft_batch, args.sft_tokens, args.graphs, args.encode_batches = 1, 2, 16, 64, 2
        args.prompts, args.generations, args.tokens = 2, 2, 8
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark is for a GPU machine (--smoke checks the script anywhere)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke run)"
    model_dir = _llm_dir(TOY_LLM if args.smoke else SMOLLM2_135M)
    print(f"{name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    print("| what | time | peak GPU memory |\n|---|---:|---:|")
    for rows in (sft_step(args, device, model_dir), grpo_step(args, device, model_dir), detector_epoch(args, device),
                 encoding_rate(args, device)):  # fmt: skip
        print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
