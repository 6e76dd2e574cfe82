"""Proxy SFT step benchmark: ProxySFT's training step under Lightning vs a bare PEFT LoRA step, side by side.

Both sides train the same LoRA shape (r=8 on q/k/v/o) of the bundled SmolLM2-135M-Instruct on the same batches:
real batches of ``ProxySFTDataModule`` (the embedded benchmark, ``max_length`` 192, batch 8, right-padded, labels
``-100`` on prompt and padding), and a synthetic full-length batch (8 x 192 tokens). Per batch, in one run with the
order of the two sides alternating:

  * bare: ``peft.get_peft_model`` on the model, ``model(**batch).loss``, backward, AdamW step, zero_grad;
  * module: ``ProxySFT.training_step`` inside ``lightning.Trainer.fit`` (the loop, logging and optimizer step that a
    user's ``fit --config configs/proxy_sft.yaml`` runs), timed from batch start to batch end by a callback.

    python tools/bench/bench_proxy_step.py [--batches 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import lightning as L
import torch
from torch.utils.data import DataLoader


class _StepTimer(L.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(self, *args) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, *args) -> None:
        self.times.append(time.perf_counter() - self.start)


def _module_times(batches: list[dict]) -> list[float]:
    from kglightning.modules import ProxySFT

    timer = _StepTimer()
    module = ProxySFT(optimizer=partial(torch.optim.AdamW, lr=1e-3))
    trainer = L.Trainer(
        max_steps=len(batches),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        accelerator="cpu",
        callbacks=[timer],
    )
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    return timer.times


def _bare_times(batches: list[dict]) -> list[float]:
    from peft import get_peft_model

    from kglightning.datamodules.sft import sft_tokenizer
    from kglightning.llm.backends.local_hf import BUNDLED_SMOLLM2, load_causal_lm
    from kglightning.llm.lora import LoRASettings

    tok = sft_tokenizer(BUNDLED_SMOLLM2)
    model = get_peft_model(load_causal_lm(BUNDLED_SMOLLM2, None, "float32", tok.pad_token_id), LoRASettings().to_peft())
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    times = []
    for b in batches:
        start = time.perf_counter()
        loss = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    return times


def _real_batches(n: int) -> list[dict]:
    from kglightning.datamodules.sft import ProxyPrompt, ProxySFTDataModule

    dm = ProxySFTDataModule(
        max_records=48, max_evidence=1, max_length=192, batch_size=8, prompt_format=ProxyPrompt(system_prompt="")
    )
    dm.prepare_data()
    dm.setup("fit")
    out = []
    for batch in dm.train_dataloader():
        out.append({k: batch[k] for k in ("input_ids", "attention_mask", "labels")})
        if len(out) == n:
            break
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=4, help="real batches per side")
    args = p.parse_args()
    torch.manual_seed(0)
    real = _real_batches(args.batches)
    ids = torch.randint(0, 40000, (8, 192))
    labels = ids.clone()
    labels[:, :100] = -100
    synthetic = [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}] * 2
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"real batch shapes: {[tuple(b['input_ids'].shape) for b in real]}")
    for name, batches in (("real", real), ("synthetic 8x192", synthetic)):
        # first run of each side warms up (allocator, kernels); the second is reported; order alternates
        bare = _bare_times(batches)[1:]
        module = _module_times(batches)[1:]
        bare2 = _bare_times(batches)[1:]
        b, m = statistics.median(bare + bare2), statistics.median(module)
        print(f"{name}: bare PEFT {b:.2f} s/step, ProxySFT under Lightning {m:.2f} s/step, ratio {m / b:.2f}")


if __name__ == "__main__":
    main()
