"""ConformalCallback on the KG-Guard detector: exact qhat, test metrics, checkpoint reload, +inf sets, errors."""

from __future__ import annotations

import json
import logging
import math
from functools import partial

import lightning as L
import pytest
import torch

from kglightning.callbacks import ConformalCallback, ConformalScores, JsonlPredictionWriter
from kglightning.callbacks.conformal_items import per_unit_scores
from kglightning.conformal.functional import conformal_quantile
from kglightning.data import SentenceEncoder
from kglightning.datamodules import DetectionDataModule
from kglightning.metrics.functional.coverage import covered
from kglightning.modules import HallucinationDetector
from kglightning.nn import GraphTransformerEncoder

ENCODER = partial(GraphTransformerEncoder, hidden_channels=16, heads=4)


def _apart(tmp_path):
    """A folder beside ``tmp_path``, which is the datamodule's data_dir: writers refuse outputs inside it."""
    return tmp_path.with_name(f"{tmp_path.name}-out")


def _dm(detection_dir, tiny_encoder_dir, tmp_path, batch_size=8):
    return DetectionDataModule(
        data_dir=detection_dir,
        encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
        cache_dir=str(tmp_path / "cache"),
        batch_size=batch_size,
    )


def _trainer(tmp_path, callbacks, epochs=2):
    return L.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        accelerator="cpu",
        callbacks=callbacks,
    )


def _scores(model, loader) -> ConformalScores:
    """All batches' scores, computed independently of the callback (eval mode, no grad)."""
    model.eval()
    with torch.no_grad():
        parts = [model.conformal_scores(b) for b in loader]
    cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
    return ConformalScores(cat("scores"), labels=cat("labels"), candidates=parts[0].candidates, keys=cat("keys"),
                           units=cat("units"))  # fmt: skip


def _expected_qhat(model, loader, alpha=0.2, seed=0) -> float:
    """The callback's threshold computed apart: the exact quantile of one score per question (the unit)."""
    cal = _scores(model, loader)
    return float(conformal_quantile(per_unit_scores(cal.calibration_scores("all"), cal.units, "one", seed, cal.keys),
                                    alpha))  # fmt: skip


@pytest.fixture
def fitted(detection_dir, tiny_encoder_dir, tmp_path):
    L.seed_everything(0)
    dm = _dm(detection_dir, tiny_encoder_dir, tmp_path)
    model = HallucinationDetector(text_dim=32, encoder=ENCODER, mlp_hidden=16)
    cb = ConformalCallback(alpha=0.2)
    trainer = _trainer(tmp_path, [cb])
    trainer.fit(model, dm)
    return trainer, model, dm, cb


def test_qhat_is_the_exact_quantile_of_validation_scores(fitted):
    trainer, model, dm, cb = fitted
    cal = _scores(model, dm.val_dataloader())
    n = cal.scores.shape[0]
    assert n == sum(len(g.answer_names) for g in dm.datasets["validation"])
    # hand check of the calibration score: 1 - p(true label)
    p_true = 1 - cal.scores[torch.arange(n), cal.labels.long().argmax(1)]
    assert torch.allclose(cal.calibration_scores("all"), 1 - p_true)
    # the detector's answers cluster by question: one score per question (issue 57), the rank ceil((m+1)(1-alpha))
    # over the m questions, not over the n answers
    assert cal.units.unique().numel() == len(dm.datasets["validation"]) == cb.n_cal < n
    picked = per_unit_scores(cal.calibration_scores("all"), cal.units, "one", cb.seed, cal.keys)
    assert picked.numel() == cb.n_cal and set(picked.tolist()) <= set((1 - p_true).tolist())
    expected = conformal_quantile(picked, 0.2)
    assert cb.qhat == float(expected) and math.isfinite(cb.qhat)
    assert cb.qhat == sorted(picked.tolist())[math.ceil((cb.n_cal + 1) * 0.8) - 1]


def test_test_metrics_equal_an_independent_computation(fitted):
    trainer, model, dm, cb = fitted
    results = trainer.test(model, dm, verbose=False)[0]
    test = _scores(model, dm.test_dataloader())
    # the fixture repeats some (question, answer) pairs across splits, so a test score can equal qhat exactly, and
    # float rounding (threaded scatter sums) may put it on either side: accept anything between the two readings
    for metric, value in (
        ("coverage", lambda sets: covered(sets, test.labels, "all")),
        ("set_size", lambda s: s.sum(1)),
    ):
        low, high = (value(test.scores <= cb.qhat + eps).float().mean().item() for eps in (-1e-9, 1e-9))
        assert low - 1e-6 <= results[f"test/conformal_{metric}"] <= high + 1e-6, metric
        assert high - low <= 0.1  # at most a couple of items sit on the threshold


