"""Detection graphs as Arrow rows: read back they are the graphs built directly, whatever the embedding table's
numbering; DetectionDataModule keeps them by what they depend on, reads them back without building, and builds anew
when a setting changes."""

from __future__ import annotations

import json
import os

import datasets
import numpy as np
import pytest
import torch

from kglightning.data import SentenceEncoder
from kglightning.data.digest import records_digest
from kglightning.data.records import KGQARecord
from kglightning.data.store.stage_map import cached_map
from kglightning.datamodules import DetectionDataModule
from kglightning.datamodules import graph_rows as gr
from kglightning.datamodules.detection_graphs import DetectionStats, build_detection_graph, node_texts
from kglightning.datamodules.graph_forms import compact_graph, expand_graph
from kglightning.datamodules.text_rows import TextRows
from kglightning.nn import EDGE_VIRTUAL


def _records() -> list[KGQARecord]:
    base = {"question": "capital of France?", "answer": ["Paris"], "q_entity": ["France"], "a_entity": ["Paris"]}
    graph = [["France", "capital", "Paris"], ["France", "currency", "Euro"], ["Spain", "borders", "France"]]
    rows = [
        {"id": "a", "graph": graph, "prediction": ["Paris", "Euro", "unknown", "Atlantis", "paris"],
         "confidence": [0.9, 0.5, 0.1, 0.3, 0.2]},
        {"id": "b", "graph": graph, "prediction": ["Atlantis"]},  # ungrounded only
        {"id": "c", "graph": [], "prediction": ["Paris"]},  # no graph: ungrounded
        {"id": "d", "graph": graph, "prediction": ["I don't know"]},  # abstains: no graph row
        {"id": "e", "graph": graph[:1], "prediction": ["France"], "answer": []},  # no gold: unlabelled
    ]  # fmt: skip
    return [KGQARecord.from_dict(base | r) for r in rows]


def _rows(records, add_reverse_edges=True, ungrounded="keep", view="readable"):
    ds = datasets.Dataset.from_dict({"index": list(range(len(records)))})
    state = (records, add_reverse_edges, ungrounded, lambda r: None, view)
    return cached_map(ds, gr.build_graph_rows, gr.graph_features(), None, state=state, batch_size=2, progress=False)


def _same(g, h, texts: bool = True) -> None:
    """``g`` and ``h`` hold the same values (``texts=False``: but for their texts' table rows)."""
    assert list(g.keys()) == list(h.keys())
    for key in g.keys():
        if not texts and key in ("node_text", "edge_text", "ungrounded_text"):
            continue
        x, y = g[key], h[key]
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape, (key, x, y)
            same = torch.equal(x.nan_to_num(-7), y.nan_to_num(-7)) if x.is_floating_point() else torch.equal(x, y)
            assert same, (key, x, y)
        else:
            assert x == y, (key, x, y)


@pytest.mark.parametrize("reverse,ungrounded,view", [(True, "keep", "readable"), (False, "drop", "leaf")])
def test_rows_read_back_are_the_graphs_built_directly_under_any_table_numbering(reverse, ungrounded, view):
    records = _records()
    rows = _rows(records, reverse, ungrounded, view)
    kept = ungrounded == "keep"  # b and c have only answers that name no node
    assert len(rows) == len(records) and list(rows["built"]) == [True, kept, kept, False, True]
    texts = sorted(gr.row_texts(rows).to_pylist())
    for order in (texts, texts[::-1]):  # two tables that number the same texts otherwise
        table = {t: 100 + i for i, t in enumerate(order)}
        direct_stats, direct = DetectionStats(), []
        for i, r in enumerate(records):
            g = build_detection_graph(r, TextRows(table), direct_stats, reverse, ungrounded, None, view)
            if g is not None:
                direct.append((i, compact_graph(g)))
        read = list(gr.graphs_from_rows(rows, table))
        assert [i for i, _ in read] == [i for i, _ in direct]
        for (_, g), (_, h) in zip(read, direct):
            _same(g, h)
            _same(expand_graph(g), expand_graph(h))
        assert json.dumps(vars(gr.row_stats(rows))) == json.dumps(vars(direct_stats))
    every = {t for r in records for t in node_texts(r, view)}
    assert set(texts) <= every and "I don't know" not in texts  # the texts the graphs refer to, no more


