"""RelationScorer on a tiny random 1-layer sentence encoder: fit lowers the loss, export reloads, clear errors."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from kglightning.data.embeddings import SentenceEncoder
from kglightning.data.relation_pairs import RelationPair, collate_pairs
from kglightning.modules import RelationScorer
from kglightning.modules.relation_scorer import cosine_similarity_loss

QUESTIONS = {
    "what is the capital of France?": "location country capital",
    "which currency does Japan use?": "location country currency used",
    "what languages are spoken in Peru?": "location country languages spoken",
    "who discovered Radium?": "chemistry chemical element discoverer",
}


def _pairs() -> list[RelationPair]:
    out = []
    for i, (q, gold) in enumerate(QUESTIONS.items()):
        out.append(RelationPair(q, gold, 1.0, f"q{i}"))
        out += [RelationPair(q, r, 0.0, f"q{i}") for r in QUESTIONS.values() if r != gold]
    return out


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _mse(module: RelationScorer, batch: dict) -> float:
    module.eval()
    with torch.no_grad():
        return float(((module(batch["query"], batch["relation"]) - batch["label"]) ** 2).mean())


@pytest.fixture(scope="module")
def fitted(tiny_encoder_dir, tmp_path_factory):
    """A scorer after 30 steps on the hand-made pairs, with its loss and weights before training."""
    L.seed_everything(0)
    tmp = tmp_path_factory.mktemp("relation_scorer")
    export_dir = tmp / "encoder"
    module = RelationScorer(
        model=tiny_encoder_dir,
        optimizer=partial(torch.optim.AdamW, lr=3e-3, weight_decay=0.01),
        warmup_ratio=0.1,
        export_dir=str(export_dir),
    )
    full = collate_pairs(_pairs())
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    loss_before = _mse(module, full)
    module.train()
    loader = DataLoader(_pairs(), batch_size=8, shuffle=True, collate_fn=collate_pairs)
    val = DataLoader(_pairs(), batch_size=8, collate_fn=collate_pairs)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=30,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
    )
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=val)
    return module, trainer, before, loss_before, full, export_dir


@pytest.mark.heavy
def test_fit_lowers_the_loss_and_changes_the_weights(fitted):
    module, trainer, before, loss_before, full, _ = fitted
    assert _mse(module, full) < 0.5 * loss_before
    changed = [k for k, v in module.state_dict().items() if k in before and not torch.equal(v, before[k])]
    assert any(k.startswith("encoder.") for k in changed)
    assert {"train/loss", "val/loss", "val/pair_auc"} <= set(trainer.callback_metrics)
    assert float(trainer.callback_metrics["val/pair_auc"]) > 0.9


def test_weights_are_in_the_checkpoint_state(fitted):
    module = fitted[0]
    keys = [k for k in module.state_dict() if k.startswith("encoder.")]
    assert len(keys) > 10


def test_export_loads_in_sentence_encoder(fitted, tmp_path):
    module, _, _, _, full, export_dir = fitted
    assert (export_dir / "modules.json").is_file()  # written by on_fit_end
    module.eval()
    texts = list(dict.fromkeys(full["query"] + full["relation"]))
    with torch.no_grad():
        ours = torch.nn.functional.normalize(module.embed(texts), dim=-1)
    for folder in (export_dir, Path(module.export(tmp_path / "again"))):
        loaded = SentenceEncoder(model=str(folder), show_progress=False).encode(texts)
        torch.testing.assert_close(loaded, ours, atol=1e-5, rtol=1e-4)


def test_forward_dedupes_repeated_texts(fitted):
    module = fitted[0]
    module.eval()
    with torch.no_grad():
        once = module.embed(["a b", "c"])
        many = module.embed(["c", "a b", "c", "a b"])
        scores = module(["a b", "c"], ["c", "c"])
    torch.testing.assert_close(many, once[[1, 0, 1, 0]])
    assert scores.shape == (2,) and float(scores[1]) == pytest.approx(1.0, abs=1e-5)


def test_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        RelationScorer(model=str(tmp_path / "nope"))


def test_the_unused_pooler_is_frozen_so_ddp_can_run(tiny_encoder_dir):
    """BERT's pooler is not part of a mean-pooled sentence embedding: left trainable it gets no gradient, and DDP stops
    at the first step ("parameters that were not used in producing the loss")."""
    module = RelationScorer(model=tiny_encoder_dir)
    assert module.frozen and all(".pooler." in name for name in module.frozen)
    loss = cosine_similarity_loss(module(["capital of France?"], ["location country capital"]), torch.tensor([1.0]))
    loss.backward()
    assert all(p.grad is not None for p in module.parameters() if p.requires_grad)


@pytest.mark.parametrize("which", ["best", "last"])
def test_the_export_is_the_best_checkpoint_unless_last_is_asked(tiny_encoder_dir, tmp_path, which):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from kglightning.data import SentenceEncoder

    L.seed_everything(0)
    module = RelationScorer(model=tiny_encoder_dir, optimizer=partial(torch.optim.AdamW, lr=3e-3),
                            export_dir=str(tmp_path / "encoder"), export=which)  # fmt: skip

    class EpochScore(L.Callback):  # "best" is the first epoch's checkpoint
        def on_validation_epoch_end(self, trainer, pl_module):
            pl_module.log("epoch_score", float(trainer.current_epoch))

    first = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="epoch_score", mode="min")
    loader = DataLoader(_pairs(), batch_size=8, shuffle=True, collate_fn=collate_pairs)
    val = DataLoader(_pairs(), batch_size=8, collate_fn=collate_pairs)
    trainer = L.Trainer(accelerator="cpu", max_epochs=3, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0,
                        callbacks=[EpochScore(), first])  # fmt: skip
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=val)
    last = {k: v.clone() for k, v in module.state_dict().items()}
    best = torch.load(first.best_model_path, weights_only=False)["state_dict"]
    assert "epoch=0" in first.best_model_path
    texts = ["capital of France?", "location.country.capital"]
    exported = SentenceEncoder(str(tmp_path / "encoder"), show_progress=False).encode(texts)
    want = best if which == "best" else last
    module.load_state_dict(want)
    module.eval()
    with torch.no_grad():
        assert torch.allclose(exported, torch.nn.functional.normalize(module.embed(texts), dim=-1), atol=1e-5)
    module.load_state_dict(last)
    assert any(not torch.equal(best[k], last[k]) for k in best)  # the two exports differ