def test_checkpoint_reload_restores_qhat_and_predict_emits_sets(fitted, tmp_path, caplog):
    trainer, model, dm, cb = fitted
    path = tmp_path / "calibrated.ckpt"
    trainer.save_checkpoint(path)
    fresh_cb = ConformalCallback(alpha=0.1)  # another alpha: the checkpoint's wins, with a warning
    assert not fresh_cb.fitted
    fresh_model = HallucinationDetector(text_dim=32, encoder=ENCODER, mlp_hidden=16)
    writer = JsonlPredictionWriter(str(_apart(tmp_path) / "preds.jsonl"))
    with caplog.at_level(logging.WARNING, logger="kglightning.callbacks.conformal"):
        preds = _trainer(tmp_path, [fresh_cb, writer]).predict(fresh_model, dm, ckpt_path=path)
    assert "fitted with alpha=0.2, not 0.1" in caplog.text
    assert fresh_cb.qhat == cb.qhat and fresh_cb.n_cal == cb.n_cal and fresh_cb.alpha == 0.2
    written = [json.loads(line) for line in (_apart(tmp_path) / "preds.jsonl").read_text().splitlines()]
    assert [w["conformal_set"] for w in written] == [r["conformal_set"] for b in preds for r in b]
    rows = [row for batch in preds for row in batch]
    assert len(rows) == len(dm.datasets["test"])
    for row in rows:
        assert len(row["conformal_set"]) == len(row["prediction"])
        assert row["conformal_qhat"] == cb.qhat and row["conformal_full_set"] is False
        for prob, labels in zip(row["hallucination_prob"], row["conformal_set"]):
            assert set(labels) <= {"faithful", "hallucinated"}
            # faithful is in the set when 1 - p(faithful) = p(hallucinated) <= qhat (up to the 6-digit rounding)
            if abs(prob - cb.qhat) > 1e-5 and abs(1 - prob - cb.qhat) > 1e-5:
                assert ("faithful" in labels) == (prob <= cb.qhat)
                assert ("hallucinated" in labels) == (1 - prob <= cb.qhat)


@pytest.mark.heavy
@pytest.mark.parametrize("writer_first", [True, False], ids=["writer-first", "conformal-first"])
def test_sets_reach_the_writer_whatever_the_callback_order(fitted, tmp_path, writer_first):
    """A prediction writer listed before the callback (as ``--trainer.callbacks+=`` puts it) still writes the sets."""
    trainer, model, dm, cb = fitted
    path = tmp_path / "calibrated.ckpt"
    trainer.save_checkpoint(path)
    fresh_cb, writer = ConformalCallback(alpha=0.2), JsonlPredictionWriter(str(_apart(tmp_path) / "preds.jsonl"))
    predictor = _trainer(tmp_path, [writer, fresh_cb] if writer_first else [fresh_cb, writer])
    preds = predictor.predict(HallucinationDetector(text_dim=32, encoder=ENCODER, mlp_hidden=16), dm, ckpt_path=path)
    written = [json.loads(line) for line in (_apart(tmp_path) / "preds.jsonl").read_text().splitlines()]
    assert len(written) == len(dm.datasets["test"])
    assert all(w["conformal_qhat"] == cb.qhat for w in written)
    assert [w["conformal_set"] for w in written] == [r["conformal_set"] for b in preds for r in b]
    assert predictor.callbacks.index(fresh_cb) < predictor.callbacks.index(writer)


class _PutsWritersFirst(L.Callback):
    """Reorders the callbacks after ConformalCallback's setup, so that a writer runs first again."""

    def setup(self, trainer, pl_module, stage):
        trainer.callbacks = sorted(trainer.callbacks, key=lambda c: not isinstance(c, JsonlPredictionWriter))


def test_a_writer_put_back_first_after_setup_is_an_error(fitted, tmp_path):
    trainer, model, dm, cb = fitted
    writer = JsonlPredictionWriter(str(_apart(tmp_path) / "preds.jsonl"))
    with pytest.raises(RuntimeError, match="JsonlPredictionWriter would write predictions before ConformalCallback"):
        _trainer(tmp_path, [cb, _PutsWritersFirst(), writer]).predict(model, dm)


