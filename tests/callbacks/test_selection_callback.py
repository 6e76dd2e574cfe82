"""SelectionCallback: one predict run calibrates on validation, keeps test answers, writes answers and a report."""

from __future__ import annotations

import json
import logging
from functools import partial

import lightning as L
import pytest
import torch

from kglightning.callbacks import SelectionCallback
from kglightning.conformal import AnswerSelector, ScoredAnswers
from kglightning.data import SentenceEncoder
from kglightning.datamodules import DetectionDataModule
from kglightning.modules import HallucinationDetector
from kglightning.nn import GraphTransformerEncoder

ENCODER = partial(GraphTransformerEncoder, hidden_channels=16, heads=4)


def _trainer(tmp_path, callbacks, epochs=2):
    return L.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=False, default_root_dir=tmp_path, accelerator="cpu", callbacks=callbacks)  # fmt: skip


def _apart(tmp_path):
    """A folder beside ``tmp_path``, which is the datamodule's data_dir: the callback refuses outputs inside it."""
    return tmp_path.with_name(f"{tmp_path.name}-out")


@pytest.fixture
def fitted(detection_dir, tiny_encoder_dir, tmp_path):
    L.seed_everything(0)
    dm = DetectionDataModule(data_dir=detection_dir, encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
                             cache_dir=str(tmp_path / "cache"), batch_size=8)  # fmt: skip
    model = HallucinationDetector(text_dim=32, encoder=ENCODER, mlp_hidden=16)
    _trainer(tmp_path, []).fit(model, dm)
    return model, dm


def _rows(model, loader):
    model.eval()
    with torch.no_grad():
        return [row for i, b in enumerate(loader) for row in model.predict_step(b, i)]


@pytest.mark.parametrize("rule", ["fdr", "question"])
def test_predict_writes_the_selection_an_independent_selector_makes(fitted, tmp_path, rule):
    model, dm = fitted
    root = _apart(tmp_path) / "trust"
    selector = AnswerSelector(rule=rule, alpha=0.3, seed=3)
    cb = SelectionCallback(output_dir=str(root), selector=selector, group_by="none", report_alphas=[0.2, 0.3])
    _trainer(tmp_path, [cb]).predict(model, dm)
    out = root / "test"  # the predicted split's folder
    assert cb.run_dir == out
    # the same selection, computed from the model's own rows
    cal, test = _rows(model, dm.split_dataloader("validation")), _rows(model, dm.predict_dataloader())

    def answers(rows):
        q = [i for i, r in enumerate(rows) for _ in r["prediction"]]
        flat = [(p, y) for r in rows for p, y in zip(r["hallucination_prob"], r["hallucinated"])]
        return ScoredAnswers([p for p, _ in flat], q, None, [y for _, y in flat])

    keep = AnswerSelector(rule=rule, alpha=0.3, seed=3).select(answers(cal), answers(test)).keep.tolist()
    written = [json.loads(line) for line in (out / "trusted_answers.jsonl").open()]
    assert [r["id"] for r in written] == [r["id"] for r in test]
    i = 0
    for r in written:
        k = keep[i : i + len(r["prediction"])]
        i += len(r["prediction"])
        assert r["kept"] == [a for a, kk in zip(r["prediction"], k) if kk]
        assert r["abstained"] == (not any(k)) and r["selection"]["rule"] == rule
    report = json.loads((out / "report.json").read_text())
    assert report["kept"] == sum(keep) and report["questions"] == len(test)
    assert {c["alpha"] for c in report["summary"]} == {0.2, 0.3}
    for name in ("report.md", "selection.png", "reliability.png"):
        assert (out / name).stat().st_size > 0
    assert "one run" in (out / "report.md").read_text()
    # fdr on the detector's answer lists (several answers a question) is flagged in the report
    assert report["groups"]["all"]["clustered"] is (True if rule == "fdr" else None)
    assert ("**fdr on answer lists**" in (out / "report.md").read_text()) is (rule == "fdr")
    if rule == "question":  # another split predicted: its own folder, and the test split's files stay as they were
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        dm.predict_split = "train"
        _trainer(tmp_path, [cb]).predict(model, dm)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        train = [json.loads(line) for line in (root / "train" / "trusted_answers.jsonl").open()]
        assert len(train) == len(dm.split_records("train")) and set(before) <= {
            p.name for p in (root / "train").iterdir()
        }


