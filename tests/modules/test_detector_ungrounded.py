"""Answers that name no graph node are scored (not dropped), trained, and reported in test/all/*."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch

from kglightning.baselines import StructuralBaseline
from kglightning.data import SentenceEncoder
from kglightning.datamodules import DetectionDataModule
from kglightning.modules import HallucinationDetector
from kglightning.nn import GraphTransformerEncoder

COUNTRIES = ["France", "Spain", "Italy", "Peru", "Chile", "Japan", "Kenya", "Egypt", "Norway", "Canada"]


def _records(split: str, n: int) -> list[dict]:
    out = []
    for i in range(n):
        c = COUNTRIES[i % len(COUNTRIES)]
        graph = [[c, "location.country.capital", f"{c} City"], [c, "location.location.borders", f"{c} Hills"]]
        # grounded right, grounded wrong, ungrounded right (a gold alias off the graph), ungrounded wrong
        prediction = [f"{c} City", f"{c} Hills", f"Old {c} Town", f"Zorblax {i}"]
        if split == "test" and i == 0:  # a question whose answers all miss its graph
            prediction = prediction[2:]
        out.append({"id": f"{split}-{i}", "question": f"What is the capital of {c}?", "answer": [f"{c} City",
                    f"Old {c} Town"], "q_entity": [c], "a_entity": [f"{c} City"], "graph": graph,
                    "prediction": prediction})  # fmt: skip
    return out


@pytest.fixture
def datamodule(tmp_path: Path, tiny_encoder_dir):
    folder = tmp_path / "data"
    folder.mkdir()
    for split, n in (("train", 10), ("validation", 6), ("test", 6)):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(split, n)))
    dm = DetectionDataModule(
        data_dir=str(folder), encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
        cache_dir=str(tmp_path / "cache"), batch_size=4, baselines=[StructuralBaseline()],
    )  # fmt: skip
    dm.prepare_data()
    return dm


def _model(dm) -> HallucinationDetector:
    L.seed_everything(0)
    return HallucinationDetector(
        text_dim=dm.text_dim, encoder=partial(GraphTransformerEncoder, hidden_channels=16, heads=2), mlp_hidden=16,
        dropout=0.0,
    )  # fmt: skip


def test_every_answer_is_scored_in_label_order_and_both_models_train(datamodule):
    datamodule.setup("fit")
    assert "20 ungrounded (50.0% hallucinated)" in datamodule.stats["train"].summary("train")
    batch = datamodule.collate(datamodule.datasets["train"])
    model = _model(datamodule)
    assert model(batch).shape == batch.y.shape == (40,)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch), batch.y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    changed = {n.split(".")[0] for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert {"net", "ungrounded"} <= changed
    loose = batch.answer_grounding == 2
    probs = torch.sigmoid(model(batch)).detach()
    assert probs[loose & (batch.y == 1)].mean() > probs[loose & (batch.y == 0)].mean()


def test_a_batch_with_one_kind_of_answer_still_uses_both_models(datamodule):
    """Under DDP every parameter must get a gradient in every step, whatever answers a rank's batch holds."""
    datamodule.setup("fit")
    graphs = datamodule.datasets["train"]
    model = _model(datamodule)
    for keep in (lambda g: g.answer_grounding != 2, lambda g: g.answer_grounding == 2):
        parts = []
        for g in graphs[:3]:
            g = g.clone()
            mask = keep(g)
            if not mask.all():  # drop one kind of answer from the graph
                grounded = int((g.answer_grounding != 2).sum())
                g.answer_index = g.answer_index[mask[:grounded]]
                g.ungrounded_text = g.ungrounded_text[mask[grounded:]]
                g.ungrounded_question_index = g.ungrounded_question_index[mask[grounded:]]
                for key in ("y", "answer_grounding", "answer_rank", "proposer_confidence"):
                    g[key] = g[key][mask]
                g.answer_names = [n for n, m in zip(g.answer_names, mask.tolist()) if m]
                g.num_answer_items = torch.tensor([int(mask.sum())])
            parts.append(g)
        batch = datamodule.collate(parts)
        model.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(model(batch), batch.y).backward()
        assert all(p.grad is not None for p in model.parameters())