def test_a_text_missing_from_the_table_is_named():
    rows = _rows(_records())
    with pytest.raises(KeyError, match="Atlantis"):
        list(gr.graphs_from_rows(rows, {t: 0 for t in gr.row_texts(rows).to_pylist() if t != "Atlantis"}))
    empty = _rows([])
    assert len(empty) == 0 and list(gr.graphs_from_rows(empty, {})) == [] and len(gr.row_texts(empty)) == 0


def _write(folder, splits):
    folder.mkdir(exist_ok=True)
    for split, records in splits.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


@pytest.fixture
def data(detection_records, tmp_path):
    splits = {
        s: detection_records(n, seed)
        for s, (n, seed) in {"train": (10, 0), "validation": (5, 1), "test": (3, 2)}.items()
    }
    return _write(tmp_path / "d", splits)


def _dm(data, tmp_path, encoder_dir, **kw):
    return DetectionDataModule(data_dir=data, encoder=SentenceEncoder(encoder_dir), cache_dir=str(tmp_path / "c"), **kw)


def test_the_datamodule_reads_stored_rows_back_without_building_and_builds_anew_on_a_changed_setting(
    data, tmp_path, tiny_encoder_dir, monkeypatch
):
    first = _dm(data, tmp_path, tiny_encoder_dir)
    first.setup("fit")
    folder = first.graph_folder("train")
    assert (folder / "complete.json").exists()
    calls = []
    build = gr.graph_parts
    monkeypatch.setattr(gr, "graph_parts", lambda *a, **k: calls.append(1) or build(*a, **k))
    again = _dm(data, tmp_path, tiny_encoder_dir)
    again.setup("fit")
    assert calls == []  # read from the stored rows
    for split in ("train", "validation"):
        assert len(first.datasets[split]) == len(again.datasets[split]) > 0
        for g, h in zip(first.datasets[split], again.datasets[split]):
            _same(g, h, texts=False)  # a cache read back may number its texts otherwise: the vectors are the same
        a, b = (dm.collate(dm.datasets[split][:]) for dm in (first, again))
        assert torch.equal(a.x_text, b.x_text)  # per node, and per edge (types are numbered by their rows):
        real = a.edge_kind != EDGE_VIRTUAL  # a virtual edge has no text (row 0, masked out by the model)
        assert torch.equal(a.type_text_emb[a.edge_type][real], b.type_text_emb[b.edge_type][real])
        assert vars(first.stats[split]) == vars(again.stats[split])
    other = _dm(data, tmp_path, tiny_encoder_dir, relation_view="leaf")
    assert other.graph_folder("train") != folder
    other.setup("fit")
    assert len(calls) == 15  # every question of both splits built for the new setting


def test_rows_stored_under_another_table_numbering_give_the_same_batches(data, tmp_path, tiny_encoder_dir):
    """The embedding table of a second run numbers its texts otherwise (another cache folder, filled in another
    order); the stored graph rows of the first run still give the same text vectors."""
    first = _dm(data, tmp_path, tiny_encoder_dir)
    first.setup("fit")
    second = _dm(data, tmp_path, tiny_encoder_dir)
    second._embeddings = type(first.embeddings)(first.encoder, tmp_path / "other-embeddings")
    second.embeddings.add(["a text no graph names", *sorted(gr.row_texts(first.graph_rows("train")).to_pylist())])
    second.setup("fit")
    a = first.collate(first.datasets["train"][:4])
    b = second.collate(second.datasets["train"][:4])
    assert not torch.equal(a.node_text, b.node_text)  # other rows ...
    assert np.allclose(a.x_text.numpy(), b.x_text.numpy(), atol=1e-3)  # ... of the same texts
    assert torch.equal(a.y, b.y) and torch.equal(a.edge_index, b.edge_index)