def test_groups_are_grounded_or_not_and_unlabelled_calibration_is_refused(fitted, tmp_path, caplog):
    model, dm = fitted
    cb = SelectionCallback(output_dir=str(_apart(tmp_path) / "t"), group_by="grounded")
    _trainer(tmp_path, [cb]).predict(model, dm)
    report = json.loads((_apart(tmp_path) / "t" / "test" / "report.json").read_text())
    assert set(report["groups"]) <= {"grounded", "ungrounded"} and report["groups"]

    class Unlabelled(HallucinationDetector):
        def predict_step(self, batch, batch_idx):
            return [
                {k: v for k, v in row.items() if k != "hallucinated"} for row in super().predict_step(batch, batch_idx)
            ]

    bare = Unlabelled(text_dim=32, encoder=ENCODER, mlp_hidden=16)
    bare.load_state_dict(model.state_dict())
    with pytest.raises(RuntimeError, match="16 of 16 questions of the 'validation' split have no 'hallucinated'"):
        _trainer(tmp_path, [SelectionCallback(output_dir=str(_apart(tmp_path) / "u"))]).predict(bare, dm)

    class SomeUnlabelled(HallucinationDetector):  # records without gold answers: their rows carry no labels
        def predict_step(self, batch, batch_idx):
            rows = super().predict_step(batch, batch_idx)
            return [{k: v for k, v in r.items() if k != "hallucinated" or i % 4} for i, r in enumerate(rows)]

    some = SomeUnlabelled(text_dim=32, encoder=ENCODER, mlp_hidden=16)
    some.load_state_dict(model.state_dict())
    cb = SelectionCallback(output_dir=str(_apart(tmp_path) / "s"), group_by="none")
    with caplog.at_level(logging.WARNING, logger="kglightning.callbacks.selection"):
        _trainer(tmp_path, [cb]).predict(some, dm)
    assert "left 4 of 16 questions of the 'validation' split out of calibration" in caplog.text
    assert len(cb.calibration.rows) == 12 and cb.calibration.labelled
    with pytest.raises(ValueError, match="group_by"):
        SelectionCallback(group_by="hops")
    with pytest.raises(ValueError, match="report_alphas"):
        SelectionCallback(report_alphas=[1.5])


def test_rows_come_back_in_dataset_order_once_and_conflicts_are_errors():
    from kglightning.callbacks.selection import _dataset_order

    rows = [{"id": i, "p": [i]} for i in range(5)]
    parts = [[rows[0], rows[2], rows[4]], [rows[1], rows[3], rows[0]]]  # rank 1 padded with a repeat of item 0
    assert _dataset_order(parts) == rows
    with pytest.raises(RuntimeError, match="two different predicted rows"):
        _dataset_order([[rows[0]], [{"id": 0, "p": [9]}]])


def _graph(record: dict):
    """The detector's graph of one record dict, every text on embedding row 0 (no encoder needed)."""
    from kglightning.data.records import KGQARecord
    from kglightning.datamodules.detection_graphs import DetectionStats, build_detection_graph

    class Rows(dict):
        def __missing__(self, key):
            return 0

        def get(self, key, default=None):
            return 0

    return build_detection_graph(KGQARecord.from_dict(record), Rows(), DetectionStats())


def test_records_without_gold_answers_carry_no_labels(detection_records):
    rec = detection_records(1, 0)[0]
    labelled = _graph(rec)
    rec["answer"], rec["a_entity"] = [], []
    bare = _graph(rec)
    assert labelled.labelled.tolist() == [True] and bare.labelled.tolist() == [False]


def test_record_groups_and_cited_paths_reach_the_output(detection_dir, tiny_encoder_dir, tmp_path):
    """group_by='record' groups questions by a field of their records; cited paths of kept answers are written."""
    from pathlib import Path

    data = tmp_path / "cited"
    data.mkdir()
    for split in ("train", "validation", "test"):
        rows = [json.loads(line) for line in Path(detection_dir, f"{split}.jsonl").open()]
        for i, r in enumerate(rows):
            r["kind"] = "even" if i % 2 == 0 else "odd"
            r["prediction_paths"] = [[[r["q_entity"][0], "cites", p]] for p in r["prediction"]]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    L.seed_everything(0)
    dm = DetectionDataModule(data_dir=str(data), encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
                             cache_dir=str(tmp_path / "cache"), batch_size=8)  # fmt: skip
    model = HallucinationDetector(text_dim=32, encoder=ENCODER, mlp_hidden=16)
    _trainer(tmp_path, []).fit(model, dm)
    out = tmp_path / "t"
    cb = SelectionCallback(output_dir=str(out), selector=AnswerSelector(rule="question", alpha=0.5),
                           group_by="record", group_field="kind", report_alphas=[0.5])  # fmt: skip
    _trainer(tmp_path, [cb]).predict(model, dm)
    out = cb.run_dir
    report = json.loads((out / "report.json").read_text())
    assert set(report["groups"]) == {"even", "odd"}
    rows = [json.loads(line) for line in (out / "trusted_answers.jsonl").open()]
    topic = {r["id"]: r["q_entity"][0] for r in map(json.loads, (data / "test.jsonl").open())}
    assert any(r["kept"] for r in rows)
    for r in rows:  # each kept answer with the path its record cites for it
        assert r["kept_paths"] == [[[topic[r["id"]], "cites", a]] for a in r["kept"]]
        assert len(r["cited_paths"]) == len(r["prediction"])
    with pytest.raises(ValueError, match="group_field"):
        SelectionCallback(group_by="record")
    with pytest.raises(ValueError, match="group_field"):
        SelectionCallback(group_field="kind")