@pytest.mark.heavy
def test_the_test_table_reports_grounded_and_all_answers(datamodule, tmp_path):
    model = _model(datamodule)
    trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, accelerator="cpu")  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    (metrics,) = trainer.test(model, datamodule=datamodule, verbose=False)
    prefixes = ("test/", "test/all/", "test/mostfrequent/", "test/all/mostfrequent/", "test/all/random/",
                "test/structural/", "test/all/structural/")  # fmt: skip
    for prefix in prefixes:
        assert {f"{prefix}f1", f"{prefix}auc_pr", f"{prefix}precision", f"{prefix}recall"} <= set(metrics)
    # the grounded answers are half hallucinated, and so are all: MostFrequent's recall is the same 0 or 1 on both
    assert metrics["test/all/mostfrequent/recall"] == metrics["test/mostfrequent/recall"]
    assert metrics["test/all/random/auc_pr"] != metrics["test/random/auc_pr"]
    # fitted on train, where every ungrounded answer off the list's end is made up: it ranks the test answers well
    assert metrics["test/all/structural/auc_pr"] > 0.6


def test_batched_logits_are_each_graphs_own(datamodule):
    """Answers of several graphs batched together get the logits each graph gets alone (ungrounded ones included:
    the nearest node is searched in the answer's own graph, the question is its own)."""
    datamodule.setup("fit")
    graphs = datamodule.datasets["train"][:5]
    model = _model(datamodule).eval()
    with torch.no_grad():
        together = model(datamodule.collate(graphs))
        alone = torch.cat([model(datamodule.collate([g])) for g in graphs])
    assert torch.allclose(together, alone, atol=1e-5)
    # and a graph's answers are distinct inputs: swapping two graphs' ungrounded texts changes their logits
    swapped = [g.clone() for g in graphs[:2]]
    swapped[0].ungrounded_text, swapped[1].ungrounded_text = graphs[1].ungrounded_text, graphs[0].ungrounded_text
    with torch.no_grad():
        other = model(datamodule.collate(swapped))
    loose = datamodule.collate(graphs[:2]).answer_grounding == 2
    assert not torch.allclose(other[loose], together[: loose.numel()][loose])


def test_a_test_batch_of_ungrounded_answers_only_and_an_old_checkpoint(datamodule, tmp_path):
    datamodule.batch_size = 1
    datamodule.setup("test")
    assert (datamodule.datasets["test"][0].answer_grounding == 2).all()
    model = _model(datamodule)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        default_root_dir=tmp_path)  # fmt: skip
    (metrics,) = trainer.test(model, datamodule=datamodule, verbose=False)  # batches of one graph each
    assert "test/all/f1" in metrics and "test/f1" in metrics
    # a checkpoint saved before the ungrounded scorer existed still loads (its scorer starts fresh, with a warning)
    old = {k: v for k, v in model.state_dict().items() if not k.startswith("ungrounded.")}
    fresh = _model(datamodule)
    with pytest.warns(UserWarning, match="ungrounded-answer scorer"):
        fresh.load_state_dict(old)
    mine, theirs = fresh.net.state_dict(), model.net.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


@pytest.mark.heavy
def test_the_ungrounded_offset_is_tuned_saved_and_used_by_predictions(datamodule, tmp_path):
    model = _model(datamodule)
    trainer = L.Trainer(max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, accelerator="cpu")  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    assert {"val/all/f1", "val/all/auc_pr", "val/ungrounded_offset"} <= set(trainer.callback_metrics)
    offset = float(model.ungrounded_offset)
    assert offset != 0.0 and "ungrounded_offset" in model.state_dict()
    datamodule.setup("test")
    batch = next(iter(datamodule.test_dataloader()))
    model.eval()
    loose = batch.answer_grounding == 2
    shift = model(batch) - model(batch, calibrated=False)
    assert torch.allclose(shift[loose], torch.full_like(shift[loose], offset)) and bool((shift[~loose] == 0).all())
    rows = [row for out in trainer.predict(model, datamodule=datamodule) for row in out]
    for row in rows:  # each population's threshold over the shifted probabilities decides its flags (away from ties)
        thr = {"exact": row["threshold"], "near-miss": row["threshold"], "ungrounded": row["ungrounded_threshold"]}
        cuts = [thr[kind] for kind in row["grounding"]]
        clear = [(n, p, t) for n, p, t in zip(row["prediction"], row["hallucination_prob"], cuts) if abs(p - t) > 1e-5]
        assert [n for n, p, t in clear if p > t] == [n for n, _, _ in clear if n in row["flagged"]]
    frozen = _model(datamodule)
    frozen.tune_ungrounded_offset = False
    L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
              default_root_dir=tmp_path, accelerator="cpu").fit(frozen, datamodule=datamodule)  # fmt: skip
    assert float(frozen.ungrounded_offset) == 0.0


