"""The detector trains on a small hand-made dataset: loss falls, parameters change, threshold is checkpointed."""

from __future__ import annotations

from functools import partial

import lightning as L
import pytest
import torch

from kglightning.data import SentenceEncoder
from kglightning.datamodules import DetectionDataModule
from kglightning.modules import HallucinationDetector
from kglightning.modules.detector_thresholds import best_f1_threshold, bootstrap_f1_threshold
from kglightning.nn import GATEncoder, GraphTransformerEncoder


def _datamodule(detection_dir, tiny_encoder_dir, tmp_path):
    return DetectionDataModule(
        data_dir=detection_dir,
        encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
        cache_dir=str(tmp_path / "cache"),
        batch_size=8,
    )


def _fit_ready(detection_dir, tiny_encoder_dir, tmp_path):
    L.seed_everything(0)
    dm = _datamodule(detection_dir, tiny_encoder_dir, tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _eval_loss(model, batch, loss=torch.nn.functional.binary_cross_entropy_with_logits) -> float:
    """The model's loss on a batch in eval mode (no dropout, no gradients)."""
    model.eval()
    with torch.no_grad():
        return loss(model(batch), batch.y).item()


def _trainer(tmp_path, epochs):
    return L.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        accelerator="cpu",
        deterministic=True,
    )


@pytest.mark.heavy
@pytest.mark.parametrize("encoder", [GraphTransformerEncoder, GATEncoder])
def test_fit_lowers_loss_and_changes_parameters(encoder, detection_dir, tiny_encoder_dir, tmp_path):
    dm = _fit_ready(detection_dir, tiny_encoder_dir, tmp_path)
    model = HallucinationDetector(
        text_dim=dm.text_dim, encoder=partial(encoder, hidden_channels=32, heads=4), mlp_hidden=32, dropout=0.0
    )
    batch = dm.collate(dm.datasets["train"])

    def loss():
        return _eval_loss(model, batch)

    before_loss, before = loss(), [p.detach().clone() for p in model.parameters()]
    _trainer(tmp_path, 15).fit(model, dm)
    after_loss = loss()
    assert after_loss < 0.7 * before_loss
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.heavy
def test_threshold_tuned_on_validation_and_kept_in_checkpoint(detection_dir, tiny_encoder_dir, tmp_path):
    L.seed_everything(0)
    dm = _datamodule(detection_dir, tiny_encoder_dir, tmp_path)
    model = HallucinationDetector(text_dim=32, encoder=partial(GraphTransformerEncoder, hidden_channels=16, heads=4))
    trainer = _trainer(tmp_path, 3)
    trainer.fit(model, dm)
    assert float(model.threshold) != 0.5
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    fresh = HallucinationDetector.load_from_checkpoint(
        path, encoder=partial(GraphTransformerEncoder, hidden_channels=16, heads=4)
    )
    assert float(fresh.threshold) == float(model.threshold)
    assert float(fresh.majority) == float(model.majority)

    results = trainer.test(model, dm, verbose=False)[0]
    # MostFrequent predicts one class for every node: its recall is 0 or 1, its AUC-PR the positive rate
    assert results["test/mostfrequent/recall"] in (0.0, 1.0)
    positive_rate = torch.cat([g.y for g in dm.datasets["test"]]).mean().item()
    assert results["test/mostfrequent/auc_pr"] == pytest.approx(positive_rate, abs=1e-6)
    # flagging every node: precision is the positive rate and recall 1; flagging none: F1 0
    all_flagged = 2 * positive_rate / (1 + positive_rate)
    expected_f1 = all_flagged if results["test/mostfrequent/recall"] == 1.0 else 0.0
    assert results["test/mostfrequent/f1"] == pytest.approx(expected_f1, abs=1e-6)

    preds = trainer.predict(model, dm)
    rows = [row for batch in preds for row in batch]
    assert len(rows) == len(dm.datasets["test"])
    for row in rows:
        assert len(row["hallucination_prob"]) == len(row["prediction"])
        assert set(row["flagged"]) <= set(row["prediction"])
    # test/f1 by hand: every answer node, flagged when p >= threshold, against its label (1: hallucinated)
    by_id = {row["id"]: row for row in rows}
    tp = fp = fn = 0
    for g in dm.datasets["test"]:
        row = by_id[g.qid]
        assert row["hallucinated"] == [bool(y) for y in g.y.tolist()]  # the labels `kglightning select` reads
        logit = torch.tensor(row["hallucination_logit"])
        assert torch.allclose(torch.sigmoid(logit), torch.tensor(row["hallucination_prob"]), atol=1e-5)
        for p, y in zip(row["hallucination_prob"], g.y.tolist()):
            flag = p >= row["threshold"]
            tp, fp, fn = tp + (flag and y == 1), fp + (flag and y == 0), fn + (not flag and y == 1)
    assert results["test/f1"] == pytest.approx(2 * tp / max(2 * tp + fp + fn, 1), abs=1e-6)


