"""Tests of the embedded KGQA benchmark (kglightning.data.sources.embedded).

One full build (about 7 s on 2 cores) is shared by the module; determinism and atomic writing are tested on
subsets of the questions; a second and third full build (byte identity, other seed) are marked ``slow``.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections import Counter
from pathlib import Path

import pytest

from kglightning.data.records import KGQARecord
from kglightning.data.sources import embedded
from kglightning.data.sources.embedded import builder
from kglightning.data.sources.embedded.codes_currencies import currency_name
from kglightning.data.sources.embedded.codes_languages import language_name
from kglightning.data.sources.embedded.facts_elements import parse_discoverers
from kglightning.data.sources.embedded.names import EntitySpec, assign_unique_names
from kglightning.data.sources.embedded.subgraphs import SubgraphConfig

SPLITS = ("train", "validation", "test")


@pytest.fixture(scope="module")
def kg():
    return embedded.build_knowledge_graph()


@pytest.fixture(scope="module")
def questions(kg):
    return embedded.generate_questions(kg)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("embedded") / "seed0"
    paths = embedded.build_embedded_benchmark(out, seed=0, progress=False)
    records = {s: [json.loads(line) for line in paths[s].read_text(encoding="utf-8").splitlines()] for s in SPLITS}
    manifest = json.loads(paths["manifest"].read_text(encoding="utf-8"))
    return paths, records, manifest


def _all(bench) -> list[dict]:
    return [r for s in SPLITS for r in bench[1][s]]


def _small_build(monkeypatch, out: Path, seed: int, n: int = 120, workers: int | None = None) -> dict[str, Path]:
    """A build over the first ``n`` questions only (the KG is cached), for fast determinism checks."""
    full = embedded.generate_questions(embedded.build_knowledge_graph())
    monkeypatch.setattr(builder, "generate_questions", lambda kg: full[::7][:n])
    return embedded.build_embedded_benchmark(out, seed=seed, progress=False, workers=workers)


# ----------------------------------------------------------------------------------------------- the pieces


def test_unique_names_disambiguate_deterministically():
    specs = [
        EntitySpec("city:b", "city", ("Springfield", "Springfield (Illinois)"), (-114000, "city:b")),
        EntitySpec("city:a", "city", ("Springfield", "Springfield (Missouri)"), (-169000, "city:a")),
        EntitySpec("country:SG", "country", ("Singapore",)),
        EntitySpec("city:c", "city", ("Singapore", "Singapore (city)"), (-5000000, "city:c")),
        EntitySpec("x:1", "person", ("X",)),
        EntitySpec("x:2", "person", ("x",)),
    ]
    names = assign_unique_names(specs)
    assert names == assign_unique_names(list(reversed(specs)))
    assert names["city:a"] == "Springfield" and names["city:b"] == "Springfield (Illinois)"
    assert names["country:SG"] == "Singapore" and names["city:c"] == "Singapore (city)"
    assert {names["x:1"], names["x:2"]} == {"X", "x #2"}  # unique case-insensitively


def test_code_tables_and_discoverer_cleanup():
    assert language_name("es-PE") == "Spanish" and language_name("rs") == "Serbian" and language_name("cau") is None
    assert currency_name("EUR") == "Euro" and currency_name("HRK") is None and currency_name("CHE") is None
    assert parse_discoverers("Pierre and Marie Curie") == ["Pierre Curie", "Marie Curie"]
    assert parse_discoverers("G.T.Seaborg, A. Ghiorso, et al") == ["Glenn T. Seaborg", "Albert Ghiorso"]
    assert parse_discoverers("Known to the ancients.") == []


def test_kg_size_names_and_facts(kg):
    stats = kg.stats()
    assert 10_000 <= stats["entities"] <= 40_000 and stats["triples"] > stats["entities"]
    assert len({n.casefold() for n in kg.names}) == len(kg.names)
    assert all(n == n.strip() and n for n in kg.names)

    def tails(head: str, step: str) -> set[str]:
        return {kg.names[i] for i in kg.follow([kg.index[head]], [step])}

    assert tails("Peru", "location.country.capital") == {"Lima"}
    assert {"Bolivia", "Brazil", "Chile", "Colombia", "Ecuador"} == tails("Peru", "location.location.adjoin_s")
    assert "Euro" in tails("Germany", "location.country.currency_used")
    assert tails("Oxygen", "chemistry.chemical_element.atomic_symbol") == {"O"}
    assert tails("Oxygen", "chemistry.chemical_element.discoverer") == {"Joseph Priestley", "Carl Wilhelm Scheele"}
    assert tails("Oxygen", "chemistry.chemical_element.discovery_location") == {"United Kingdom", "Sweden"}
    assert tails("Iron", "chemistry.chemical_element.periodic_table_block") == {"d-block"}
    assert tails("Springfield (Illinois)", "location.citytown.state") == {"Illinois"}
    assert tails("Singapore", "location.country.capital") == {"Singapore (city)"}
    assert "Croatian kuna" not in kg.index and "HRK" not in kg.index  # withdrawn currency dropped
    # both directions of a symmetric relation, and no dissolved country
    assert "Peru" in tails("Chile", "location.location.adjoin_s") and "Serbia and Montenegro" not in kg.index


def test_data_quality_notes(kg):
    notes = kg.quality
    assert notes["capital: packages name different cities, dropped"]["count"] >= 3
    assert notes["border: listed by one package only, dropped"]["count"] >= 5
    assert notes["currency: withdrawn code or fund, dropped"]["count"] >= 5
    assert notes["element: discoverer spelling repaired or merged"]["count"] >= 20
    assert "Burundi" not in {kg.names[i] for i in kg.follow([kg.index["Gitega"]], ["~location.country.capital"])}


@pytest.mark.heavy
def test_question_pool(kg, questions):
    assert len(questions) >= 5000
    assert len({q.qid for q in questions}) == len(questions) == len({q.text for q in questions})
    hops = Counter(q.template.hops for q in questions)
    assert set(hops) == {1, 2, 3, 4} and min(hops.values()) >= 0.08 * len(questions)
    assert all(1 <= len(q.answers) <= 30 for q in questions)
    assert all(not kg.qualified[e] for q in questions for e in q.q_entities)
    again = embedded.generate_questions(kg)
    assert [(q.qid, q.answers) for q in again] == [(q.qid, q.answers) for q in questions]


@pytest.mark.heavy
def test_subset_build_is_deterministic_and_atomic(tmp_path, monkeypatch):
    a = _small_build(monkeypatch, tmp_path / "a", seed=0)
    b = _small_build(monkeypatch, tmp_path / "b", seed=0)
    c = _small_build(monkeypatch, tmp_path / "c", seed=1)
    for key in (*SPLITS, "manifest"):
        assert a[key].read_bytes() == b[key].read_bytes()
    assert any(a[s].read_bytes() != c[s].read_bytes() for s in SPLITS)

    def boom(path, records):
        raise OSError("disk full")

    monkeypatch.setattr(builder, "_write_jsonl", boom)
    with pytest.raises(OSError):
        _small_build(monkeypatch, tmp_path / "d", seed=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # no half-written cache, no temp folder


@pytest.mark.heavy
def test_build_does_not_depend_on_the_number_of_workers(tmp_path, monkeypatch):
    one = _small_build(monkeypatch, tmp_path / "one", seed=0, n=600, workers=1)
    two = _small_build(monkeypatch, tmp_path / "two", seed=0, n=600, workers=2)  # 3 chunks over 2 processes
    for key in (*SPLITS, "manifest"):
        assert one[key].read_bytes() == two[key].read_bytes()


def test_ensure_builds_once_into_versioned_folder(tmp_path, monkeypatch, caplog):
    calls = []

    def fake_build(out_dir, seed=0, progress=True, replace=True):
        calls.append(seed)
        Path(out_dir).mkdir(parents=True)
        for name in (*(f"{s}.jsonl" for s in SPLITS), "manifest.json"):
            (Path(out_dir) / name).write_text("{}\n")

    monkeypatch.setattr(embedded, "build_embedded_benchmark", fake_build)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger=embedded.__name__):
        folder = embedded.ensure_embedded_benchmark(seed=3)
    assert folder == tmp_path / "cache" / f"embedded-v{embedded.VERSION}-seed3"
    assert any("building" in r.getMessage() for r in caplog.records)
    assert embedded.ensure_embedded_benchmark(seed=3) == folder and calls == [3]
    assert embedded.ensure_embedded_benchmark(tmp_path / "other", seed=0).parent == tmp_path / "other"


@pytest.mark.parametrize("marked", [True, False])
def test_a_built_folder_others_can_write_is_not_read(tmp_path, monkeypatch, marked):
    """A reader of the cache checks it first: a build of kglightning that others can write is set aside and built
    again; a folder kglightning did not build stops the run with its name (it is never removed)."""
    import os

    from kglightning.data.store.cache_marks import mark_folder

    def fake_build(out_dir, seed=0, progress=True, replace=True):
        Path(out_dir).mkdir(parents=True)
        for name in (*(f"{s}.jsonl" for s in SPLITS), "manifest.json"):
            (Path(out_dir) / name).write_text("{}\n")

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path))
    folder = tmp_path / f"embedded-v{embedded.VERSION}-seed0"
    fake_build(folder)
    os.chmod(folder / "train.jsonl", 0o666)  # anyone could have rewritten it
    if marked:
        mark_folder(folder)
    monkeypatch.setattr(embedded, "build_embedded_benchmark", fake_build)
    if not marked:
        with pytest.raises(FileExistsError, match=f"{folder} is not trusted .*writable by other users.*move it away"):
            embedded.ensure_embedded_benchmark(seed=0)
        assert (folder / "train.jsonl").exists()
        return
    assert embedded.ensure_embedded_benchmark(seed=0) == folder
    assert (
        len(list(tmp_path.glob(f"{folder.name}.unreadable-*"))) == 1
        and os.stat(folder / "train.jsonl").st_mode & 0o022 == 0
    )


def test_a_build_under_a_group_writable_umask_is_trusted_and_built_once(tmp_path, monkeypatch):
    """Finding 2 of the second review: under umask 002 the builder wrote its files 0664, so its own reader refused
    the build, set it aside and built again on every call (10-15 s and 114 MB left each time)."""
    import os

    calls = []
    full = embedded.generate_questions(embedded.build_knowledge_graph())
    monkeypatch.setattr(builder, "generate_questions", lambda kg: full[::7][:60])  # a small build, the real writer

    def counted(out_dir, seed=0, progress=True, replace=True):
        calls.append(seed)
        return builder.build_embedded_benchmark(out_dir, seed=seed, progress=False, replace=replace, workers=1)

    monkeypatch.setattr(embedded, "build_embedded_benchmark", counted)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    old = os.umask(0o002)
    try:
        folder = embedded.ensure_embedded_benchmark(seed=0, progress=False)
        assert embedded.ensure_embedded_benchmark(seed=0, progress=False) == folder
    finally:
        os.umask(old)
    assert calls == [0]
    assert all(p.stat().st_mode & 0o022 == 0 for p in folder.iterdir())
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [folder.name]  # nothing set aside


def _older_build(folder: Path, seed: int = 0, version: str | None = None) -> None:
    """A complete build of a release before markers: the files, and kglightning's manifest, no marker."""
    folder.mkdir(parents=True)
    for s in SPLITS:
        (folder / f"{s}.jsonl").write_text("{}\n")
    manifest = {"name": "kglightning-embedded", "builder_version": version or embedded.VERSION, "seed": seed}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_an_older_build_that_cannot_be_trusted_is_moved_aside_and_built_again(tmp_path, monkeypatch, caplog):
    """Finding 2: after an upgrade under umask 002, the older build (no marker, files 0664) stopped every run with
    FileExistsError. Its manifest says it is kglightning's: it is moved aside with a WARNING naming it."""
    import os

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path))
    folder = tmp_path / f"embedded-v{embedded.VERSION}-seed0"
    _older_build(folder)
    for p in folder.iterdir():
        os.chmod(p, 0o664)

    def fake_build(out_dir, seed=0, progress=True, replace=True):
        _older_build(Path(out_dir))

    monkeypatch.setattr(embedded, "build_embedded_benchmark", fake_build)
    with caplog.at_level(logging.WARNING):
        assert embedded.ensure_embedded_benchmark(seed=0) == folder
    (aside,) = tmp_path.glob(f"{folder.name}.unmarked-*")
    assert (aside / "train.jsonl").exists() and str(aside) in caplog.text and "delete it" in caplog.text
    assert "writable by other users" in caplog.text


