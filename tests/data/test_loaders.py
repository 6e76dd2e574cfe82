"""Record loaders: formats, round trips and bad-input handling (no network)."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kglightning.data import KGQARecord, RecordError, read_records, write_records
from kglightning.data.sources import RecordList

LOGGER = "kglightning.data.sources.loaders"


def rec(i: int, **over) -> dict:
    d = {
        "id": f"q{i}",
        "question": f"question {i} — où ?",
        "answer": [f"ans{i}"],
        "q_entity": [f"e{i}"],
        "a_entity": [f"ans{i}"],
        "graph": [[f"e{i}", "r", f"ans{i}"], [f"e{i}", "s", f"ans{i}"], [f"ans{i}", "r", "m.0x"]],
    }
    d.update(over)
    return d


RECS = [rec(i) for i in range(4)]


def records(data):
    return [KGQARecord.from_dict(d) for d in data]


def write_jsonl(path, rows, raw_lines=()):
    lines = [json.dumps(r, ensure_ascii=False) for r in rows] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, tmp_path_factory, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path_factory.mktemp("cache")))  # each test reads its files afresh


def test_write_then_read_jsonl(tmp_path):
    path = tmp_path / "sub" / "out.jsonl"
    assert write_records(records(RECS), path) == 4
    text = path.read_text(encoding="utf-8")
    assert "où" in text  # ensure_ascii=False
    got = read_records(path)
    assert isinstance(got, RecordList) and got == records(RECS)
    assert got.source == str(path) and got.skipped == [] and got.empty_graph == [] and got.unknown_topic == []
    assert not list(tmp_path.glob("sub/.*tmp"))  # no temp file left behind


def test_write_is_atomic_on_failure(tmp_path):
    path = tmp_path / "out.jsonl"
    write_records(records(RECS[:1]), path)
    with pytest.raises(RecordError):
        write_records([RECS[1], {"id": "bad"}], path)
    assert read_records(path) == records(RECS[:1])  # old content intact
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # temp file removed


def test_write_rejects_other_suffix(tmp_path):
    with pytest.raises(ValueError, match="jsonl"):
        write_records([], tmp_path / "x.json")


def test_jsonl_blank_lines_and_limit(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", RECS, raw_lines=["", "   "])
    assert len(read_records(path)) == 4
    assert [r.id for r in read_records(path, limit=2)] == ["q0", "q1"]


@pytest.mark.parametrize("layout", ["list", "split", "data"])
def test_json(tmp_path, layout):
    path = tmp_path / "a.json"
    payload = {"list": RECS, "split": {"test": RECS, "train": []}, "data": {"data": RECS, "version": 1}}[layout]
    path.write_text(json.dumps(payload), encoding="utf-8")
    got = read_records(path, split="test" if layout == "split" else None)
    assert got == records(RECS)


def test_json_bad_layout(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"train": RECS}), encoding="utf-8")
    with pytest.raises(RecordError, match="'train'"):
        read_records(path)
    path.write_text('[{"id": 1,', encoding="utf-8")
    with pytest.raises(RecordError, match="invalid JSON") as info:
        read_records(path)
    assert info.value.source == str(path)


def test_parquet_round_trip(tmp_path):
    data = [rec(0, prediction=["ans0"], confidence=[0.5]), rec(1, prediction=["x"], confidence=[1.0])]
    data = [{**d, "prediction_paths": [[["e0", "r", "ans0"]]]} for d in data]
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(data), path)
    got = read_records(path)
    assert got == records(data)
    assert isinstance(got[0].graph[0], tuple) and isinstance(got[0].answer, list)


def test_parquet_bad_row_index(tmp_path):
    data = [rec(0), rec(1, graph=[["a", "r"]]), rec(2)]
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(data), path)
    with pytest.raises(RecordError) as info:
        read_records(path)
    assert (info.value.source, info.value.line, info.value.field) == (str(path), 1, "graph")


def test_save_to_disk_dataset_and_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(RECS).save_to_disk(str(tmp_path / "ds"))
    assert read_records(tmp_path / "ds") == records(RECS)
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(RECS[:3]), "test": datasets.Dataset.from_list(RECS[3:])}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    got = read_records(tmp_path / "dd", split="test")
    assert got == records(RECS[3:]) and got.split == "test"
    with pytest.raises(RecordError, match="several splits"):
        read_records(tmp_path / "dd")
    with pytest.raises(RecordError, match="no split 'validation'"):
        read_records(tmp_path / "dd", split="validation")


def test_hub_style_parquet_directory(tmp_path):
    """The layout of a rmanluo/RoG-webqsp snapshot: data/<split>-0000x-of-0000y.parquet."""
    root = tmp_path / "RoG-webqsp"
    (root / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(RECS[:3]), root / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(RECS[3:]), root / "data" / "test-00000-of-00001.parquet")
    assert read_records(root, split="train") == records(RECS[:3])
    assert read_records(str(root), split="test") == records(RECS[3:])


def test_bad_json_line_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", RECS[:2], raw_lines=["", '{"id": "q9", "question": '])
    with pytest.raises(RecordError) as info:
        read_records(path)
    e = info.value
    assert (e.source, e.line) == (str(path), 4) and str(e).startswith(f"{path}:4:") and "invalid JSON" in str(e)


def test_bad_field_names_file_line_field(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [RECS[0], rec(1, graph=[["a", "r"]]), RECS[2]])
    with pytest.raises(RecordError) as info:
        read_records(path)
    assert (info.value.source, info.value.line, info.value.field) == (str(path), 2, "graph")
    assert f"{path}:2: field 'graph'" in str(info.value)


def test_invalid_utf8_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(json.dumps(RECS[0]).encode() + b"\n\xff\xfe\n")
    with pytest.raises(RecordError, match="UTF-8") as info:
        read_records(path)
    assert info.value.line == 2
    assert len(read_records(path, on_bad_record="skip")) == 1


def test_skip_mode_counts_and_logs(tmp_path, caplog):
    rows = [
        json.dumps(RECS[0]),
        "not json",
        json.dumps(rec(1, answer=5)),
        json.dumps(RECS[2]),
        json.dumps(rec(3, confidence=[2.0], prediction=["a"])),
        json.dumps(RECS[3]),
    ]
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = read_records(path, on_bad_record="skip")
    assert [r.id for r in got] == ["q0", "q2", "q3"]
    assert [(e.line, e.field) for e in got.skipped] == [(2, None), (3, "answer"), (5, "confidence")]
    assert got.num_read == 6
    msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    per_record = [m for m in msgs if m.startswith("skipping record")]
    assert len(per_record) == 3 and f"{path}:3: field 'answer'" in per_record[1]
    summary = [m for m in msgs if m.startswith("skipped")]
    assert summary == [
        f"skipped 3 of 6 records from {path}: 1 x invalid JSON, 1 x field 'answer', 1 x field 'confidence'"
    ]
    assert "3 skipped" in got.summary()


def test_duplicate_ids(tmp_path, caplog):
    path = write_jsonl(tmp_path / "a.jsonl", [RECS[0], RECS[1], rec(0, question="again")])
    with pytest.raises(RecordError) as info:
        read_records(path)
    assert (info.value.line, info.value.field) == (3, "id") and "first seen at line 1" in str(info.value)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = read_records(path, on_bad_record="skip")
    assert [r.question for r in got] == [RECS[0]["question"], RECS[1]["question"]]
    assert len(got.skipped) == 1 and any("duplicate id" in r.getMessage() for r in caplog.records)


def test_missing_file_and_unsupported_suffix(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl.*supported inputs: .jsonl, .json, .parquet"):
        read_records(tmp_path / "nope.jsonl")
    bad = tmp_path / "a.csv"
    bad.write_text("id,question\n")
    with pytest.raises(ValueError, match=r"a\.csv: unsupported format '\.csv'.*\.parquet"):
        read_records(bad)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ValueError, match="holds no dataset"):
        read_records(tmp_path / "empty_dir")
    with pytest.raises(ValueError, match="on_bad_record"):
        read_records(tmp_path / "a.csv", on_bad_record="ignore")


def test_empty_graph_and_unknown_topic_are_kept_and_counted(tmp_path, caplog):
    rows = [
        RECS[0],
        rec(1, graph=[]),
        rec(2, q_entity=["not-in-graph"]),
        rec(3, q_entity=["e3", "missing"]),
        rec(4, q_entity=[]),
        rec(5, graph=None),
    ]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = read_records(path)
    assert len(got) == 6 and got.skipped == []
    assert got.empty_graph == ["q1", "q5"]
    assert got.unknown_topic == ["q2", "q3", "q4"]
    summaries = [r.getMessage() for r in caplog.records if "empty graph" in r.getMessage()]
    assert len(summaries) == 1 and "2 of 6 records have an empty graph and 3" in summaries[0]
    assert "2 with an empty graph, 3 with an unknown topic entity" in got.summary()


def test_clean_file_logs_nothing(tmp_path, caplog):
    path = write_jsonl(tmp_path / "a.jsonl", RECS)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        read_records(path)
    assert not [r for r in caplog.records if r.name == LOGGER]


def test_hf_prefix_calls_load_dataset(monkeypatch):
    """``hf:owner/name`` goes to datasets.load_dataset (faked here: tests never touch the network)."""
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(name, split=None, **kw):
        calls.append((name, split))
        return datasets.Dataset.from_list(RECS)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    got = read_records("hf:rmanluo/RoG-webqsp", split="test", limit=2)
    assert calls == [("rmanluo/RoG-webqsp", "test")]
    assert got == records(RECS[:2]) and got.source == "hf:rmanluo/RoG-webqsp"


PATHS = [[["e0", "r", "ans0"]], [["e0", "r", "ans0"]], []]


def test_prediction_paths_survive_write_and_read(tmp_path):
    data = [rec(0, prediction=["ans0", "ans0", "x"], prediction_paths=PATHS), rec(1)]
    path = tmp_path / "out.jsonl"
    write_records(records(data), path)
    got = read_records(path)
    assert got == records(data) and got[0].prediction_paths == PATHS and got[1].prediction_paths is None
    assert json.loads(path.read_text(encoding="utf-8").splitlines()[0])["prediction_paths"] == PATHS


def test_lines_json_cannot_read_are_errors_with_their_place_or_counted_skips(tmp_path):
    """A 5,000-digit integer (Python's int limit) and 100,000 nested brackets (its recursion limit) make json raise
    ValueError and RecursionError, not JSONDecodeError."""
    hostile = ['{"id": "q9", "n": ' + "7" * 5000 + "}", "[" * 100_000 + "]" * 100_000]
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join([json.dumps(RECS[0]), *hostile, json.dumps(RECS[1])]) + "\n", encoding="utf-8")
    with pytest.raises(RecordError, match="invalid JSON: a number that cannot be read") as info:
        read_records(path)
    assert (info.value.source, info.value.line) == (str(path), 2)
    got = read_records(path, on_bad_record="skip")
    assert [r.id for r in got] == ["q0", "q1"] and got.num_read == 4
    assert [(e.line, e.reason) for e in got.skipped][1] == (3, "invalid JSON: nested too deeply to read")
    whole = tmp_path / "a.json"
    for text in ("[" + "7" * 5000 + "]", "[" * 100_000 + "]" * 100_000):
        whole.write_text(text, encoding="utf-8")
        with pytest.raises(RecordError, match="invalid JSON") as info:
            read_records(whole)
        assert info.value.source == str(whole)