def test_best_f1_threshold_hand_computed():
    probs = torch.tensor([0.1, 0.4, 0.35, 0.8])
    target = torch.tensor([0, 0, 1, 1])
    thr, f1 = best_f1_threshold(probs, target)
    # p >= 0.35 -> preds [0,1,1,1]: P=2/3, R=1, F1=0.8; p >= 0.8 -> P=1, R=0.5, F1=2/3
    assert thr == pytest.approx(0.35) and f1 == pytest.approx(0.8)


def test_the_tuned_f1_is_the_logged_f1_and_ties_are_flagged():
    from kglightning.metrics.classification import detection_metrics, detection_scores

    # the best threshold is a score (0.8) that two nodes share: one hallucinated, one not
    probs = torch.tensor([0.95, 0.8, 0.8, 0.3, 0.1])
    target = torch.tensor([1, 1, 0, 0, 0])
    thr, f1 = best_f1_threshold(probs, target)
    assert thr == pytest.approx(0.8) and f1 == pytest.approx(0.8)  # p >= 0.8: TP 2, FP 1 -> F1 4/5
    assert float(detection_scores(probs, target, thr)["f1"]) == pytest.approx(f1)
    metrics = detection_metrics(threshold=thr)
    metrics.update(probs, target)
    assert float(metrics.compute()["f1"]) == pytest.approx(f1)
    # a saturated threshold still flags the nodes scored 1.0
    saturated = detection_scores(torch.tensor([1.0, 1.0, 0.2]), torch.tensor([1, 0, 0]), 1.0)
    assert float(saturated["recall"]) == 1.0 and float(saturated["precision"]) == 0.5


@pytest.mark.heavy
def test_bootstrap_threshold_holds_up_on_small_validation_sets():
    # 30 validation sets of 60 nodes (20% hallucinated, overlapping scores), each threshold applied to one large test
    # set of the same distribution: the bootstrap median gives a higher and steadier test F1 than the plain best-F1
    # threshold, which chases the noise of 12 positives
    gen = torch.Generator().manual_seed(0)
    test_y = (torch.rand(5000, generator=gen) < 0.2).long()
    test_p = torch.sigmoid(torch.randn(5000, generator=gen) + 1.5 * test_y)

    def test_f1(t: float) -> float:
        pred = test_p >= t
        tp = int((pred & (test_y == 1)).sum())
        return 2 * tp / (int(pred.sum()) + int(test_y.sum()))

    plain, boot = [], []
    for _ in range(30):
        target = (torch.rand(60, generator=gen) < 0.2).long()
        probs = torch.sigmoid(torch.randn(60, generator=gen) + 1.5 * target)
        plain.append(test_f1(best_f1_threshold(probs, target)[0]))
        boot.append(test_f1(bootstrap_f1_threshold(probs, target, resamples=50)))
    plain, boot = torch.tensor(plain), torch.tensor(boot)
    assert boot.mean() > plain.mean() and boot.std() < plain.std()
    probs, target = torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])
    assert bootstrap_f1_threshold(probs, target, 20, seed=3) == bootstrap_f1_threshold(probs, target, 20, seed=3)
    assert bootstrap_f1_threshold(probs, torch.tensor([0, 0, 0, 0]), 20) == best_f1_threshold(probs, target * 0)[0]
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_f1_threshold(probs, target, 0)
    with pytest.raises(ValueError, match="threshold_resamples"):
        HallucinationDetector(threshold_resamples=-1)