def test_an_older_build_that_can_be_trusted_is_marked_and_used(tmp_path, monkeypatch):
    from kglightning.data.store.cache_marks import is_marked

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path))
    folder = tmp_path / f"embedded-v{embedded.VERSION}-seed0"
    _older_build(folder)
    monkeypatch.setattr(embedded, "build_embedded_benchmark", lambda *a, **k: pytest.fail("built again"))
    assert embedded.ensure_embedded_benchmark(seed=0) == folder and is_marked(folder)


@pytest.mark.parametrize("content", ["notes", "another manifest"])
def test_a_folder_that_is_no_build_of_kglightning_stops_the_run_before_building(tmp_path, monkeypatch, content):
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path))
    folder = tmp_path / f"embedded-v{embedded.VERSION}-seed0"
    folder.mkdir()
    if content == "notes":
        (folder / "notes.txt").write_text("mine")
    else:
        (folder / "manifest.json").write_text(json.dumps({"name": "kglightning-embedded", "seed": 7}))
    monkeypatch.setattr(embedded, "build_embedded_benchmark", lambda *a, **k: pytest.fail("built"))
    with pytest.raises(FileExistsError, match=f"{folder} exists and is not a build of kglightning"):
        embedded.ensure_embedded_benchmark(seed=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]


# ------------------------------------------------------------------------------------------ the full build