def test_too_small_calibration_set_gives_full_sets(detection_dir, tiny_encoder_dir, tmp_path, caplog):
    L.seed_everything(0)
    dm = _dm(detection_dir, tiny_encoder_dir, tmp_path)
    dm.setup("fit")
    model = HallucinationDetector(text_dim=32, encoder=ENCODER, mlp_hidden=16)
    cb = ConformalCallback(alpha=0.1, fit_on="manual")
    one_graph = [dm.collate(dm.datasets["validation"][:1])]  # 1-2 items: rank ceil((n+1)0.9) > n
    with caplog.at_level(logging.WARNING, logger="kglightning.callbacks.conformal"):
        assert cb.fit(None, model, one_graph) == math.inf
    assert "full candidate set" in caplog.text
    assert model.training  # fit restores the module's mode
    rows = [r for b in _trainer(tmp_path, [cb]).predict(model, dm) for r in b]
    assert all(r["conformal_full_set"] and r["conformal_qhat"] == math.inf for r in rows)
    assert all(sorted(s) == ["faithful", "hallucinated"] for r in rows for s in r["conformal_set"])


def test_validation_mode_fits_every_epoch_and_unfitted_errors(detection_dir, tiny_encoder_dir, tmp_path):
    L.seed_everything(0)
    dm = _dm(detection_dir, tiny_encoder_dir, tmp_path)
    model = HallucinationDetector(text_dim=32, encoder=ENCODER, mlp_hidden=16)
    with pytest.raises(RuntimeError, match="no threshold yet.*callback.fit"):
        _trainer(tmp_path, [ConformalCallback(fit_on="manual")]).predict(model, dm)
    model.train()
    cb = ConformalCallback(alpha=0.2, fit_on="validation")
    _trainer(tmp_path, [cb], epochs=1).fit(model, dm)
    assert cb.qhat == _expected_qhat(model, dm.val_dataloader())


class _NotAScorer(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])


def test_module_without_conformal_scores_is_named(tmp_path):
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 2)), batch_size=2)
    with pytest.raises(TypeError, match="_NotAScorer does not implement conformal_scores"):
        _trainer(tmp_path, [ConformalCallback()]).predict(_NotAScorer(), loader)


def test_scores_dataclass_any_all_and_padding():
    cs = ConformalScores(
        torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.2, math.inf]], dtype=torch.float64),
        labels=torch.tensor([[1, 0, 1], [0, 0, 0]]).bool(),
        mask=torch.tensor([[1, 1, 1], [1, 1, 0]]).bool(),
    )
    assert cs.calibration_scores("all").tolist() == [0.9, -math.inf]
    assert cs.calibration_scores("any").tolist() == [0.1, math.inf]
    assert cs.sets(math.inf).sum(1).tolist() == [3, 2]  # padding never enters a set
    with pytest.raises(ValueError, match="shape"):
        ConformalScores(torch.zeros(2, 2), labels=torch.zeros(2, 3).bool())


