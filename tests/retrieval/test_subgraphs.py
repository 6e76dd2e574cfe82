"""PCSTSubgraphs: every data module can re-cut its records' graphs with PCST (record graph, whole KG, triples file)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from kglightning.data.embeddings import SentenceEncoder
from kglightning.datamodules.base import KGQADataModule
from kglightning.retrieval import PCSTRetriever, PCSTSubgraphs

GRAPH = [["France", "capital", "Paris"], ["Paris", "river", "Seine"], ["France", "currency", "Euro"],
         ["France", "language", "French"], ["Euro", "symbol", "€"], ["French", "script", "Latin"]]  # fmt: skip


def _record(qid: str, topic: str = "France", graph=GRAPH) -> dict:
    return {"id": qid, "question": "Which river flows through the capital of France?", "answer": ["Seine"],
            "q_entity": [topic], "a_entity": ["Seine"], "graph": graph}  # fmt: skip


def _write(folder: Path, rows: dict[str, list[dict]]) -> str:
    for split, records in rows.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


@pytest.fixture(scope="module")
def encoder():
    return SentenceEncoder(show_progress=False)


def _source(encoder, tmp_path, **kwargs) -> PCSTSubgraphs:
    retriever = PCSTRetriever(encoder, cache_dir=str(tmp_path / "emb"), topk=2, topk_e=2, show_progress=False)
    return PCSTSubgraphs(retriever, **kwargs)


def test_record_mode_cuts_each_graph_caches_it_and_keys_the_data(tmp_path, encoder, monkeypatch):
    rows = {s: [_record(f"{s}-0"), _record(f"{s}-1", topic="Atlantis")] for s in ("train", "validation", "test")}
    folder = _write(tmp_path, rows)
    dm = KGQADataModule(data_dir=folder, cache_dir=str(tmp_path / "cache"), subgraphs=_source(encoder, tmp_path))
    cut, missing = dm.split_records("test")
    assert cut.graph == [("France", "capital", "Paris"), ("Paris", "river", "Seine")]
    assert set(cut.graph) < {tuple(t) for t in GRAPH} and cut.extra["answer_in_graph"] is True
    assert cut.extra["retrieval"]["method"] == "pcst"
    # a question whose topic entity is not in its graph stays (the methods abstain on it), counted
    assert missing.id == "test-1" and missing.graph == [] and "skipped" in missing.extra["retrieval"]
    assert dm.read_split("test").empty_graph == ["test-1"]
    assert dm.subgraphs.retriever.stats.missing_topic == 1
    files = sorted(p.name for p in (tmp_path / "cache" / "pcst_subgraphs").iterdir() if not p.name.startswith("."))
    assert len(files) == 2 and files[0].endswith(".jsonl") and files[1].endswith(".stats.json")
    assert all((tmp_path / "cache" / "pcst_subgraphs" / f".{f}.kglightning-entry").is_file() for f in files)
    assert json.loads((tmp_path / "cache" / "pcst_subgraphs" / files[1]).read_text())["missing_topic"] == 1
    # the cached cut is read back, without cutting again
    again = KGQADataModule(data_dir=folder, cache_dir=str(tmp_path / "cache"), subgraphs=_source(encoder, tmp_path))
    monkeypatch.setattr(PCSTRetriever, "retrieve_record", lambda *a: pytest.fail("cut again"))
    assert again.split_records("test") == dm.split_records("test")
    monkeypatch.undo()
    plain = KGQADataModule(data_dir=folder)
    assert plain.dataset_key("test") != dm.dataset_key("test")  # caches derived from records see the cut
    wider = _source(encoder, tmp_path)
    wider.retriever.topk_e = 5
    assert wider.cache_key != dm.subgraphs.cache_key


def test_cut_from_a_triples_file(tmp_path, encoder):
    kg = tmp_path / "kg.tsv"
    kg.write_text("".join("\t".join(t) + "\n" for t in GRAPH))
    rows = {s: [_record(f"{s}-0", graph=[["France", "capital", "Paris"]])] for s in ("train", "validation", "test")}
    dm = KGQADataModule(data_dir=_write(tmp_path, rows), cache_dir=str(tmp_path / "cache"),
                        subgraphs=_source(encoder, tmp_path, kg=str(kg)))  # fmt: skip
    [record] = dm.split_records("test")
    assert ("Paris", "river", "Seine") in record.graph  # from the whole KG, not the record's one-triple graph


def test_bad_kg_source(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.tsv"):
        PCSTSubgraphs(PCSTRetriever(show_progress=False), kg=str(tmp_path / "missing.tsv"))
    with pytest.raises(ValueError, match="kg must be"):
        PCSTSubgraphs(PCSTRetriever(show_progress=False), kg="")


@pytest.mark.parametrize(
    ("name", "value"),
    [("hops", 3), ("topk", 4), ("topk_e", 4), ("cost_e", 0.25), ("num_clusters", 2), ("max_degree", 10),
     ("max_nodes", 99)],
)  # fmt: skip
def test_every_retriever_setting_is_in_the_cut_key(encoder, tmp_path, name, value):
    base, changed = _source(encoder, tmp_path), _source(encoder, tmp_path)
    setattr(changed.retriever, name, value)
    assert changed.cache_key != base.cache_key


def test_the_kg_source_and_its_version_are_in_the_cut_key(encoder, tmp_path, monkeypatch):
    import kglightning.data.sources.embedded as embedded

    kg = tmp_path / "kg.tsv"
    kg.write_text("".join("\t".join(t) + "\n" for t in GRAPH))
    from_file = _source(encoder, tmp_path, kg=str(kg)).cache_key
    with kg.open("a") as f:
        f.write("Paris\ttwin\tRome\n")
    changed = _source(encoder, tmp_path, kg=str(kg)).cache_key
    assert changed != from_file  # the file changed
    st = kg.stat()
    kg.write_text(kg.read_text().replace("Rome", "Roma"))  # the same size, its time set back: cp -p, rsync -t
    os.utime(kg, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _source(encoder, tmp_path, kg=str(kg)).cache_key not in (from_file, changed)
    first = _source(encoder, tmp_path, kg="embedded").cache_key
    monkeypatch.setattr(embedded, "VERSION", "next")
    assert _source(encoder, tmp_path, kg="embedded").cache_key != first  # another build of the embedded KG
    assert _source(encoder, tmp_path, kg="record").cache_key not in (first, from_file)


def test_the_cut_records_are_counted_again(tmp_path, encoder, monkeypatch):
    from dataclasses import replace

    rows = {s: [_record(f"{s}-0"), _record(f"{s}-1")] for s in ("train", "validation", "test")}
    source = _source(encoder, tmp_path)
    real = source.apply

    def pruned(records, cache):  # a cut that left one question's topic out of its subgraph, and emptied another
        out = list(real(records, cache))
        return [replace(out[0], graph=[("Paris", "river", "Seine")]), replace(out[1], graph=[])]

    monkeypatch.setattr(source, "apply", pruned)
    dm = KGQADataModule(data_dir=_write(tmp_path, rows), cache_dir=str(tmp_path / "cache"), subgraphs=source)
    cut = dm.read_split("test")
    assert cut.unknown_topic == ["test-0"] and cut.empty_graph == ["test-1"]


def _planted_cut(path: Path) -> None:
    """A cut of the question another user wrote: the capital is Berlin."""
    row = {**_record("q1"), "graph": [["France", "capital", "Berlin"], ["Berlin", "river", "Seine"]]}
    path.write_text(json.dumps(row) + "\n")
    os.chmod(path, 0o666)


@pytest.mark.parametrize("shared_folder", [False, True])
def test_a_planted_cut_is_not_used(tmp_path, encoder, monkeypatch, caplog, shared_folder):
    from kglightning.data.records import KGQARecord

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "pcst_subgraphs"
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(folder, 0o777 if shared_folder else 0o700)
    path = folder / "train-abc.jsonl"
    _planted_cut(path)
    [cut] = _source(encoder, tmp_path).apply([KGQARecord.from_dict(_record("q1"))], path)
    assert ("Paris", "river", "Seine") in cut.graph and ("France", "capital", "Berlin") not in cut.graph
    if shared_folder:  # nothing read nor written in a folder others can write
        assert "is not used" in caplog.text and "Berlin" in path.read_text()
    else:  # set aside, and the cut written anew
        assert list(folder.glob("train-abc.jsonl.unreadable-*")) and "Berlin" not in path.read_text()


def test_reading_the_cut_counts_as_using_its_statistics_too(tmp_path, encoder, monkeypatch):
    from kglightning.data.records import KGQARecord
    from kglightning.data.store import cache_marks
    from kglightning.data.store.cache_clean import clean

    root = tmp_path / "cache"
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(root))
    path = root / "pcst_subgraphs" / "train-abc.jsonl"
    _source(encoder, tmp_path).apply([KGQARecord.from_dict(_record("q1"))], path)
    past = time.time() - 8 * 86400
    for p in (root / "pcst_subgraphs").iterdir():
        os.utime(p, (past, past))
    cache_marks._touched.clear()  # a new process, a week later
    _source(encoder, tmp_path).apply([KGQARecord.from_dict(_record("q1"))], path)
    removed = [p.name for p, _, _ in clean(root, older_than_s=7 * 86400, kinds=["pcst_subgraphs"]).removed]
    assert removed == [] and path.with_suffix(".stats.json").exists()


@pytest.mark.parametrize("damage", ["cut short", "not UTF-8"])
def test_a_damaged_cut_is_set_aside_and_cut_again(tmp_path, encoder, monkeypatch, caplog, damage):
    """Finding 5 of the second review: a cached cut truncated (a full disk, a killed copy) stopped every run with a
    RecordError; it is the cache's damage: set aside with a WARNING, and the subgraphs cut again."""
    from kglightning.data.records import KGQARecord

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "cache" / "pcst_subgraphs" / "train-abc.jsonl"
    records = [KGQARecord.from_dict(_record("q1")), KGQARecord.from_dict(_record("q2"))]
    first = _source(encoder, tmp_path).apply(records, path)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 20] if damage == "cut short" else raw.replace(b"Seine", b"Sei\xffe", 1))
    again = _source(encoder, tmp_path).apply(records, path)
    assert again == first and path.read_bytes() == raw
    (aside,) = path.parent.glob("train-abc.jsonl.unreadable-*")
    assert "cannot be read as PCST subgraphs" in caplog.text and aside.name in caplog.text