@pytest.mark.heavy
def test_records_validate_and_carry_extras(bench):
    paths, records, manifest = bench
    ids = set()
    for split in SPLITS:
        for line, r in enumerate(records[split], 1):
            rec = KGQARecord.from_dict(r, source=str(paths[split]), line=line)
            assert rec.extra["kind"] in {"simple", "compositional"} and rec.extra["source"] in {"geography", "elements"}
            assert isinstance(rec.extra["hops"], int) and isinstance(rec.extra["answer_in_graph"], bool)
            assert len(rec.extra["relation_path"]) + len(rec.extra["constraints"]) == rec.extra["hops"]
            assert (rec.extra["kind"] == "simple") == (rec.extra["hops"] == 1)
            ids.add(rec.id)
    assert len(ids) == sum(len(records[s]) for s in SPLITS) == manifest["counts"]["all"]["total"] >= 5000


def test_mix_per_split(bench):
    _, records, manifest = bench
    n = len(_all(bench))
    for split in SPLITS:
        assert {(r["kind"], r["hops"]) for r in records[split]} == {("simple", 1)} | {
            ("compositional", h) for h in (2, 3, 4)
        }
        assert {r["source"] for r in records[split]} == {"geography", "elements"}
    shares = [len(records[s]) / n for s in SPLITS]
    assert abs(shares[0] - 0.7) < 0.02 and abs(shares[1] - 0.1) < 0.02 and abs(shares[2] - 0.2) < 0.02
    assert manifest["multi_answer_share"] >= 0.3
    assert all(1 <= len(r["answer"]) <= 30 for r in _all(bench))


