"""SGIC's calibrator: LoRA SFT of a causal LM on the uncertainty-aware self-calibration set (SGIC §3.3, App. A.1)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.pytorch.cli import OptimizerCallable
from torchmetrics import MeanMetric

from kglightning.llm.backends.local_hf import BUNDLED_SMOLLM2
from kglightning.llm.lora import LoRASettings
from kglightning.metrics.functional.squad import squad_exact_match
from kglightning.modules.proxy_sft import EvidenceGeneration, ProxySFT

__all__ = ["SGICCalibrator"]


class SGICCalibrator(ProxySFT):
    """Learns to answer Table 1 prompts (scored documents and earlier answers) with the calibrated answer.

    The data is :class:`~kglightning.datamodules.SGICFinetuneDataModule`. Training minimises the cross-entropy of
    the target tokens; validation and test log the loss and, on the first ``val_generate_batches`` batches, the
    exact match (SQuAD normalisation) of the greedy answer with the target (``val/em``). The adapter written to
    ``save_adapter_dir`` is what ``LocalHFBackend(adapter_path=...)`` loads for ``configs/sgic.yaml``.

    Args:
        model: the base causal LM (a folder, a ``.gguf`` file, or ``"bundled:smollm2"``).
        gguf_file: GGUF file name inside ``model``.
        dtype: weight dtype.
        lora: the adapter's shape.
        adapter_path: a PEFT adapter to start from.
        save_adapter_dir: where the adapter goes at the end of ``fit``.
        optimizer: optimizer factory over the LoRA weights; default AdamW(lr=5e-5), the paper's setting.
        max_new_tokens: longest generated answer in validation.
        val_generate_batches: validation/test batches whose prompts are also answered greedily.
    """

    def __init__(
        self,
        model: str = BUNDLED_SMOLLM2,
        gguf_file: str | None = None,
        dtype: Literal["float32", "float16", "bfloat16"] = "float32",
        lora: LoRASettings = LoRASettings(),
        adapter_path: str | None = None,
        save_adapter_dir: str | None = None,
        optimizer: OptimizerCallable | None = None,
        max_new_tokens: int = 32,
        val_generate_batches: int = 1,
    ) -> None:
        super().__init__(
            model=model,
            gguf_file=gguf_file,
            dtype=dtype,
            lora=lora,
            adapter_path=adapter_path,
            save_adapter_dir=save_adapter_dir,
            optimizer=optimizer,
            generation=EvidenceGeneration(num_evidence=1, decoding="greedy", max_new_tokens=max_new_tokens),
            val_generate_batches=val_generate_batches,
        )
        self.em = torch.nn.ModuleDict({s: MeanMetric() for s in ("val", "test")})

    def _eval_step(self, batch: dict[str, Any], batch_idx: int, stage: Literal["val", "test"]) -> None:
        size = batch["input_ids"].shape[0]
        self.log(f"{stage}/loss", self._loss(batch), batch_size=size, prog_bar=True, sync_dist=True)
        if batch_idx >= self.val_generate_batches:
            return
        prompt = batch["prompt"]
        texts, _ = self.generate_texts(prompt["input_ids"], prompt["attention_mask"], "greedy")
        answers = [" ".join(t.split("\n")[0].split()) for t in texts]
        em = [squad_exact_match(a, [gold]) for a, gold in zip(answers, batch["target"])]
        self.em[stage].update(torch.tensor(em, device=self.device))
        self.log(f"{stage}/em", self.em[stage], batch_size=len(em), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=5e-5)
        return super().configure_optimizers()
