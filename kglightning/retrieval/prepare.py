"""PCST subgraphs cut on every core and across machines, with the output of one process.

A question's cut (:meth:`PCSTRetriever.retrieve_record <kglightning.retrieval.pcst.PCSTRetriever.retrieve_record>`)
depends on the KG, the question and the text embeddings it reads, and nothing else. The embeddings are where runs
could part: a text encoder's output moves in its last digits with the batch a string is encoded in, and a process
that encodes what its own questions need builds other batches than one that encodes for all of them. So the work
runs in two phases:

1. **embed** (:func:`needed_texts`, :func:`embed_texts`): every string the cuts of all the splits will look up
   (the neighbourhoods' node names, the KG's relation texts, the questions) is sorted and cut into fixed blocks of
   ``block`` strings, and a block that holds any new string is encoded as one batch
   (:meth:`EmbeddingCache.add <kglightning.data.embeddings.EmbeddingCache.add>` with ``whole=True``). The blocks
   are the same whichever process or machine encodes them, so the rows are too, on the same kind of device and
   **from the same starting cache**: a string the cache already holds keeps the row of whatever batch first encoded
   it (an earlier run on other questions), so start every machine from an empty cache or from copies of one.
2. **cut** (:func:`cut_records`): a cached ``datasets`` map over the questions
   (:func:`~kglightning.data.store.stage_map.cached_map`): contiguous pieces, each on ``workers`` forked processes (the KG
   index and the embedding table are shared with them, not copied), one torch thread each, the results in question
   order. Nothing is encoded in this phase (checked). The cuts are kept as Arrow files under
   ``$KGLIGHTNING_CACHE/pcst-cuts/``, keyed by the questions, the KG, the settings, the encoder and the embedding
   rows the cuts read (:func:`rows_key`): a run stopped part-way cuts only the pieces it had not finished when run
   again, and a change of any of them cuts everything anew.

``--shard i/N`` cuts one contiguous part of each split (:func:`~kglightning.data.store.stage_map.take_shard`:
``datasets.Dataset.shard`` of its rows, contiguous), and :func:`merge_shards` concatenates the parts' files in shard order: the file one
process writes, byte for byte (each question's seconds aside). Phase 1 reads every question of every split on every
machine, to know the blocks; ``--embed-only`` with a shard encodes only blocks ``i, i + N, ...``, so N machines can
share the encoding too and then copy their cache folders into one (shards are files named by their content) before
the cuts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from kglightning.data.digest import records_digest
from kglightning.data.kg import KGIndex
from kglightning.data.kg_paths import khop_ids
from kglightning.data.records import KGQARecord
from kglightning.data.store.cache import default_cache_root
from kglightning.data.store.stage_map import cached_map, fingerprint, stage_state, take_shard, torch_threads
from kglightning.data.text import relation_text
from kglightning.fileio import atomic_write, write_text_atomic
from kglightning.retrieval.pcst import PCSTRetriever, SubgraphStats

__all__ = [
    "cut_records",
    "embed_texts",
    "merge_shards",
    "needed_texts",
    "rows_key",
    "settings",
    "write_stats",
]

log = logging.getLogger(__name__)

#: strings encoded together in phase 1
BLOCK = 4096


def needed_texts(retriever: PCSTRetriever, records: Sequence[KGQARecord], kg: KGIndex) -> list[str]:
    """Every string the cuts of ``records`` from ``kg`` embed (a superset: all of the KG's relations), sorted."""
    texts = {relation_text(r) for r in kg.relations}
    names = kg._entities
    for r in records:
        present = [e for e in r.q_entity if e in kg]
        if present:
            texts.add(r.question)
            ids, _ = khop_ids(kg, present, retriever.hops, retriever.max_degree, retriever.max_nodes)
            texts.update(names[i] for i in ids.tolist())
    return sorted(texts)


def embed_texts(
    retriever: PCSTRetriever,
    texts: Sequence[str],
    block: int | None = None,
    shard: tuple[int, int] | None = None,
    progress: bool = True,
) -> int:
    """Phase 1: encode the blocks (``block`` strings, default :data:`BLOCK`) of the sorted ``texts`` that hold a
    string the cache lacks (with ``shard=(i, N)``, only blocks ``i, i + N, ...``); return how many strings were
    new."""
    cache = retriever.embeddings
    block = block or BLOCK
    starts = list(range(0, len(texts), block))
    if shard is not None:
        starts = starts[shard[0] :: shard[1]]
    new = 0
    for lo in tqdm(starts, desc="embedding", unit="block", disable=not progress or len(starts) < 2, leave=False):
        new += cache.add(texts[lo : lo + block], whole=True)
    return new


#: part of the cuts' cache key: raise it when what :meth:`PCSTRetriever.retrieve_record` returns changes
CUT_VERSION = 1
_FLAGS = ("missing_topic", "partial_topic", "empty_neighborhood", "truncated")


def _cut_features() -> Any:
    import datasets

    v = datasets.Value
    columns = {"id": v("string"), "record": v("large_string"), "seconds": v("float64"), "nodes": v("int64"),
               "triples": v("int64"), "neighborhood": v("int64"), "answer_in_graph": v("bool")}  # fmt: skip
    return datasets.Features({**columns, **{f: v("bool") for f in _FLAGS}})


def _cut_batch(batch: dict[str, list]) -> dict[str, list]:
    """The map step of :func:`cut_records`: each question's cut (its JSON, ``None`` when skipped) and stats."""
    retriever, kg, records = stage_state()
    cache = retriever.embeddings
    before = len(cache)
    out: dict[str, list] = {k: [] for k in _cut_features()}
    with torch_threads(1):  # the same arithmetic in every process
        for i, qid in zip(batch["index"], batch["id"], strict=True):
            record = records[i]
            retriever.stats = st = SubgraphStats()
            cut = retriever.retrieve_record(record, kg if kg is not None else KGIndex.from_record(record))
            out["id"].append(qid)
            out["record"].append(None if cut is None else json.dumps(cut.to_dict()))
            for col, values in (("seconds", st.seconds), ("nodes", st.nodes), ("triples", st.triples),
                                ("neighborhood", st.neighborhood_triples), ("answer_in_graph", st.answer_in_graph)):  # fmt: skip
                out[col].append(values[0] if values else None)
            for flag in _FLAGS:
                out[flag].append(bool(getattr(st, flag)))
    if len(cache) != before:
        raise RuntimeError(
            f"{len(cache) - before} string(s) were encoded while cutting questions {batch['id'][0]!r}..: phase 1 "
            "(needed_texts, embed_texts) did not cover them, and the rows would depend on the number of processes"
        )
    return out


def rows_key(retriever: PCSTRetriever, texts: Sequence[str], block: int = 1 << 16) -> str:
    """A digest of the embedding rows of ``texts`` (all cached: run :func:`embed_texts` first), the part of the
    cuts' cache key that says which rows they read: a cache that holds other rows for them gives another key."""
    cache, h = retriever.embeddings, hashlib.sha256()
    for lo in range(0, len(texts), block):
        part = texts[lo : lo + block]
        h.update(cache.rows(cache.ids(part)).numpy().astype("<f2").tobytes())
    return h.hexdigest()[:32]


def cut_records(
    retriever: PCSTRetriever,
    records: Sequence[KGQARecord],
    kg: KGIndex | None,
    workers: int = 1,
    desc: str = "PCST",
    key: str | None = None,
    shard: tuple[int, int] | None = None,
) -> tuple[list[KGQARecord | None], SubgraphStats]:
    """Phase 2: every question's cut (``None`` for a skipped question) in question order, and their stats.

    The cuts run as a cached ``datasets`` map over the questions (:func:`~kglightning.data.store.stage_map.cached_map`) on
    ``workers`` processes; the output does not depend on ``workers``. ``shard=(i, N)`` cuts part ``i`` of ``N``
    (:func:`~kglightning.data.store.stage_map.take_shard`). With ``key`` (:func:`rows_key` of the texts that
    :func:`embed_texts` encoded), the cuts are kept in ``$KGLIGHTNING_CACHE/pcst-cuts/<fingerprint>``, the
    fingerprint covering the questions (:func:`~kglightning.data.digest.records_digest`, their ``extra`` included:
    their graphs' ids, not JSON of the triples), the KG, the retriever's settings, the encoder, ``key``,
    :data:`CUT_VERSION` and the versions of kglightning, the PCST solver, numpy and torch: a run stopped part-way is
    resumed, and a rerun reads them. A rerun's stats and ``times.jsonl`` give the seconds of the run that cut them. ``kg=None`` cuts each
    question from its own graph. Run :func:`embed_texts` first.
    """
    import datasets

    questions = datasets.Dataset.from_dict({"index": list(range(len(records))), "id": [r.id for r in records]})
    if shard is not None:
        questions = take_shard(questions, *shard)
    folder = None
    if key is not None:
        mine = records_digest([records[i] for i in questions["index"]], extra=True)  # ids, not JSON triples
        fp = fingerprint("pcst", CUT_VERSION, _versions(), settings(retriever), None if kg is None else kg.digest(),
                         key, mine)  # fmt: skip
        folder = default_cache_root() / "pcst-cuts" / fp
    retriever.embeddings  # noqa: B018  # opened before any fork, so the children share its table
    out = cached_map(questions, _cut_batch, _cut_features(), folder, state=(retriever, kg, records), workers=workers,
                     desc=desc, progress=retriever.show_progress)  # fmt: skip
    cuts: list[KGQARecord | None] = []
    stats = SubgraphStats()
    for batch in out.iter(batch_size=1024):
        for i, text in enumerate(batch["record"]):
            cuts.append(None if text is None else KGQARecord.from_dict(json.loads(text), source="cut"))
            if batch["seconds"][i] is not None:
                stats.add(batch["nodes"][i], batch["triples"][i], batch["neighborhood"][i], batch["seconds"][i],
                          batch["answer_in_graph"][i])  # fmt: skip
            for flag in _FLAGS:
                setattr(stats, flag, getattr(stats, flag) + int(batch[flag][i]))
    retriever.stats = stats
    if stats.missing_topic:
        log.warning("%d of %d question(s) skipped: no topic entity in the KG", stats.missing_topic, len(cuts))
    return cuts, stats


def _versions() -> dict[str, str | None]:
    """The versions of the code a cut runs (kglightning's, the PCST solver's, numpy's, torch's): cuts kept by other
    versions are not read back. kglightning's version moves with releases only: a change to the cuts between them
    raises :data:`CUT_VERSION`."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("kglightning", "pcst-fast2", "pcst-fast", "numpy", "torch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def settings(retriever: PCSTRetriever) -> dict[str, Any]:
    """The retriever's settings that its cuts depend on, and its encoder's cache key."""
    names = ("hops", "topk", "topk_e", "cost_e", "num_clusters", "max_degree", "max_nodes", "on_missing_topic")
    return {**{k: getattr(retriever, k) for k in names}, "encoder": retriever.encoder.cache_key}


_SHARD_FILE = re.compile(r"^(?P<name>.+)\.shard-(?P<i>\d{5})-of-(?P<n>\d{5})(?P<ext>\.times\.jsonl|\.jsonl|\.json)$")


def merge_shards(out_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Concatenate ``build-subgraphs --shard i/N`` outputs in ``out_dir`` into the files of one run: each
    ``<split>.jsonl`` and ``<split>.times.jsonl``, and ``subgraph_stats.json`` from the shards' raw stats. Returns
    the per-split stats. Everything is checked before anything is written.

    Raises:
        FileNotFoundError: no shard files, or a shard of the set missing.
        ValueError: shards of different counts, settings or splits, or record files that do not hold the questions
            their statistics count.
    """
    out_dir = Path(out_dir)
    groups: dict[tuple[str, str], dict[int, Path]] = {}
    counts: set[int] = set()
    for p in sorted(out_dir.iterdir()):
        m = _SHARD_FILE.match(p.name)
        if m:
            groups.setdefault((m["name"], m["ext"]), {})[int(m["i"])] = p
            counts.add(int(m["n"]))
    if not groups:
        raise FileNotFoundError(f"{out_dir}: no *.shard-IIIII-of-NNNNN.* files to merge")
    if len(counts) != 1:
        raise ValueError(f"{out_dir}: shards of {sorted(counts)} parts; keep the files of one --shard I/N set")
    (n,) = counts
    stat_files = groups.pop(("subgraph_stats", ".json"), {})
    for (name, ext), parts in [(("subgraph_stats", ".json"), stat_files), *groups.items()]:
        missing = sorted(set(range(n)) - set(parts))
        if missing:
            raise FileNotFoundError(f"{out_dir}: {name}{ext}: shard(s) {missing} of {n} are missing")
        if max(parts) >= n:
            raise ValueError(f"{out_dir}: {name}{ext}: shard {max(parts)} of {n} does not exist")
    shards = [json.loads(stat_files[i].read_text()) for i in range(n)]
    settings, split_names = shards[0]["settings"], list(shards[0]["splits"])
    if any(s["settings"] != settings or list(s["splits"]) != split_names for s in shards):
        raise ValueError(f"{out_dir}: the shards were cut with other settings or splits; cut them again with one set")
    splits: dict[str, dict[str, Any]] = {}
    for split in split_names:
        _check_parts(out_dir, split, [s["splits"][split].get("part") for s in shards])
        merged = SubgraphStats()
        for s in shards:
            merged.extend(SubgraphStats(**s["splits"][split]["raw"]))
        for ext in (".jsonl", ".times.jsonl"):
            parts = groups.get((split, ext))
            if parts is None:
                raise FileNotFoundError(f"{out_dir}: no {split}.shard-*{ext} files for split {split!r}")
            lines = sum(_count_lines(parts[i]) for i in range(n))
            if lines != len(merged.nodes):
                raise ValueError(f"{out_dir}: the {split}{ext} shards hold {lines} lines; their statistics count "
                                 f"{len(merged.nodes)} questions")  # fmt: skip
        splits[split] = {"questions_file": shards[0]["splits"][split]["questions_file"], **merged.summary()}
    stray = sorted(f"{name}{ext}" for name, ext in groups if name not in split_names)
    if stray:
        log.warning("%s: left out shard files of %s, which are not splits of the shards' statistics", out_dir, stray)
    for split in split_names:
        for ext in (".jsonl", ".times.jsonl"):
            with atomic_write(out_dir / f"{split}{ext}", mode="wb") as f:
                for i in range(n):
                    with open(groups[(split, ext)][i], "rb") as part:
                        shutil.copyfileobj(part, f)
    write_stats(out_dir / "subgraph_stats.json", settings, splits)
    return splits


def _check_parts(out_dir: Path, split: str, parts: list[list[int] | None]) -> None:
    """The shards' question ranges of ``split`` (``[lo, hi, n]`` each) must follow one another from 0 to ``n``;
    shards written before the ranges were recorded have none, and are not checked."""
    if all(p is None for p in parts):
        return
    at, total = 0, parts[0][2] if parts[0] is not None else None
    for i, p in enumerate(parts):
        if p is None or p[0] != at or p[2] != total or p[1] < p[0]:
            raise ValueError(f"{out_dir}: shard {i} of {split!r} holds questions {p} where [{at}, ..., {total}] "
                             "should follow: the shards were cut from other question lists or by another version; "
                             "cut them again with one")  # fmt: skip
        at = p[1]
    if at != total:
        raise ValueError(f"{out_dir}: the shards of {split!r} hold questions 0 to {at} of {total}")


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def write_stats(
    path: Path, settings: dict[str, Any], splits: dict[str, dict[str, Any]], raw: dict[str, SubgraphStats] | None = None
) -> None:
    """Write ``subgraph_stats.json``; a shard's keeps each split's ``raw`` stats too, which :func:`merge_shards`
    adds up."""
    body = {k: {**v, **({"raw": asdict(raw[k])} if raw and k in raw else {})} for k, v in splits.items()}
    write_text_atomic(path, json.dumps({"settings": settings, "splits": body}, indent=2))