def test_missing_answers_follow_rog_convention(bench):
    rs = _all(bench)
    missing = [r for r in rs if not r["answer_in_graph"]]
    assert 0.08 <= len(missing) / len(rs) <= 0.17
    for split in SPLITS:
        assert any(not r["answer_in_graph"] for r in bench[1][split])
    for r in rs:
        nodes = {x for h, _, t in r["graph"] for x in (h, t)}
        assert set(r["q_entity"]) <= nodes
        assert r["a_entity"] == [a for a in r["answer"] if a in nodes]
        assert r["answer_in_graph"] == (len(r["a_entity"]) == len(r["answer"]))


def test_gold_answers_are_exactly_what_the_kg_says(bench, kg):
    for r in _all(bench):
        start = kg.index[r["q_entity"][0]]
        reached = kg.follow([start], r["relation_path"])
        for relation, entity in r["constraints"]:
            reached = {n for n in reached if kg.index[entity] in kg.follow([n], [relation])}
        assert sorted(kg.names[n] for n in reached) == sorted(r["answer"]), r["question"]


@pytest.mark.heavy
def test_subgraphs_are_real_directed_triples_with_distractors(bench, kg):
    real = {kg.triple(t) for t in range(kg.num_triples)}
    sizes = []
    for r in _all(bench):
        graph = [tuple(t) for t in r["graph"]]
        assert len(set(graph)) == len(graph) and set(graph) <= real
        sizes.append(len(graph))
        if r["answer_in_graph"]:
            assert len(graph) >= 30
            assert len({rel for _, rel, _ in graph}) >= 2
            # the gold path exists inside the subgraph too
            sub: dict[tuple[str, str], set[str]] = {}
            for h, rel, t in graph:
                sub.setdefault((h, rel), set()).add(t)
                sub.setdefault((t, "~" + rel), set()).add(h)
            frontier = {r["q_entity"][0]}
            for step in r["relation_path"]:
                frontier = {x for n in frontier for x in sub.get((n, step), ())}
            assert set(r["answer"]) <= frontier, r["question"]
    assert 100 <= statistics.median(sizes) <= 400 and max(sizes) <= 1000


def test_split_depends_on_seed(bench):
    rs = _all(bench)
    s0, s0b, s1 = builder.split_records(rs, 0), builder.split_records(rs, 0), builder.split_records(rs, 1)
    assert [r["id"] for r in s0["test"]] == [r["id"] for r in s0b["test"]]
    assert [r["id"] for r in s0["test"]] == [r["id"] for r in bench[1]["test"]]
    assert {r["id"] for r in s0["test"]} != {r["id"] for r in s1["test"]}


@pytest.mark.slow
def test_full_build_byte_identical_and_seed_dependent(bench, tmp_path):
    paths0 = bench[0]
    again = embedded.build_embedded_benchmark(tmp_path / "again", seed=0, progress=False)
    other = embedded.build_embedded_benchmark(tmp_path / "other", seed=1, progress=False)
    for key in (*SPLITS, "manifest"):
        assert again[key].read_bytes() == paths0[key].read_bytes()
    ids = {s: {json.loads(x)["id"] for x in other[s].read_text(encoding="utf-8").splitlines()} for s in SPLITS}
    assert ids["test"] != {r["id"] for r in bench[1]["test"]}


def test_subgraph_config_defaults_are_sane():
    cfg = SubgraphConfig()
    assert cfg.min_budget < cfg.max_budget <= 1000 and 0.1 <= cfg.missing_rate <= 0.15