def test_records_without_predictions_need_a_proposer(tmp_path, tiny_encoder_dir):
    import json

    for split in ("train", "validation", "test"):
        (tmp_path / f"{split}.jsonl").write_text(
            json.dumps(
                {
                    "id": "a",
                    "question": "q?",
                    "answer": ["x"],
                    "q_entity": ["y"],
                    "a_entity": ["x"],
                    "graph": [["y", "r", "x"]],
                }
            )
            + "\n"
        )
    dm = DetectionDataModule(
        data_dir=str(tmp_path), encoder=SentenceEncoder(tiny_encoder_dir), cache_dir=str(tmp_path / "c")
    )
    with pytest.raises(ValueError, match=r"train\.jsonl.*no 'prediction'.*proposer"):
        dm.prepare_data()


def test_detection_loss_hand_computed():
    from kglightning.modules.detector import detection_loss

    # logit 1, label 0: BCE = ln(1 + e) = 1.31326; p_true = 1 - sigmoid(1) = 0.26894; (1 - p_true)^2 = 0.53445
    assert detection_loss(torch.tensor([1.0]), torch.tensor([0.0]), gamma=2.0).item() == pytest.approx(
        0.70188, abs=1e-4
    )
    # the positive weight scales only the hallucinated terms: (0.5 * BCE(2, 1) + BCE(-1, 0)) / 2
    logits, y = torch.tensor([2.0, -1.0]), torch.tensor([1.0, 0.0])
    expected = (0.5 * 0.126928 + 0.313262) / 2
    assert detection_loss(logits, y, pos_weight=0.5).item() == pytest.approx(expected, abs=1e-5)
    with pytest.raises(ValueError, match="pos_weight"):
        HallucinationDetector(pos_weight=0.0)
    with pytest.raises(ValueError, match="focal_gamma"):
        HallucinationDetector(focal_gamma=-1.0)


@pytest.mark.heavy
def test_weighted_focal_fit_lowers_its_loss(detection_dir, tiny_encoder_dir, tmp_path):
    from kglightning.modules.detector import detection_loss

    dm = _fit_ready(detection_dir, tiny_encoder_dir, tmp_path)
    model = HallucinationDetector(text_dim=dm.text_dim, encoder=partial(GraphTransformerEncoder, hidden_channels=32,
                                  heads=4), mlp_hidden=32, dropout=0.0, pos_weight=0.5, focal_gamma=2.0)  # fmt: skip
    batch = dm.collate(dm.datasets["train"])

    def loss():
        return _eval_loss(model, batch, lambda logits, y: detection_loss(logits, y, 0.5, 2.0))

    before = loss()
    _trainer(tmp_path, 15).fit(model, dm)
    assert loss() < 0.7 * before


def test_answer_path_features(detection_dir, tiny_encoder_dir, tmp_path):
    dm = DetectionDataModule(data_dir=detection_dir, encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
                             cache_dir=str(tmp_path / "cache"), batch_size=8,
                             answer_features=["path_score", "hops"])  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    assert dm.num_answer_features == 2
    batch = dm.collate(dm.datasets["train"])
    feats = batch.answer_features
    assert feats.shape == (batch.answer_index.numel(), 2)
    assert ((feats[:, 0] >= -1) & (feats[:, 0] <= 1 + 1e-5)).all() and (feats[:, 1] > 0).all()
    # an answer reached by a path has a score; one no topic entity reaches gets 0 and hops 1 + 1/3
    reached = feats[:, 1] <= 1
    assert reached.any() and (feats[~reached, 0] == 0).all() and torch.allclose(feats[~reached, 1], torch.tensor(4 / 3))
    model = HallucinationDetector(text_dim=dm.text_dim, encoder=partial(GraphTransformerEncoder, hidden_channels=16,
                                  heads=4), mlp_hidden=16, answer_features=2)  # fmt: skip
    assert model(batch).shape == (batch.answer_index.numel(),)
    del batch.answer_features
    with pytest.raises(ValueError, match="reads 2 answer features"):
        model(batch)
    with pytest.raises(ValueError, match="answer_features"):
        DetectionDataModule(data_dir=detection_dir, answer_features=["degree"])


