"""Every shipped config's module for a few steps on a GPU, in bf16-mixed, under ``strategy="ddp"`` (NCCL).

Tiny models built in the tests (nothing is downloaded): the detector (GraphTransformer and GAT, with the conformal
callback), the relation scorer, the proxy SFT, GRPO (rollouts through the KG-Trie), the SGIC calibrator and the SGIC
pipeline (its all-reduce of s̄). Each test checks that the run finishes, that the loss is finite and that the weights
live on the GPU, not what the tiny models learn (the CPU suite does that).
"""

from __future__ import annotations

import math
from functools import partial

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from kglightning.llm.lora import LoRASettings

LORA = LoRASettings(r=4, lora_alpha=8, lora_dropout=0.0)


def _ran_on(trainer: L.Trainer, device: torch.device) -> None:
    assert trainer.seen_devices == {device.type}, f"parameters and buffers were on {trainer.seen_devices}"


@pytest.mark.parametrize("name", ["graph_transformer", "gat"])
def test_detector_fit_test_predict(name, gpu_trainer, device, detection_dir, tiny_encoder_dir, tmp_path):
    from kglightning.callbacks import ConformalCallback
    from kglightning.data import SentenceEncoder
    from kglightning.datamodules import DetectionDataModule
    from kglightning.modules import HallucinationDetector
    from kglightning.nn import GATEncoder, GraphTransformerEncoder

    L.seed_everything(0)
    encoder = {"graph_transformer": GraphTransformerEncoder, "gat": GATEncoder}[name]
    dm = DetectionDataModule(
        data_dir=detection_dir, encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
        cache_dir=str(tmp_path / "cache"), batch_size=8,
    )  # fmt: skip
    model = HallucinationDetector(text_dim=32, encoder=partial(encoder, hidden_channels=32, heads=4), mlp_hidden=32)
    conformal = ConformalCallback(alpha=0.2, fit_on="validation")
    trainer = gpu_trainer(max_epochs=2, callbacks=[conformal], num_sanity_val_steps=1)
    trainer.fit(model, dm)
    (results,) = trainer.test(model, dm, verbose=False)
    rows = [row for batch in trainer.predict(model, dm) for row in batch]
    _ran_on(trainer, device)  # the threshold buffer too
    assert 0 <= results["test/f1"] <= 1 and 0 <= results["test/auc_pr"] <= 1
    assert conformal.n_cal > 0
    assert rows and all("conformal_set" in row for row in rows)


def test_relation_scorer_fit(gpu_trainer, device, tiny_encoder_dir, tmp_path):
    from kglightning.data.relation_pairs import RelationPair, collate_pairs
    from kglightning.modules import RelationScorer

    pairs = [RelationPair(f"capital of {c}?", r, float(i == j), f"q{i}")
             for i, c in enumerate(["France", "Peru", "Japan"])
             for j, r in enumerate(["location capital", "currency used", "languages spoken"])]  # fmt: skip
    loader = DataLoader(pairs, batch_size=4, collate_fn=collate_pairs)
    module = RelationScorer(model=tiny_encoder_dir, optimizer=partial(torch.optim.AdamW, lr=1e-3),
                            export_dir=str(tmp_path / "encoder"))  # fmt: skip
    trainer = gpu_trainer(max_steps=4, num_sanity_val_steps=0)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)
    _ran_on(trainer, device)
    assert math.isfinite(float(trainer.callback_metrics["train/loss"]))
    assert "val/pair_auc" in trainer.callback_metrics


def test_proxy_sft_fit_validate_predict(gpu_trainer, device, tiny_chat_model_dir, capitals_dir, tmp_path):
    from kglightning.datamodules import ProxySFTDataModule
    from kglightning.modules import ProxySFT
    from kglightning.modules.proxy_sft import EvidenceGeneration

    dm = ProxySFTDataModule(
        tokenizer=tiny_chat_model_dir, data_dir=capitals_dir, cache_dir=str(tmp_path / "cache"), batch_size=4,
        qa_task=False,
    )  # fmt: skip
    module = ProxySFT(
        model=tiny_chat_model_dir, lora=LORA, optimizer=partial(torch.optim.AdamW, lr=1e-2),
        generation=EvidenceGeneration(max_new_tokens=12, confidence="expected"),
    )  # fmt: skip
    trainer = gpu_trainer(max_steps=2, limit_val_batches=1, num_sanity_val_steps=0)  # 6 questions: 2 batches
    trainer.fit(module, dm)
    metrics = dict(trainer.callback_metrics)  # predict clears them
    rows = [row for batch in trainer.predict(module, dm) for row in batch]  # beams, expected-confidence readout
    _ran_on(trainer, device)
    assert math.isfinite(float(metrics["train/loss_step"]))
    assert "val/evidence_valid_rate" in metrics
    assert len(rows) == 6