def test_the_records_digest_covers_triples_and_cited_paths_not_just_sizes():
    base = _records()
    same = records_digest(_records())
    assert records_digest(base) == same
    renamed = [KGQARecord.from_dict(r.to_dict() | {"graph": [["France", "capital", "Parus"], *map(list, r.graph[1:])]})
               if r.id == "a" else r for r in _records()]  # fmt: skip
    cited = [KGQARecord.from_dict(r.to_dict() | {"prediction_paths": [[["France", "capital", "Paris"]]] * 5})
             if r.id == "a" else r for r in _records()]  # fmt: skip
    assert len({same, records_digest(renamed), records_digest(cited)}) == 3


@pytest.mark.parametrize("store", ["off", "0"])
def test_a_split_digest_follows_its_vocabulary(tmp_path, monkeypatch, store):
    from kglightning.data.sources.loaders import read_records

    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", store)  # "0": read back from the Arrow record store
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))

    rows = [{"id": f"q{i}", "question": "?", "answer": ["Paris"], "q_entity": ["France"], "a_entity": ["Paris"],
             "graph": [["France", "capital", "Paris"], ["France", "borders", f"Spain{i}"]], "prediction": ["Paris"]}
            for i in range(3)]  # fmt: skip
    digests = []
    for name in ("Paris", "Parus"):  # the same ids, another string behind one of them
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(json.loads(json.dumps(r).replace("Paris", name))) + "\n" for r in rows))
        read_records(path, report=False)
        records = read_records(path, report=False)
        assert records[0].graph.vocab.has_table == (store == "off")
        digests.append(records_digest(records))
    assert digests[0] != digests[1]


def test_damaged_rows_are_refused_by_name_and_the_datamodule_builds_them_again(
    data, tmp_path, tiny_encoder_dir, monkeypatch, caplog
):
    rows = _rows(_records())
    table = {t: i for i, t in enumerate(gr.row_texts(rows).to_pylist())}
    bad = rows.map(lambda r: {"node_text": [-1, *r["node_text"][1:]]} if r["built"] else {}, features=rows.features)
    with pytest.raises(gr.GraphRowError, match=r"record 0 \('a'\): node_text holds an index outside \[0, \d+\)"):
        list(gr.graphs_from_rows(bad, table))
    far = rows.map(lambda r: {"edge_index": [r["num_nodes"], *r["edge_index"][1:]]} if r["built"] else {},
                   features=rows.features)  # fmt: skip
    with pytest.raises(gr.GraphRowError, match="edge_index"):
        list(gr.graphs_from_rows(far, table))
    hole = rows.map(lambda r: {"texts": [None, *r["texts"][1:]]} if r["built"] else {}, features=rows.features)
    with pytest.raises(gr.GraphRowError, match="missing"):
        list(gr.graphs_from_rows(hole, table))

    first = _dm(data, tmp_path, tiny_encoder_dir)
    first.setup("fit")
    read, calls = gr.graphs_from_rows, []

    def damaged_once(ds, text_row, *args):
        calls.append(1)
        if len(calls) == 1:
            raise gr.GraphRowError("graph row of record 0 ('x'): node_text holds an index outside [0, 3)")
        return read(ds, text_row, *args)

    import kglightning.datamodules.detection as detection

    monkeypatch.setattr(detection, "graphs_from_rows", damaged_once)
    again = _dm(data, tmp_path, tiny_encoder_dir)
    with caplog.at_level("WARNING"):
        again.setup("fit")
    assert "are damaged" in caplog.text and str(again.graph_folder("train")) in caplog.text
    assert len(again.datasets["train"]) == len(first.datasets["train"])
    assert (again.graph_folder("train") / "complete.json").exists()  # built again and stored
    folder = again.graph_folder("train")  # the damaged rows are set aside beside it, not deleted (issue 57)
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(f"{folder.name}.unreadable-")]

    def damaged_always(ds, text_row, *args):  # rows built anew that are still refused: raised, not looped on
        raise gr.GraphRowError("graph row of record 0 ('x'): edge_index holds an index outside [0, 3)")

    monkeypatch.setattr(detection, "graphs_from_rows", damaged_always)
    with pytest.raises(gr.GraphRowError, match="edge_index"):
        _dm(data, tmp_path, tiny_encoder_dir).setup("fit")