@pytest.mark.parametrize(
    "ablation",
    [{"marks": False}, {"question_node": False}, {"edge_text": False}, {"inputs": "graph"}, {"inputs": "question"}],
)
@pytest.mark.heavy
def test_ablations_train_and_reload(ablation, detection_dir, tiny_encoder_dir, tmp_path):
    dm = _fit_ready(detection_dir, tiny_encoder_dir, tmp_path)
    model = HallucinationDetector(text_dim=dm.text_dim, encoder=partial(GraphTransformerEncoder, hidden_channels=32,
                                  heads=4), mlp_hidden=32, dropout=0.0, **ablation)  # fmt: skip
    batch = dm.collate(dm.datasets["train"])

    def loss():
        return _eval_loss(model, batch)

    before_loss, before = loss(), [p.detach().clone() for p in model.parameters()]
    trainer = _trainer(tmp_path, 10)
    trainer.fit(model, dm)
    # without a graph the tiny random text encoder leaves little to learn from: the loss falls, but less
    assert loss() < (0.97 if ablation.get("inputs") == "question" else 0.8) * before_loss
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    again = HallucinationDetector.load_from_checkpoint(
        tmp_path / "m.ckpt", encoder=partial(GraphTransformerEncoder, hidden_channels=32, heads=4)
    ).eval()
    assert {k: again.hparams[k] for k in ablation} == ablation
    with torch.no_grad():
        assert torch.allclose(again(batch), model(batch))


@pytest.mark.heavy
def test_no_hook_makes_a_tensor_on_the_default_device(detection_dir, tiny_encoder_dir, tmp_path):
    """fit (sanity check, threshold tuning, conformal calibration), test (with the baselines) and predict under the
    device trap: a metric or tensor built on the default device inside a hook would be refused on a GPU."""
    from kglightning.callbacks import ConformalCallback
    from kglightning.testing import DeviceTrapCallback

    dm = _fit_ready(detection_dir, tiny_encoder_dir, tmp_path)
    model = HallucinationDetector(text_dim=32, encoder=partial(GraphTransformerEncoder, hidden_channels=16, heads=4))
    trap = DeviceTrapCallback()
    conformal = ConformalCallback(alpha=0.2, fit_on="validation")
    trainer = L.Trainer(
        max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        accelerator="cpu", callbacks=[trap, conformal], num_sanity_val_steps=1,
    )  # fmt: skip
    trainer.fit(model, dm)
    (results,) = trainer.test(model, dm)
    rows = [row for batch in trainer.predict(model, dm) for row in batch]
    assert trap.trap.sites == []
    assert 0 <= results["test/f1"] <= 1 and conformal.n_cal > 0 and all("conformal_set" in r for r in rows)