@pytest.mark.parametrize("weights_only", [False, True])
def test_fit_end_qhat_is_refitted_for_the_checkpoint_that_is_tested(
    detection_dir, tiny_encoder_dir, tmp_path, weights_only
):
    """test(ckpt_path="best") after fit_on="fit_end" calibrates the best weights, not the last epoch's (also from a
    weights-only checkpoint, which holds no callback state at all)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    L.seed_everything(0)
    dm = _dm(detection_dir, tiny_encoder_dir, tmp_path)
    model = HallucinationDetector(text_dim=32, encoder=ENCODER, optimizer=partial(torch.optim.Adam, lr=0.05))
    cb = ConformalCallback(alpha=0.2, fit_on="fit_end")
    # "best" is the first epoch's checkpoint: the lowest epoch number
    first = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", monitor="epoch_score", mode="min", save_top_k=1, save_weights_only=weights_only
    )

    class EpochScore(L.Callback):
        def on_validation_epoch_end(self, trainer, pl_module):
            pl_module.log("epoch_score", float(trainer.current_epoch))

    trainer = L.Trainer(
        max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        accelerator="cpu", callbacks=[EpochScore(), first, cb], num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(model, dm)
    last_qhat = cb.qhat
    assert "epoch=0" in first.best_model_path
    trainer.test(model, dm, ckpt_path="best", verbose=False)
    best = HallucinationDetector.load_from_checkpoint(first.best_model_path, encoder=ENCODER)
    expected = _expected_qhat(best, dm.val_dataloader())
    assert cb.qhat == pytest.approx(expected) and cb.qhat != pytest.approx(last_qhat)


def test_fit_end_a_new_predict_run_calibrates_a_checkpoint_written_during_fit(
    detection_dir, tiny_encoder_dir, tmp_path, caplog
):
    """The CLI's flow with the default fit_on="fit_end": ``fit`` writes its checkpoints before the fit-end
    calibration, and a later ``predict`` run (a new trainer and callback) loads one. It calibrates on the validation
    data with the loaded weights instead of stopping; a manual callback still stops, with its message."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    L.seed_everything(0)
    dm = _dm(detection_dir, tiny_encoder_dir, tmp_path)
    model = HallucinationDetector(text_dim=32, encoder=ENCODER, mlp_hidden=16)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    L.Trainer(
        max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        accelerator="cpu", callbacks=[ckpt, ConformalCallback(alpha=0.2)],
    ).fit(model, dm)  # fmt: skip
    path = str(tmp_path / "ckpt" / "last.ckpt")
    assert "ConformalCallback" not in str(torch.load(path, weights_only=False).get("callbacks", {}))  # no qhat in it
    fresh = HallucinationDetector(text_dim=32, encoder=ENCODER, mlp_hidden=16)
    cb = ConformalCallback(alpha=0.2)
    with caplog.at_level(logging.WARNING, logger="kglightning.callbacks.conformal"):
        rows = [r for b in _trainer(tmp_path, [cb]).predict(fresh, dm, ckpt_path=path) for r in b]
    assert "holds no qhat; calibrated now on the validation data" in caplog.text  # shown on the CLI
    loaded = HallucinationDetector.load_from_checkpoint(path, encoder=ENCODER, mlp_hidden=16)
    expected = _expected_qhat(loaded, dm.val_dataloader())
    assert cb.qhat == pytest.approx(expected) and rows and all("conformal_set" in r for r in rows)
    with pytest.raises(RuntimeError, match="no threshold yet"):
        _trainer(tmp_path, [ConformalCallback(fit_on="manual")]).predict(fresh, dm, ckpt_path=path)
    with pytest.raises(RuntimeError, match="holds no qhat, and calibrating for its weights needs the validation"):
        _trainer(tmp_path, [ConformalCallback()]).predict(fresh, dataloaders=dm.predict_dataloader(), ckpt_path=path)


class _GroupedScorer(L.LightningModule):
    """Items of two groups whose true candidate scores differ: group 1's are much less conforming."""

    def __init__(self) -> None:
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def conformal_scores(self, batch):
        s, g = batch
        scores = torch.stack([s.double(), 1 - s.double()], dim=1)  # candidate 0 is the true one
        labels = torch.zeros_like(scores, dtype=torch.bool)
        labels[:, 0] = True
        return ConformalScores(scores, labels=labels, candidates=("a", "b"), groups=g, group_names=("easy", "hard"))

    def predict_step(self, batch, batch_idx):
        return [{} for _ in range(batch[0].shape[0])]

    def test_step(self, batch, batch_idx):
        return None


def _grouped_loader(n, seed, groups=(0, 1)):
    gen = torch.Generator().manual_seed(seed)
    g = torch.tensor(groups)[torch.randint(0, len(groups), (n,), generator=gen)]
    s = torch.where(g == 0, 0.3 * torch.rand(n, generator=gen), 0.4 + 0.6 * torch.rand(n, generator=gen))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(s, g), batch_size=64)