def test_the_rows_key_follows_the_code_that_builds_them(data, tmp_path, tiny_encoder_dir, monkeypatch):
    import kglightning.datamodules.detection as detection

    before = _dm(data, tmp_path, tiny_encoder_dir).graph_folder("train")
    monkeypatch.setattr(detection, "code_digest", lambda: "another-build")
    assert _dm(data, tmp_path, tiny_encoder_dir).graph_folder("train") != before
    assert len(gr.code_digest()) == 16 and gr.code_digest() == gr.code_digest()


def _damage(rows, change):
    """``rows`` with ``change(row)`` applied to the built rows (the rows are Arrow; the change sees Python values)."""
    return rows.map(lambda r: change(dict(r)) if r["built"] else {}, features=rows.features)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda r: r | {"texts": None}, r"record 0 \('a'\): texts missing"),
        (lambda r: r | {"texts": [None, *r["texts"][1:]]}, r"record 0 \('a'\): texts missing"),
        (lambda r: r | {"num_nodes": None}, r"record 0 \('a'\): num_nodes missing"),
        (lambda r: r | {"y": []}, r"record 0 \('a'\): y holds 0 values where \d+ belong"),
        (lambda r: r | {"edge_kind": r["edge_kind"][:-1]}, r"record 0.*holds \d+ values where \d+ belong"),
        (lambda r: r | {"answer_grounding": [7] * len(r["answer_grounding"])}, "answer_grounding holds an index"),
        (lambda r: r | {"compact_reverse": len(r["edge_kind"]) + 1}, "compact_reverse"),
        (lambda r: r | {"answer_entries": r["answer_entries"][1:]}, "answer_entries for"),
        (lambda r: r | {"answer_entries": [None, *r["answer_entries"][1:]]}, "answer_entries missing"),
        (lambda r: r | {"index": r["index"] + 1}, r"record 1 \('a'\): stored as row 0"),
        (lambda r: r | {"built": False}, "a row without a graph holds"),
        (lambda r: r | {"compact_reverse": 1}, r"compact_reverse 1 for \d+ forward edges"),
        (lambda r: r | {"compact_reverse": -1}, r"compact_reverse -1 for \d+ forward edges"),
        (lambda r: r | {"edge_kind": [0] * len(r["edge_kind"])}, "question node's edges are not one to each topic"),
        (lambda r: r | {"edge_kind": r["edge_kind"][::-1]}, "forward edges then the question node"),
        (lambda r: r | {"answer_index": [r["num_nodes"] - 1] * len(r["answer_index"])}, "answer_index holds an index"),
        (lambda r: r | {"y": [5.0] * len(r["y"])}, "other than 0 or 1"),
    ],
)
def test_rows_that_cannot_be_their_graph_are_refused_naming_the_record(change, match):
    rows = _rows(_records())
    table = {t: i for i, t in enumerate(gr.row_texts(rows).to_pylist())}
    assert len(list(gr.graphs_from_rows(rows, table, reverse=True))) == 4  # the rows as built pass every check
    with pytest.raises(gr.GraphRowError, match=match):
        list(gr.graphs_from_rows(_damage(rows, change), table, reverse=True))


def test_rows_built_without_reverse_edges_pass_and_are_told_from_rows_with_them():
    rows = _rows(_records(), add_reverse_edges=False)
    table = {t: i for i, t in enumerate(gr.row_texts(rows).to_pylist())}
    assert len(list(gr.graphs_from_rows(rows, table, reverse=False))) == 4
    with pytest.raises(gr.GraphRowError, match="compact_reverse -1"):
        list(gr.graphs_from_rows(rows, table, reverse=True))