def test_grpo_fit_through_the_kg_trie(
    gpu_trainer, device, tiny_chat_model_dir, tiny_sft_adapter, capitals_dir, tmp_path
):
    from kglightning.datamodules import ProxyGRPODataModule
    from kglightning.llm.trie import TrieConfig
    from kglightning.modules import ProxyGRPO

    dm = ProxyGRPODataModule(
        tokenizer=tiny_chat_model_dir,
        data_dir=capitals_dir,
        cache_dir=str(tmp_path / "cache"),
        batch_size=3,
        trie=TrieConfig(max_hops=2),
    )  # fmt: skip  (6 questions: one epoch of 2 steps, then validation)
    module = ProxyGRPO(
        model=tiny_chat_model_dir, adapter_path=tiny_sft_adapter, num_generations=4, max_completion_length=16,
        steps_per_generation=2, max_grad_norm=1.0, loss_type="dapo", scale_rewards="batch",
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
    )  # fmt: skip
    trainer = gpu_trainer(max_steps=2, limit_val_batches=1, num_sanity_val_steps=0)
    trainer.fit(module, dm)
    metrics = dict(trainer.callback_metrics)  # predict clears them
    rows = [row for batch in trainer.predict(module, dm) for row in batch]  # beam search through the tries
    _ran_on(trainer, device)
    assert math.isfinite(float(metrics["train/loss_step"]))
    assert "val/reward" in metrics
    assert rows and all("evidence" in row for row in rows)


def test_sgic_calibrator_fit(gpu_trainer, device, scripted_sgic, tiny_chat_model_dir, sgic_passages_dir, tmp_path):
    from kglightning.datamodules import SGICFinetuneDataModule
    from kglightning.llm.sgic_prompt import SGICPrompt
    from kglightning.llm.sgic_rounds import SelfCalibration
    from kglightning.modules import SGICCalibrator

    engine = SelfCalibration(scripted_sgic(), rounds=2, prompt=SGICPrompt(instruction="Answer."))
    dm = SGICFinetuneDataModule(
        calibration=engine, tokenizer=tiny_chat_model_dir, source="passages", data_dir=sgic_passages_dir,
        dataset_dir=str(tmp_path / "set"), batch_size=2,
    )  # fmt: skip
    module = SGICCalibrator(model=tiny_chat_model_dir, optimizer=partial(torch.optim.AdamW, lr=1e-2), max_new_tokens=4)
    trainer = gpu_trainer(max_steps=2, limit_val_batches=1, num_sanity_val_steps=0)
    trainer.fit(module, dm)
    _ran_on(trainer, device)
    assert math.isfinite(float(trainer.callback_metrics["train/loss"]))


def test_sgic_pipeline_reduces_its_mean_over_nccl(gpu_trainer, tiny_chat_model_dir, sgic_passages_dir, tmp_path):
    from kglightning.datamodules import SGICDataModule
    from kglightning.llm.backends import LocalHFBackend
    from kglightning.llm.sgic_prompt import SGICPrompt
    from kglightning.pipelines import SGICPipeline

    backend = LocalHFBackend(tiny_chat_model_dir, show_progress=False)  # device="auto": this process's GPU
    sgic = SGICPipeline(backend, rounds=2, prompt=SGICPrompt(instruction="Answer."), output_dir=str(tmp_path / "out"))
    dm = SGICDataModule(source="passages", data_dir=sgic_passages_dir, batch_size=2)
    rows = [row for batch in gpu_trainer().predict(sgic, datamodule=dm) for row in batch]
    assert len(rows) == 2 and sgic.mean is not None and 0 < sgic.mean < 1
