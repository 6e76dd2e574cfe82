"""DetectionDataModule: every split is read and checked before any answer is proposed, each split is read once
(so its skip summary is logged once), and graphs come out for every stage."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from kglightning.data import SentenceEncoder
from kglightning.data.proposer import AnswerProposer
from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.store.cache import folder_name
from kglightning.datamodules import DetectionDataModule


class EchoGoldProposer(AnswerProposer):
    """Proposes each record's first gold answer and counts how many records it was asked about."""

    def __init__(self) -> None:
        self.asked = 0

    @property
    def cache_key(self) -> str:
        return "echo-gold"

    def propose(self, records) -> list[KGQARecord]:
        out = []
        for r in records:
            self.asked += 1
            d = r.to_dict()
            d["prediction"] = r.answer[:1]
            out.append(KGQARecord.from_dict(d))
        return out


def _write(folder: Path, splits: dict[str, list[dict]], raw_lines: dict[str, list[str]] | None = None) -> str:
    folder.mkdir(exist_ok=True)
    for split, records in splits.items():
        with open(folder / f"{split}.jsonl", "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
            for line in (raw_lines or {}).get(split, []):
                f.write(line + "\n")
    return str(folder)


@pytest.fixture
def splits(detection_records):
    out = {}
    for split, (n, seed) in {"train": (12, 0), "validation": (6, 1), "test": (6, 2)}.items():
        out[split] = detection_records(n, seed)
        for r in out[split]:
            r["id"] = f"{split}-{r['id']}"
    return out


def _dm(data_dir: str, tmp_path: Path, encoder_dir: str, **kwargs) -> DetectionDataModule:
    return DetectionDataModule(
        data_dir=data_dir, encoder=SentenceEncoder(encoder_dir), cache_dir=str(tmp_path / "cache"), **kwargs
    )


def test_empty_split_fails_before_any_proposal(splits, tmp_path, tiny_encoder_dir):
    for records in splits.values():
        for r in records:
            del r["prediction"], r["confidence"]
    splits["test"] = []
    proposer = EchoGoldProposer()
    dm = _dm(_write(tmp_path / "d", splits), tmp_path, tiny_encoder_dir, proposer=proposer)
    with pytest.raises(RecordError) as err:
        dm.prepare_data()
    assert str(err.value) == f"{tmp_path / 'd' / 'test.jsonl'}: split 'test' is empty: it holds no record"
    assert proposer.asked == 0
    assert not (tmp_path / "cache" / "proposals").exists()


def test_split_with_every_record_skipped_is_an_error(splits, tmp_path, tiny_encoder_dir):
    splits["validation"] = []
    data = _write(tmp_path / "d", splits, raw_lines={"validation": ["{not json", "[1, 2]"]})
    dm = _dm(data, tmp_path, tiny_encoder_dir, on_bad_record="skip")
    with pytest.raises(RecordError, match=r"validation.jsonl: split 'validation' is empty: all 2 records were skipped"):
        dm.prepare_data()


def test_missing_predictions_without_proposer_names_file_and_field(splits, tmp_path, tiny_encoder_dir):
    del splits["train"][2]["prediction"], splits["train"][2]["confidence"]
    dm = _dm(_write(tmp_path / "d", splits), tmp_path, tiny_encoder_dir)
    with pytest.raises(RecordError) as err:
        dm.prepare_data()
    assert err.value.field == "prediction" and err.value.source.endswith("train.jsonl")
    assert "1 of 12 records have no 'prediction' (first: id 'train-q2')" in str(err.value)


def test_each_split_is_read_and_summarised_once(splits, tmp_path, tiny_encoder_dir, caplog):
    data = _write(tmp_path / "d", splits, raw_lines={split: ["{broken"] for split in splits})
    dm = _dm(data, tmp_path, tiny_encoder_dir, on_bad_record="skip")
    with caplog.at_level(logging.WARNING, logger="kglightning"):
        dm.prepare_data()
        dm.setup("fit")
        dm.setup("test")
        dm.setup("predict")
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped 1 of")]
    assert len(summaries) == 3, summaries
    assert {Path(m.split(" from ")[1].split(":")[0]).name for m in summaries} == {
        "train.jsonl",
        "validation.jsonl",
        "test.jsonl",
    }
    assert {len(dm.datasets[s]) for s in ("train", "validation", "test")} == {12, 6}


def test_proposals_are_made_once_and_cached(splits, tmp_path, tiny_encoder_dir):
    for records in splits.values():
        for r in records:
            del r["prediction"], r["confidence"]
    data = _write(tmp_path / "d", splits)
    proposer = EchoGoldProposer()
    dm = _dm(data, tmp_path, tiny_encoder_dir, proposer=proposer)
    dm.prepare_data()
    dm.setup("fit")
    assert proposer.asked == 24
    again = EchoGoldProposer()
    dm2 = _dm(data, tmp_path, tiny_encoder_dir, proposer=again)
    dm2.prepare_data()
    dm2.setup("test")
    assert again.asked == 0
    assert all(g.y.sum() == 0 for g in dm2.datasets["test"])  # gold answers: nothing hallucinated


def test_each_split_is_answered_by_the_proposer_for_that_split(splits, tmp_path, tiny_encoder_dir):
    class PerSplit(EchoGoldProposer):
        def __init__(self, split: str = "") -> None:
            super().__init__()
            self.split = split

        @property
        def cache_key(self) -> str:
            return f"echo-{self.split}"

        def for_split(self, split: str) -> PerSplit:
            return PerSplit(split)

    for records in splits.values():
        for r in records:
            del r["prediction"], r["confidence"]
    dm = _dm(_write(tmp_path / "d", splits), tmp_path, tiny_encoder_dir, proposer=PerSplit())
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    keys = {p.parent.name: p.name for p in (tmp_path / "cache" / "proposals-v2").rglob("*.jsonl")}
    assert keys == {folder_name(f"echo-{s}"): f"{s}.jsonl" for s in ("train", "validation", "test")}


def test_a_proposer_key_with_slashes_or_dots_stays_one_folder_under_the_cache(splits, tmp_path, tiny_encoder_dir):
    class FromServer(EchoGoldProposer):
        @property
        def cache_key(self) -> str:  # a model id as a server lists it
            return "kaping-openai-chat:http://127.0.0.1:9/v1:../../../escaped"

    for records in splits.values():
        for r in records:
            del r["prediction"], r["confidence"]
    dm = _dm(_write(tmp_path / "d", splits), tmp_path, tiny_encoder_dir, proposer=FromServer())
    dm.prepare_data()
    files = list(tmp_path.rglob("*.jsonl"))
    proposals = [f for f in files if "proposals-v2" in f.parts]
    assert len(proposals) == 3 and not (tmp_path / "escaped").exists()
    assert {f.relative_to(tmp_path / "cache" / "proposals-v2").parts[1] for f in proposals} == {
        folder_name(FromServer().cache_key)
    }


def test_proposal_cache_holds_predictions_only_and_a_stale_one_is_redone(splits, tmp_path, tiny_encoder_dir):
    for records in splits.values():
        for r in records:
            del r["prediction"], r["confidence"]
    data = _write(tmp_path / "d", splits)
    dm = _dm(data, tmp_path, tiny_encoder_dir, proposer=EchoGoldProposer())
    dm.prepare_data()
    files = sorted(
        (tmp_path / "cache").glob(f"proposals-v2/*/{folder_name('echo-gold')}/*.jsonl"), key=lambda f: f.name
    )
    assert [f.name for f in files] == ["test.jsonl", "train.jsonl", "validation.jsonl"]
    rows = [json.loads(line) for line in files[1].read_text().splitlines()]
    assert set(rows[0]) == {"id", "prediction", "confidence", "extra"} and rows[0]["id"] == "train-q0"
    first = dm.records("train")
    # the cache no longer matches the records (an id changed): proposals are made again, with a warning
    rows[0]["id"] = "someone-else"
    files[1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = EchoGoldProposer()
    dm2 = _dm(data, tmp_path, tiny_encoder_dir, proposer=again)
    assert [r.prediction for r in dm2.records("train")] == [r.prediction for r in first]
    assert again.asked == 12


def test_test_stage_prepares_only_what_test_reads(splits, tmp_path, tiny_encoder_dir):
    import lightning as L
    from lightning.pytorch.trainer.states import TrainerFn

    splits["train"] = []  # an empty train split does not matter to `test`
    dm = _dm(_write(tmp_path / "d", splits), tmp_path, tiny_encoder_dir)
    trainer = L.Trainer(logger=False, enable_progress_bar=False)
    trainer.state.fn = TrainerFn.TESTING
    dm.trainer = trainer
    dm.prepare_data()
    assert set(dm._read) == {"validation", "test"}


def _two_hop_split(prediction: list[str]) -> list[dict]:
    graph = [["France", "location.country.capital", "Paris"], ["Paris", "location.location.containedby", "Europe"]]
    return [{"id": "q", "question": "Where is the capital of France?", "answer": ["Paris"], "q_entity": ["France"],
             "a_entity": ["Paris"], "graph": graph, "prediction": prediction}]  # fmt: skip


def test_hops_alone_need_no_path_texts(tmp_path, tiny_encoder_dir):
    # an answer two hops away: with hops only, no path text is embedded, and none is looked up
    folder = _write(tmp_path / "d", {s: _two_hop_split(["Europe", "Paris"]) for s in ("train", "validation", "test")})
    dm = _dm(folder, tmp_path, tiny_encoder_dir, answer_features=["hops"], path_max_hops=2)
    dm.prepare_data()
    dm.setup("fit")
    (g,) = dm.datasets["train"]
    assert g.answer_names == ["Europe", "Paris"]
    assert g.answer_features.flatten().tolist() == [1.0, 0.5]  # 2 / 2 hops, 1 / 2


def test_an_answer_matched_by_its_normalised_name_has_the_node_s_features(tmp_path, tiny_encoder_dir):
    folder = _write(tmp_path / "d", {s: _two_hop_split(["paris", "Mars"]) for s in ("train", "validation", "test")})
    dm = _dm(folder, tmp_path, tiny_encoder_dir, answer_features=["hops", "path_score"], path_max_hops=2)
    dm.prepare_data()
    dm.setup("fit")
    (g,) = dm.datasets["train"]
    assert g.answer_names == ["paris", "Mars"] and g.y.tolist() == [0.0, 1.0]  # matched to Paris; Mars ungrounded
    assert g.answer_grounding.tolist() == [0, 2]
    hops, score = g.answer_features[0].tolist()
    assert hops == 0.5 and score != 0.0  # one hop from France, with its path, not "unreachable"
    assert g.answer_features[1].tolist() == [1.5, 0.0]  # an ungrounded answer is unreachable, with no path


def test_the_llm_signals_are_answer_features_of_both_populations(tmp_path, tiny_encoder_dir):
    rows = _two_hop_split(["Paris", "Mars", "paris", "Europe", "mars"])
    rows[0]["prediction_paths"] = [[["France", "location.country.capital", "Paris"]], [["France", "moon", "Mars"]],
                                   [], [], [["France", "moon", "Mars"]]]  # fmt: skip
    folder = _write(tmp_path / "d", {s: rows for s in ("train", "validation", "test")})
    dm = _dm(folder, tmp_path, tiny_encoder_dir, answer_features=["votes", "hops", "cited_in_graph", "first_rank"],
             path_max_hops=2)  # fmt: skip
    assert dm.num_answer_features == 4
    dm.prepare_data()
    dm.setup("fit")
    (g,) = dm.datasets["train"]
    assert g.answer_names == ["Paris", "Europe", "Mars"] and g.answer_grounding.tolist() == [0, 0, 2]
    # Paris: two of five entries, its one path in the graph; Europe: one entry, first at 3; Mars: two, made-up path
    want = torch.tensor([[0.4, 0.5, 1.0, 0.0], [0.2, 1.0, 0.0, 0.6], [0.4, 1.5, 0.0, 0.2]])
    assert torch.allclose(g.answer_features, want)
    with pytest.raises(ValueError, match="answer_features must be distinct names"):
        _dm(folder, tmp_path, tiny_encoder_dir, answer_features=["beams"])


def test_graphs_built_on_forked_processes_equal_those_of_one(splits, tmp_path, tiny_encoder_dir, monkeypatch):
    import dataclasses

    import kglightning.datamodules.detection as detection

    data = _write(tmp_path / "d", splits)
    one = _dm(data, tmp_path, tiny_encoder_dir)
    one.setup("fit")
    monkeypatch.setattr(detection, "BUILD_CHUNK", 5)
    many = _dm(data, tmp_path / "many", tiny_encoder_dir, build_workers=3)  # its own cache: the same rows
    many.setup("fit")
    for split in ("train", "validation"):
        a, b = one.datasets[split], many.datasets[split]
        assert len(a) == len(b) > 0
        for g, h in zip(a, b):
            assert g.keys() == h.keys()
            for key in g.keys():
                x, y = g[key], h[key]
                assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, (key, x, y)
        assert dataclasses.asdict(one.stats[split]) == dataclasses.asdict(many.stats[split])
    with pytest.raises(ValueError, match="build_workers"):
        _dm(data, tmp_path, tiny_encoder_dir, build_workers=0)