def test_threshold_for_is_checked():
    with pytest.raises(ValueError, match="threshold_for"):
        HallucinationDetector(threshold_for="some")
    with pytest.raises(ValueError, match="bootstrap"):
        HallucinationDetector(threshold_for="all", threshold_resamples=10)
    assert HallucinationDetector(threshold_for="all_ap").threshold_for == "all"  # the older name


def test_an_old_checkpoint_without_the_offset_loads_quietly(datamodule):
    import warnings

    model = _model(datamodule)
    model.threshold.fill_(0.3)
    model.majority.fill_(0.0)
    new = ("ungrounded_offset", "ungrounded_threshold", "majority_all")
    state = {k: v for k, v in model.state_dict().items() if k not in new}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.load_state_dict(state)
    # as such a checkpoint decided: no shift, its one threshold for every answer, its one majority
    assert float(model.ungrounded_offset) == 0.0 and float(model.ungrounded_threshold) == pytest.approx(0.3)
    assert float(model.majority_all) == 0.0


def _folder(tmp_path: Path, make) -> str:
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    for split, n in (("train", 10), ("validation", 6), ("test", 6)):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(make(split, i)) + "\n" for i in range(n)))
    return str(folder)


def _record(split: str, i: int, prediction: list[str]) -> dict:
    c = COUNTRIES[i % len(COUNTRIES)]
    graph = [[c, "location.country.capital", f"{c} City"], [c, "location.location.borders", f"{c} Hills"]]
    return {"id": f"{split}-{i}", "question": f"What is the capital of {c}?", "answer": [f"{c} City", f"Old {c} Town"],
            "q_entity": [c], "a_entity": [f"{c} City"], "graph": graph, "prediction": prediction}  # fmt: skip


@pytest.mark.heavy
def test_a_validation_split_without_grounded_answers_tunes_and_logs_every_answer(tmp_path, tiny_encoder_dir):
    """Found by a review: with no grounded validation answer nothing was tuned or logged, and an EarlyStopping on
    val/all/auc_pr raised."""

    def make(split: str, i: int) -> dict:
        c = COUNTRIES[i % len(COUNTRIES)]
        grounded = [] if split == "validation" else [f"{c} City", f"{c} Hills"]
        return _record(split, i, [*grounded, f"Old {c} Town", f"Zorblax {i}"])

    dm = DetectionDataModule(data_dir=_folder(tmp_path, make), encoder=SentenceEncoder(tiny_encoder_dir,
                             show_progress=False), cache_dir=str(tmp_path / "cache"), batch_size=4)  # fmt: skip
    model = _model(dm)
    model.threshold_for = "all"
    stop = L.pytorch.callbacks.EarlyStopping(monitor="val/all/auc_pr", mode="max", patience=5)
    trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, accelerator="cpu", callbacks=[stop])  # fmt: skip
    trainer.fit(model, datamodule=dm)
    assert {"val/all/f1", "val/all/auc_pr", "val/ungrounded_threshold"} <= set(trainer.callback_metrics)
    assert "val/f1" not in trainer.callback_metrics and float(model.threshold) == 0.5  # nothing to tune it on
    assert float(model.ungrounded_threshold) != 0.5