def test_a_cut_that_cannot_be_read_for_a_system_error_is_kept(tmp_path, encoder, monkeypatch):
    import errno

    from kglightning.data.records import KGQARecord
    from kglightning.retrieval import subgraphs

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "cache" / "pcst_subgraphs" / "train-abc.jsonl"
    records = [KGQARecord.from_dict(_record("q1"))]
    _source(encoder, tmp_path).apply(records, path)

    def no_memory(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(subgraphs, "read_records", no_memory)
    with pytest.raises(OSError, match="Cannot allocate memory"):
        _source(encoder, tmp_path).apply(records, path)
    assert path.is_file() and not list(path.parent.glob("*.unreadable-*"))


def test_a_cut_of_a_release_before_markers_is_marked_when_read(tmp_path, encoder, monkeypatch):
    """Finding 8: an entry that a run reads, finds whole and trusts, but that carries no marker (written before
    markers existed) is marked then, so that `kglightning cache clean` may remove it in time."""
    from kglightning.data.records import KGQARecord
    from kglightning.data.store.cache_marks import is_marked, marker_of

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "cache" / "pcst_subgraphs" / "train-abc.jsonl"
    records = [KGQARecord.from_dict(_record("q1"))]
    _source(encoder, tmp_path).apply(records, path)
    stats = path.with_suffix(".stats.json")
    for p in (path, stats):
        marker_of(p).unlink()
    monkeypatch.setattr(PCSTRetriever, "retrieve_record", lambda *a: pytest.fail("cut again"))
    _source(encoder, tmp_path).apply(records, path)
    assert is_marked(path) and is_marked(stats)


def test_no_file_of_a_cut_is_writable_by_others_whatever_the_umask(tmp_path, encoder, monkeypatch):
    from kglightning.data.records import KGQARecord

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "cache" / "pcst_subgraphs" / "train-abc.jsonl"
    old = os.umask(0o002)
    try:
        _source(encoder, tmp_path).apply([KGQARecord.from_dict(_record("q1"))], path)
    finally:
        os.umask(old)
    assert all(p.stat().st_mode & 0o022 == 0 for p in path.parent.iterdir())