def test_by_group_fits_a_qhat_per_group_and_covers_each(tmp_path, caplog):
    model = _GroupedScorer()
    cal = _grouped_loader(400, 0)
    pooled, grouped = (
        ConformalCallback(alpha=0.1, fit_on="manual"),
        ConformalCallback(alpha=0.1, fit_on="manual", by_group=True),
    )
    pooled.fit(None, model, cal)
    grouped.fit(None, model, cal)
    s, g = (torch.cat(t) for t in zip(*list(cal)))
    for gid in (0, 1):
        assert grouped.group_qhat[gid] == float(conformal_quantile(s[g == gid].double(), 0.1))
        assert grouped.group_n_cal[gid] == int((g == gid).sum())
    assert grouped.qhat == pooled.qhat and grouped.group_names == {0: "easy", 1: "hard"}
    test_s, test_g = (torch.cat(t) for t in zip(*list(_grouped_loader(20000, 1))))
    cs = model.conformal_scores((test_s, test_g))
    hit_grouped = cs.sets(grouped.item_qhat(cs))[:, 0]
    hit_pooled = cs.sets(pooled.item_qhat(cs))[:, 0]
    for gid in (0, 1):
        assert abs(float(hit_grouped[test_g == gid].float().mean()) - 0.9) < 0.02  # each group at 1 - alpha
    assert float(hit_pooled[test_g == 1].float().mean()) < 0.87  # pooled: the hard group falls short
    # test logs each group's coverage; a checkpoint round trip keeps the group thresholds
    trainer = _trainer(tmp_path, [grouped])
    trainer.test(model, _grouped_loader(200, 2), verbose=False)
    assert {"test/conformal_coverage/easy", "test/conformal_coverage/hard"} <= set(trainer.callback_metrics)
    loader = _grouped_loader(100, 3)
    rows = [r for batch in _trainer(tmp_path, [grouped]).predict(model, loader) for r in batch]
    want = [grouped.group_qhat[int(x)] for x in torch.cat([b[1] for b in loader])]
    assert [r["conformal_qhat"] for r in rows] == want
    again = ConformalCallback(alpha=0.1, by_group=True)
    again.load_state_dict(grouped.state_dict())
    assert again.group_qhat == grouped.group_qhat and again.group_names == grouped.group_names
    # a group calibration never saw gets full sets, with a warning
    with caplog.at_level(logging.WARNING):
        q = grouped.item_qhat(ConformalScores(torch.zeros(2, 2), groups=torch.tensor([0, 5])))
    assert q[1] == math.inf and "no calibration item" in caplog.text
    with pytest.raises(ValueError, match="groups"):
        ConformalCallback(by_group=True).fit_scores(torch.rand(10))


def test_group_state_follows_the_mode_and_unseen_groups_warn_once(caplog):
    grouped = ConformalCallback(alpha=0.2, fit_on="manual", by_group=True)
    grouped.fit_scores(torch.rand(50, dtype=torch.float64), torch.arange(50) % 2)
    plain = ConformalCallback(alpha=0.2, fit_on="manual")
    plain.load_state_dict(grouped.state_dict())
    plain.fit_scores(torch.rand(50, dtype=torch.float64))
    assert plain.group_qhat == {} and plain.state_dict()["group_qhat"] == {}  # no stale group thresholds
    # a grouped callback loading an ungrouped checkpoint fits its groups again rather than using +inf everywhere
    late = ConformalCallback(alpha=0.2, by_group=True)
    late.load_state_dict(plain.state_dict())
    assert late._restored is False
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            grouped.item_qhat(ConformalScores(torch.zeros(2, 2), groups=torch.tensor([0, 7])))
    assert caplog.text.count("have no calibration item") == 1


def test_the_answers_of_records_without_gold_answers_do_not_calibrate(detection_dir, tiny_encoder_dir, tmp_path):
    import json as _json
    from pathlib import Path

    data = tmp_path / "nogold"
    data.mkdir()
    for split in ("train", "validation", "test"):
        rows = [_json.loads(line) for line in Path(detection_dir, f"{split}.jsonl").open()]
        if split == "validation":
            rows[0]["answer"], rows[0]["a_entity"] = [], []
        (data / f"{split}.jsonl").write_text("".join(_json.dumps(r) + "\n" for r in rows))
    dm = _dm(str(data), tiny_encoder_dir, tmp_path, batch_size=64)
    dm.setup("fit")
    model = HallucinationDetector(text_dim=32, encoder=ENCODER, mlp_hidden=16)
    (batch,) = list(dm.val_dataloader())
    cs = model.conformal_scores(batch)
    blank = cs.units == cs.units.min()  # the first question's answers: it has no gold answer
    assert cs.labelled.tolist() == (~blank).tolist()  # not one made-up "hallucinated" label per answer
    assert cs.labelled_part().scores.shape[0] == int((~blank).sum())
    # calibration leaves them out (it stopped the whole calibration before) and counts the other questions
    cb = ConformalCallback(alpha=0.2, fit_on="manual")
    cb.fit(None, model, dm.val_dataloader())
    assert cb.n_cal == len(dm.datasets["validation"]) - 1