@pytest.mark.heavy
def test_mostfrequent_over_every_answer_answers_the_majority_of_every_answer(tmp_path, tiny_encoder_dir):
    """Found by a review: the grounded answers' majority class was reused for test/all/mostfrequent/*."""

    def make(split: str, i: int) -> dict:  # grounded: right; ungrounded: two wrong
        c = COUNTRIES[i % len(COUNTRIES)]
        return _record(split, i, [f"{c} City", f"Zorblax {i}", f"Quux {i}"])

    dm = DetectionDataModule(data_dir=_folder(tmp_path, make), encoder=SentenceEncoder(tiny_encoder_dir,
                             show_progress=False), cache_dir=str(tmp_path / "cache"), batch_size=4)  # fmt: skip
    model = _model(dm)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, accelerator="cpu")  # fmt: skip
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    assert float(model.majority) == 0.0 and float(model.majority_all) == 1.0
    assert metrics["test/mostfrequent/recall"] == 0.0
    assert metrics["test/all/mostfrequent/recall"] == 1.0
    assert metrics["test/all/mostfrequent/precision"] == pytest.approx(2 / 3)


def test_a_checkpoint_whose_ungrounded_scorer_predates_answer_features_loads_with_its_scores(datamodule):
    """Found by a review: the scorer now reads the answer features, so an older checkpoint's first layer was too
    narrow to load."""
    L.seed_everything(0)
    kwargs = dict(text_dim=datamodule.text_dim, encoder=partial(GraphTransformerEncoder, hidden_channels=16, heads=2),
                  mlp_hidden=16, dropout=0.0, answer_features=2)  # fmt: skip
    model = HallucinationDetector(**kwargs)
    state = model.state_dict()
    old_first = state["ungrounded.mlp.0.weight"][:, :-2].clone()
    state["ungrounded.mlp.0.weight"] = old_first  # as saved before the scorer read the 2 features
    fresh = HallucinationDetector(**kwargs)
    with pytest.warns(UserWarning, match="predates its 2 answer features"):
        fresh.load_state_dict(state)
    x = torch.randn(3, 4 * datamodule.text_dim + 2)
    feats = torch.randn(3, 2)
    with torch.no_grad():  # the old layer's outputs, whatever the features
        want = x @ old_first.T + state["ungrounded.mlp.0.bias"]
        got = fresh.ungrounded.mlp[0](torch.cat([x, feats], dim=1))
    assert torch.allclose(got, want, atol=1e-5)


def test_an_ungrounded_scorer_written_before_answer_features_still_builds(datamodule):
    from kglightning.nn import UngroundedAnswerScorer

    class OldScorer(UngroundedAnswerScorer):
        def __init__(self, text_dim: int, hidden: int = 8) -> None:
            super().__init__(text_dim, hidden=hidden)

    with pytest.warns(UserWarning, match="takes no answer_features"):
        model = HallucinationDetector(text_dim=datamodule.text_dim, answer_features=2, ungrounded_scorer=OldScorer,
                                      encoder=partial(GraphTransformerEncoder, hidden_channels=16, heads=2))  # fmt: skip
    assert model.ungrounded.answer_features == 0
    datamodule.setup("fit")
    batch = datamodule.collate(datamodule.datasets["train"][:2])
    batch.answer_features = torch.zeros(batch.y.numel(), 2)
    assert model(batch).shape == batch.y.shape


def test_an_old_scorer_named_by_class_path_still_builds(monkeypatch):
    """Found by a review: jsonargparse's partial of a class_path hides the class in its args, and the old scorer got
    answer_features= and failed."""
    import sys
    import types
    from collections.abc import Callable

    from jsonargparse import ArgumentParser

    from kglightning.modules.detector_compat import build_ungrounded_scorer
    from kglightning.nn import UngroundedAnswerScorer

    class OldScorer(UngroundedAnswerScorer):
        def __init__(self, text_dim: int, hidden: int = 8) -> None:
            super().__init__(text_dim, hidden=hidden)

    module = types.ModuleType("_kgl_old_scorers")
    module.OldScorer = OldScorer
    OldScorer.__module__ = "_kgl_old_scorers"
    monkeypatch.setitem(sys.modules, "_kgl_old_scorers", module)
    parser = ArgumentParser()
    parser.add_argument("--s", type=Callable[[int], UngroundedAnswerScorer])
    factory = parser.instantiate(parser.parse_args(["--s", '{"class_path": "_kgl_old_scorers.OldScorer"}'])).s
    with pytest.warns(UserWarning, match="takes no answer_features"):
        assert build_ungrounded_scorer(factory, 4, 3).answer_features == 0
    # the default scorer by class_path (its partial carries answer_features=0, a default) reads the detector's 3
    factory = parser.instantiate(parser.parse_args(["--s", '{"class_path": "kglightning.nn.UngroundedAnswerScorer", '
                                                           '"init_args": {"hidden": 32}}'])).s  # fmt: skip
    assert factory.keywords.get("answer_features") == 0  # what made telling a default from a user's choice impossible
    assert build_ungrounded_scorer(factory, 4, 3).answer_features == 3