def test_cited_paths_merge_every_entry_behind_an_answer(detection_records):
    """Repeats and spellings of one node are one answer: its cited paths are those of all its entries."""
    from kglightning.callbacks.selection import _cited

    rec = detection_records(1, 0)[0]
    node = rec["graph"][0][2]
    rec["prediction"] = [node, node.lower(), node]
    rec.pop("confidence", None)
    rec["prediction_paths"] = [[["a", "r1", node]], [["a", "r2", node]], [["a", "r1", node]]]
    g = _graph(rec)
    assert g.answer_names == [node] and g.answer_entries == [[0, 1, 2]]
    row = {"prediction": g.answer_names, "prediction_entries": g.answer_entries}
    assert _cited(row, rec["prediction"], rec["prediction_paths"]) == [[["a", "r1", node], ["a", "r2", node]]]
    # without the detector's entries: by exact text; a newline-joined prediction is split first
    assert _cited({"prediction": "x\ny"}, ["x", "y", "x"], [[["a", "r", "x"]], [], [["b", "r", "x"]]]) == [
        [["a", "r", "x"], ["b", "r", "x"]],
        [],
    ]


def test_reliability_uses_probabilities_when_selecting_on_logits():
    from kglightning.callbacks.selection import _probabilities
    from kglightning.conformal.selection_io import scored_rows

    rows = [{"id": 1, "prediction": ["a", "b"], "hallucination_logit": [-2.0, 3.0], "hallucination_prob": [0.12, 0.95],
             "hallucinated": [False, True]}]  # fmt: skip
    on_logits = scored_rows(enumerate(rows, 1), "<rows>", score="hallucination_logit")
    assert _probabilities(on_logits).tolist() == [0.12, 0.95]
    on_probs = scored_rows(enumerate(rows, 1), "<rows>", score="hallucination_prob")
    assert _probabilities(on_probs).tolist() == [0.12, 0.95]
    bare = scored_rows(enumerate([{k: v for k, v in rows[0].items() if k != "hallucination_prob"}], 1), "<rows>",
                       score="hallucination_logit")  # fmt: skip
    assert _probabilities(bare) is None


def test_the_outputs_never_go_into_the_data_folder(tmp_path):
    """Review of issue 57 (a user's files): ``output_dir`` inside the datamodule's ``data_dir`` is refused before
    anything is calibrated or written."""
    from types import SimpleNamespace

    from kglightning.fileio import OutputOverInputError

    trainer = SimpleNamespace(datamodule=SimpleNamespace(data_dir=str(tmp_path)))
    cb = SelectionCallback(output_dir=str(tmp_path / "trust"), selector=AnswerSelector("top", 0.1))
    with pytest.raises(OutputOverInputError, match="inside the input folder"):
        cb.on_predict_start(trainer, None)
    assert list(tmp_path.iterdir()) == []


def test_the_reliability_diagram_reads_probabilities_not_logits_that_happen_to_lie_in_0_1():
    from kglightning.callbacks.selection import _probabilities
    from kglightning.conformal.selection_io import scored_rows

    rows = [{"id": "a", "prediction": ["x", "y"], "hallucination_logit": [0.2, 0.9],
             "hallucination_prob": [0.5498, 0.7109], "hallucinated": [False, True]}]  # fmt: skip
    scored = scored_rows(enumerate(rows, 1), "<rows>", "hallucination_logit")
    assert _probabilities(scored).tolist() == [0.5498, 0.7109]
    bare = [{k: v for k, v in r.items() if k != "hallucination_prob"} for r in rows]
    assert _probabilities(scored_rows(enumerate(bare, 1), "<rows>", "hallucination_logit")).tolist() == [0.2, 0.9]
    bare[0]["hallucination_logit"] = [-2.0, 3.0]
    assert _probabilities(scored_rows(enumerate(bare, 1), "<rows>", "hallucination_logit")) is None