def test_mostfrequent_takes_the_validation_majority_without_threshold_tuning(tiny_encoder_dir, tmp_path):
    import json

    graph = [["France", "capital", "Paris"], ["Paris", "river", "Seine"], ["France", "river", "Loire"]]
    row = {"question": "capital of France?", "answer": ["Paris"], "q_entity": ["France"], "a_entity": ["Paris"],
           "graph": graph}  # fmt: skip
    preds = {"train": [["Paris", "Seine"], ["Loire"]], "validation": [["Paris"], ["Paris", "Loire"], ["Paris"]],
             "test": [["Paris", "Seine"]]}  # fmt: skip  # validation: 4 faithful nodes of 5
    for split, rows in preds.items():
        lines = [json.dumps({**row, "id": f"{split}-{i}", "prediction": p}) for i, p in enumerate(rows)]
        (tmp_path / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    dm = DetectionDataModule(data_dir=str(tmp_path), encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
                             cache_dir=str(tmp_path / "cache"), batch_size=8)  # fmt: skip
    model = HallucinationDetector(text_dim=32, encoder=partial(GraphTransformerEncoder, hidden_channels=16, heads=4),
                                  tune_threshold=False)  # fmt: skip
    _trainer(tmp_path, 1).fit(model, dm)
    assert float(model.majority) == 0.0 and float(model.threshold) == 0.5  # faithful majority; threshold as given


def test_answers_of_a_question_without_gold_answers_enter_no_loss_and_no_metric(tiny_encoder_dir, tmp_path):
    """Issue 57: such a question's graph is marked ``labelled=False`` with ``y = 1``; the loss, the tuned threshold
    and the test metrics read ``y`` and took its answers as hallucinated."""
    import json

    from kglightning.data import KGQARecord
    from kglightning.datamodules.detection_graphs import DetectionStats, build_detection_graph, node_texts
    from kglightning.datamodules.graph_forms import collate_graphs

    graph = [["France", "capital", "Paris"], ["Paris", "river", "Seine"], ["France", "river", "Loire"],
             ["France", "borders", "Spain"]]  # fmt: skip
    row = {"question": "capital of France?", "answer": ["Paris"], "q_entity": ["France"], "a_entity": ["Paris"],
           "graph": graph}  # fmt: skip
    preds = {"train": [["Paris", "Seine"], ["Loire", "Paris"], ["Spain"]], "validation": [["Paris", "Loire"], ["Seine"]],
             "test": [["Paris", "Seine"], ["Loire"]]}  # fmt: skip
    # the same questions, plus in validation and test one with no gold answer whose four answers are all "right"
    # in what they name (the graph's nodes), so that reading their y = 1 moves the threshold and every test metric
    unlabelled = {**row, "answer": [], "a_entity": [], "prediction": ["Paris", "Seine", "Loire", "Spain"]}
    results = []
    for extra in (False, True):
        data = tmp_path / f"data{int(extra)}"
        data.mkdir()
        for split, rows in preds.items():
            lines = [json.dumps({**row, "id": f"{split}-{i}", "prediction": p}) for i, p in enumerate(rows)]
            if extra and split != "train":
                lines.append(json.dumps({**unlabelled, "id": f"{split}-none"}))
            (data / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
        L.seed_everything(0)
        dm = DetectionDataModule(data_dir=str(data), encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
                                 cache_dir=str(tmp_path / "cache"), batch_size=8)  # fmt: skip
        model = HallucinationDetector(text_dim=32, encoder=partial(GraphTransformerEncoder, hidden_channels=16,
                                                                   heads=4))  # fmt: skip
        trainer = _trainer(tmp_path, 2)
        trainer.fit(model, dm)
        (test,) = trainer.test(model, dm)
        results.append(({k: v for k, v in test.items() if "loss" not in k}, float(model.threshold)))
        if extra:
            assert dm.stats["test"].unlabelled == 4 and dm.stats["test"].instances == 3
    # equal up to float noise: the same answers scored in batches of another size round differently on some CPUs
    # (an AMD EPYC moved the threshold by 6e-5); 4 answers read as right would move it, and the metrics, far more
    assert results[1][0] == pytest.approx(results[0][0], abs=1e-4)
    assert results[1][1] == pytest.approx(results[0][1], abs=1e-3)

    # the training loss is the loss of the labelled answers alone
    record = KGQARecord.from_dict({**row, "id": "a", "prediction": ["Paris", "Seine"]})
    blank = KGQARecord.from_dict({**unlabelled, "id": "b"})
    rows = {t: i for i, t in enumerate(dict.fromkeys(node_texts(record) + node_texts(blank)))}
    graphs = [build_detection_graph(r, rows, DetectionStats(), ungrounded="keep") for r in (record, blank)]
    table = torch.randn(len(rows), 32, generator=torch.Generator().manual_seed(0))
    both, alone = collate_graphs(graphs, lambda ids: table[ids]), collate_graphs(graphs[:1], lambda ids: table[ids])
    model = HallucinationDetector(text_dim=32, encoder=partial(GraphTransformerEncoder, hidden_channels=16, heads=4))
    model.eval()
    with torch.no_grad():
        assert model._loss(both, "train")[0].item() == pytest.approx(model._loss(alone, "train")[0].item())
        assert model._loss(collate_graphs(graphs[1:], lambda ids: table[ids]), "train")[0].item() == 0.0


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_ddp_finishes_when_a_rank_holds_only_unlabelled_answers(tiny_encoder_dir, tmp_path):
    """Review of issue 57: a rank whose batches had no labelled answer skipped logging the loss, so the ranks'
    collectives fell out of step and validation hung."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    script = str(root / "tests/modules/_detector_ddp_unlabelled.py")
    proc = subprocess.run([sys.executable, script, str(tmp_path), tiny_encoder_dir], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=280)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("test f1") == 2