def test_a_partial_state_dict_leaves_the_tuned_rule_alone_and_an_old_layer_alone_widens(datamodule):
    """Found by a review: strict=False loads of a part rewrote buffers they did not carry, and a state dict of the
    ungrounded scorer alone was not widened."""
    kwargs = dict(text_dim=datamodule.text_dim, encoder=partial(GraphTransformerEncoder, hidden_channels=16, heads=2),
                  mlp_hidden=16, dropout=0.0, answer_features=2)  # fmt: skip
    model = HallucinationDetector(**kwargs)
    for name, value in (("threshold", 0.3), ("ungrounded_threshold", 0.8), ("ungrounded_offset", 4.0),
                        ("majority_all", 0.0)):  # fmt: skip
        getattr(model, name).fill_(value)
    net_only = {k: v for k, v in model.state_dict().items() if k.startswith("net.")}
    model.load_state_dict(net_only, strict=False)
    assert (float(model.ungrounded_threshold), float(model.ungrounded_offset), float(model.majority_all)) == (
        pytest.approx(0.8), 4.0, 0.0)  # fmt: skip
    old = {k: v for k, v in model.state_dict().items() if k.startswith("ungrounded.")}
    old["ungrounded.mlp.0.weight"] = old["ungrounded.mlp.0.weight"][:, :-2]
    with pytest.warns(UserWarning, match="predates its 2 answer features"):
        model.load_state_dict(old, strict=False)


def test_the_forward_pass_decides_on_float32_logits_under_bf16_autocast(datamodule):
    """Found by a review: under bf16 autocast the offset and the sigmoid ran in bf16, while the rule was tuned on
    float32 numbers."""
    datamodule.setup("fit")
    model = _model(datamodule).eval()
    model.ungrounded_offset.fill_(1.2345678)
    batch = datamodule.collate(datamodule.datasets["validation"])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(batch)
    assert logits.dtype == torch.float32


def test_a_text_free_ungrounded_scorer_reads_only_its_scalars_and_trains(datamodule):
    from kglightning.nn import UngroundedAnswerScorer

    scorer = UngroundedAnswerScorer(8, hidden=4, answer_features=2, text=False).eval()
    assert scorer.mlp[0].in_features == 2 + 2  # similarity, rank and the two features
    g = torch.Generator().manual_seed(0)
    sim, rank, feats = torch.rand(3, generator=g), torch.rand(3, generator=g), torch.rand(3, 2, generator=g)
    a, b = torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g)
    assert torch.equal(scorer(a, a, a, sim, rank, feats), scorer(b, -b, b, sim, rank, feats))  # no text read
    assert not torch.equal(scorer(a, a, a, sim, rank, feats), scorer(a, a, a, sim, rank.flip(0), feats))

    datamodule.setup("fit")
    batch = datamodule.collate(datamodule.datasets["train"])
    L.seed_everything(0)
    model = HallucinationDetector(
        text_dim=datamodule.text_dim, encoder=partial(GraphTransformerEncoder, hidden_channels=16, heads=2),
        mlp_hidden=16, dropout=0.0, ungrounded_scorer=partial(UngroundedAnswerScorer, hidden=8, dropout=0.0, text=False),
    )  # fmt: skip
    before = [p.detach().clone() for p in model.ungrounded.parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    loose = batch.answer_grounding == 2
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch)[loose], batch.y[loose])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]  # (0.08 at seed 0; below 0.7 at seeds 0 to 7)
    assert all(not torch.equal(p, q) for p, q in zip(model.ungrounded.parameters(), before))
    probs = torch.sigmoid(model.eval()(batch)).detach()  # the wrong ones are last in the list: the rank tells
    assert probs[loose & (batch.y == 1)].mean() > probs[loose & (batch.y == 0)].mean() + 0.2