def test_rows_that_are_not_valid_arrow_data_or_whose_counts_are_broken_are_refused():
    import pyarrow as pa

    rows = _rows(_records())
    good = rows.with_format("arrow")[:]
    texts = good.column("texts").combine_chunks()
    words = texts.values
    data = bytearray(words.buffers()[2].to_pybytes())
    data[0] = 0xFF  # not UTF-8: reading it as text would fail far from here, or worse
    strings = pa.Array.from_buffers(pa.string(), len(words), [None, words.buffers()[1], pa.py_buffer(bytes(data))])
    broken = pa.ListArray.from_arrays(texts.offsets, strings)
    bad = good.set_column(good.schema.get_field_index("texts"), "texts", broken)
    with pytest.raises(gr.GraphRowError, match="not valid Arrow data"):
        gr.check_rows(datasets.Dataset(bad))
    with pytest.raises(gr.GraphRowError, match="its stats are not"):
        gr.row_stats(_damage(rows, lambda r: r | {"stats": "{"}))


def test_a_compact_reverse_past_the_forward_edges_is_refused_not_mirrored():
    rows = _rows(_records())  # record a: forward edges, then the question node's edge to its topic entity
    table = {t: i for i, t in enumerate(gr.row_texts(rows).to_pylist())}
    forward = rows[0]["compact_reverse"]
    assert forward > 0 and rows[0]["edge_kind"][forward:] == [EDGE_VIRTUAL]
    with pytest.raises(gr.GraphRowError, match="compact_reverse"):
        list(gr.graphs_from_rows(_damage(rows, lambda r: r | {"compact_reverse": forward + 1}), table))


def _swap_qids(table):
    qid = table.column("qid").to_pylist()
    qid[0], qid[1] = qid[1], qid[0]
    return "qid", qid


def _null_text(table):
    texts = table.column("texts").to_pylist()
    texts[0] = None
    return "texts", texts


@pytest.mark.parametrize("damage,said", [(_null_text, "texts missing"), (_swap_qids, "holds the graph of")])
def test_damaged_stored_rows_are_found_in_a_run_and_built_again(data, tmp_path, tiny_encoder_dir, caplog, damage, said):
    import pyarrow as pa

    first = _dm(data, tmp_path, tiny_encoder_dir)
    first.setup("fit")
    piece = sorted(first.graph_folder("train").glob("*.arrow"))[0]
    with pa.memory_map(str(piece)) as source:
        table = pa.ipc.open_stream(source).read_all()
    name, values = damage(table)
    field = table.schema.get_field_index(name)
    table = table.set_column(field, name, pa.array(values, table.schema.field(name).type))
    damaged = piece.with_name("damaged.tmp")  # written aside and renamed: the old file may still be mapped
    with pa.OSFile(str(damaged), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(damaged, piece)
    again = _dm(data, tmp_path, tiny_encoder_dir)
    with caplog.at_level("WARNING"):
        again.prepare_data()  # embeds the rows' texts: a missing one is found before
        again.setup("fit")
    assert "are damaged" in caplog.text and said in caplog.text
    assert [g.qid for g in again.datasets["train"]] == [g.qid for g in first.datasets["train"]]


def test_a_text_that_is_not_unicode_is_named_with_its_record():
    records = _records()
    records[1].prediction = ["Atl\ud800ntis"]
    with pytest.raises(ValueError, match=r"record 1 \('b'\).*Atl\\ud800ntis.*not valid Unicode"):
        _rows(records)


def test_proposer_confidences_given_as_integers_are_floats_in_the_graph_as_in_its_row():
    record = _records()[0]
    record.confidence = [1, 0, 1, 0, 1]
    g = build_detection_graph(record, TextRows({t: 0 for t in node_texts(record)}), DetectionStats(), ungrounded="keep")
    assert g.proposer_confidence.dtype == torch.float32
