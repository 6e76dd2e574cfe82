"""Assemble the embedded benchmark: full KG -> questions -> subgraphs -> stratified splits -> files.

Everything random draws from :class:`random.Random` instances seeded from ``seed`` (and the question id), and
everything taken from a set or dict is sorted first, so one seed always gives byte-identical files.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import random
import shutil
import statistics
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from .facts_elements import load_elements
from .facts_geography import load_geography
from .factset import FactSet
from .kg import KnowledgeGraph
from .questions import Question, generate_questions
from .subgraphs import SubgraphConfig, make_subgraph

#: Bump when the output of a build changes; it names the cache folder.
VERSION = "1"
SPLITS = ("train", "validation", "test")
SPLIT_FRACTIONS = (0.7, 0.1, 0.2)


@functools.lru_cache(maxsize=1)
def build_knowledge_graph() -> KnowledgeGraph:
    """The full embedded KG (geography + elements), built once per process."""
    geo, countries = load_geography()
    facts = FactSet().merge(geo).merge(load_elements(countries))
    return KnowledgeGraph(facts)


def make_record(kg: KnowledgeGraph, q: Question, seed: int, cfg: SubgraphConfig) -> dict[str, Any]:
    """The RoG-format record of one question, with its seeded subgraph."""
    triples = make_subgraph(kg, q, random.Random(f"{seed}:{q.qid}"), cfg)
    graph = sorted(kg.triple(t) for t in triples)
    present = {n for t in triples for n in (kg.heads[t], kg.tails[t])}
    answers = [kg.names[a] for a in q.answers]
    a_entity = [kg.names[a] for a in q.answers if a in present]
    tpl = q.template
    return {
        "id": q.qid,
        "question": q.text,
        "answer": answers,
        "q_entity": [kg.names[e] for e in q.q_entities],
        "a_entity": a_entity,
        "graph": graph,
        "kind": tpl.kind,
        "hops": tpl.hops,
        "relation_path": tpl.relation_path,
        "answer_in_graph": len(a_entity) == len(answers),
        "source": tpl.source,
        "constraints": [[tpl.constraint, kg.names[q.constraint]]] if q.constraint is not None else [],
        "template": tpl.name,
    }


def split_records(records: list[dict[str, Any]], seed: int) -> dict[str, list[dict[str, Any]]]:
    """Stratified split by (source, kind, hops): ~70/10/20 inside every stratum, each split sorted by id."""
    strata: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        strata.setdefault((r["source"], r["kind"], r["hops"]), []).append(r)
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    rng = random.Random(f"split:{seed}")
    for key in sorted(strata):
        group = sorted(strata[key], key=lambda r: r["id"])
        rng.shuffle(group)
        n = len(group)
        n_val = max(1, round(n * SPLIT_FRACTIONS[1])) if n >= 3 else 0
        n_test = max(1, round(n * SPLIT_FRACTIONS[2])) if n >= 3 else 0
        n_train = n - n_val - n_test
        out["train"] += group[:n_train]
        out["validation"] += group[n_train : n_train + n_val]
        out["test"] += group[n_train + n_val :]
    return {s: sorted(rs, key=lambda r: r["id"]) for s, rs in out.items()}


def _share(records: list[dict[str, Any]], pred) -> float:
    return round(sum(1 for r in records if pred(r)) / max(1, len(records)), 4)


def summarize(kg: KnowledgeGraph, splits: dict[str, list[dict[str, Any]]], seed: int) -> dict[str, Any]:
    """The manifest: version, seed, counts per split/kind/hops/source, answer statistics, subgraph sizes."""
    everything = [r for s in SPLITS for r in splits[s]]
    sizes = sorted(len(r["graph"]) for r in everything)

    def counts(rs: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "total": len(rs),
            "kind": dict(sorted(Counter(r["kind"] for r in rs).items())),
            "hops": {str(k): v for k, v in sorted(Counter(r["hops"] for r in rs).items())},
            "source": dict(sorted(Counter(r["source"] for r in rs).items())),
        }

    return {
        "name": "kglightning-embedded",
        "builder_version": VERSION,
        "seed": seed,
        "files": {s: f"{s}.jsonl" for s in SPLITS},
        "counts": {"all": counts(everything), **{s: counts(splits[s]) for s in SPLITS}},
        "multi_answer_share": _share(everything, lambda r: len(r["answer"]) > 1),
        "answers_missing_share": _share(everything, lambda r: not r["answer_in_graph"]),
        "answers_per_question": {
            "mean": round(statistics.fmean(len(r["answer"]) for r in everything), 3),
            "max": max(len(r["answer"]) for r in everything),
        },  # fmt: skip
        "subgraph_triples": {
            "min": sizes[0],
            "median": statistics.median(sizes),
            "max": sizes[-1],
            "mean": round(statistics.fmean(sizes), 1),
        },  # fmt: skip
        "templates": len({r["template"] for r in everything}),
        "kg": kg.stats(),
        "data_quality": kg.quality,
    }


def _new_file(path: Path):
    """A new text file at ``path`` (in the build's own folder), ``0644`` less the umask: no umask makes a file of
    the benchmark writable by the group or others, which its reader would refuse (and build it again)."""
    from kglightning.data.store.owned_files import create_new

    return os.fdopen(create_new(path, 0o644), "w", encoding="utf-8", newline="\n")


def _write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    with _new_file(path) as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")))
            f.write("\n")


def _refuse_foreign(out_dir: Path, built: set[str]) -> None:
    """Raise ``FileExistsError`` naming the files in ``out_dir`` (a build of kglightning) that a build does not
    write (not in ``built``): a user's notes or runs put beside a build are neither replaced nor moved with it."""
    foreign = sorted(set(os.listdir(out_dir)) - built)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise FileExistsError(f"{out_dir} holds an older build of kglightning and files it did not write ({shown}); "
                              "they are never removed: move them away, or build into another folder")  # fmt: skip


def _refuse_other(out_dir: Path) -> None:
    """Raise ``FileExistsError`` when ``out_dir`` (which exists) is not a build of kglightning: a link, a file, or a
    folder without kglightning's marker (:func:`~kglightning.data.store.cache_marks.why_unmarked`)."""
    from kglightning.data.store.cache_marks import why_unmarked

    why = "it is a symbolic link" if out_dir.is_symlink() else why_unmarked(out_dir)
    if why is None and not out_dir.is_dir():
        why = "it is not a folder"
    if why is not None:
        raise FileExistsError(f"{out_dir} exists and is not a build of kglightning ({why or 'no kglightning marker'}); "
                              "it is never removed: move it away, or build into another folder")  # fmt: skip


def _publish(tmp: Path, out_dir: Path, replace: bool) -> None:
    """Rename a finished build into place.

    A folder already at ``out_dir`` is moved only when it is a build of kglightning (it carries kglightning's
    marker, :func:`~kglightning.data.store.cache_marks.why_unmarked`): with ``replace=False`` a complete one (say,
    from a concurrent process) is kept and ours is discarded; a torn one (no ``manifest.json``) is set aside
    (``<name>.unreadable-<time>``, with a WARNING; ``kglightning cache clean`` removes it in time); with
    ``replace=True`` a complete one is moved aside and deleted. An empty folder is taken as made ready for the build.
    Anything else at ``out_dir`` (a user's folder, a link), and a build beside which a user put files of their own
    (names a build does not write), is never removed nor moved.

    Raises:
        FileExistsError: ``out_dir`` exists and is not a build of kglightning, or holds files that a build does not
            write (the message names them: move them away).
    """
    from kglightning.data.store.cache_marks import set_aside
    from kglightning.data.store.temporaries import writer_temporary

    if out_dir.is_dir() and not out_dir.is_symlink() and not any(out_dir.iterdir()):
        out_dir.rmdir()  # an empty folder (made ready for the build) holds nothing to keep
    if os.path.lexists(out_dir):
        _refuse_other(out_dir)
        complete = (out_dir / "manifest.json").is_file()
        if complete and not replace:
            return
        _refuse_foreign(out_dir, set(os.listdir(tmp)))  # a user's files beside a build: never deleted nor moved
        if not complete:
            set_aside(out_dir, "holds no manifest.json (a build that did not finish)")
        else:
            old = writer_temporary(out_dir.with_name(out_dir.name + ".old"), "an embedded benchmark build")
            os.replace(out_dir, old)
            shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(tmp, out_dir)
    except OSError:
        if not (out_dir / "manifest.json").exists():  # lost a race to another complete build: fine
            raise


_WORK: tuple[KnowledgeGraph, list[Question], int, SubgraphConfig] | None = None  # read by forked workers


def _make_records(bounds: tuple[int, int]) -> list[dict[str, Any]]:
    assert _WORK is not None
    kg, questions, seed, cfg = _WORK
    return [make_record(kg, q, seed, cfg) for q in questions[bounds[0] : bounds[1]]]


def make_records(
    kg: KnowledgeGraph, questions: list[Question], seed: int, cfg: SubgraphConfig, workers: int, progress: bool
) -> list[dict[str, Any]]:
    """:func:`make_record` for every question, in order, on ``workers`` forked processes (each question draws
    from its own seeded generator, so the records do not depend on how the work is split)."""
    global _WORK
    from tqdm.auto import tqdm

    bar = tqdm(total=len(questions), desc="embedded benchmark: subgraphs", unit="q", disable=not progress)
    chunk = 250
    bounds = [(i, min(i + chunk, len(questions))) for i in range(0, len(questions), chunk)]
    out: list[dict[str, Any]] = []
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        _WORK = (kg, questions, seed, cfg)
        try:
            ctx = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                for part in pool.map(_make_records, bounds):
                    out.extend(part)
                    bar.update(len(part))
        finally:
            _WORK = None
    else:
        for q in questions:
            out.append(make_record(kg, q, seed, cfg))
            bar.update(1)
    bar.close()
    return out


def _build_folder(out_dir: Path) -> Path:
    """A new folder beside ``out_dir`` to build into (``.<name>.kgl-<host>.<pid>.tmp``), holding kglightning's marker
    (a build of kglightning, which a later build may replace and, in the cache, ``kglightning cache clean`` may
    remove), after removing the ones that killed builds left there, and the old builds they had moved aside
    (:func:`~kglightning.data.store.temporaries.writer_temporary`)."""
    from kglightning.data.store.cache_marks import mark_folder
    from kglightning.data.store.temporaries import remove_abandoned, writer_temporary

    remove_abandoned(out_dir.with_name(out_dir.name + ".old"), "an embedded benchmark build")  # a replaced build's
    tmp = writer_temporary(out_dir, "an embedded benchmark build")
    tmp.mkdir(mode=0o700)
    mark_folder(tmp)
    return tmp


def make_parent(out_dir: Path) -> None:
    """Create ``out_dir``'s missing parent folders: ``0700`` inside the kglightning cache (its root included, which the
    embedded benchmark is often the first to need, whatever the folder above it), with the umask's mode elsewhere.

    Raises:
        PermissionError: ``out_dir`` is in the cache and its folder belongs to another user or others can write it
            (:func:`~kglightning.data.store.cache.untrusted`): a build there would be refused by its reader.

    Example:
        >>> import os, stat, tempfile
        >>> os.environ["KGLIGHTNING_CACHE"] = root = tempfile.mkdtemp() + "/cache"
        >>> make_parent(Path(root) / "embedded-v1")
        >>> oct(stat.S_IMODE(os.stat(root).st_mode))
        '0o700'
        >>> del os.environ["KGLIGHTNING_CACHE"]
    """
    from kglightning.data.store.cache import default_cache_root, private_dir, untrusted

    root = default_cache_root().expanduser().resolve()
    if out_dir.parent == root or root in out_dir.parents:
        private_dir(out_dir.parent)
        why = untrusted(out_dir.parent)
        if why is not None:
            raise PermissionError(
                f"{out_dir.parent} is not trusted ({why}): kglightning builds nothing in a cache "
                "folder other users could change; make it private (chmod go-w) or build elsewhere"
            )
    else:
        out_dir.parent.mkdir(parents=True, exist_ok=True)


def build_embedded_benchmark(
    out_dir: str | Path, seed: int = 0, progress: bool = True, *, replace: bool = True, workers: int | None = None
) -> dict[str, Path]:
    """Build the benchmark into ``out_dir`` (written in a temp folder, then renamed into place).

    Args:
        out_dir: destination folder; an existing build of kglightning there is replaced as a whole (unless
            ``replace=False`` and it is complete, which is then kept). A folder there that kglightning did not
            build (it carries no kglightning marker) is never removed: the build stops with ``FileExistsError``.
        seed: seed of the split, the subgraph sampling and the missing answers.
        progress: show a tqdm progress bar.
        workers: processes that cut the subgraphs (default: the CPUs this process may use); the files are the same
            for any number.

    Returns:
        ``{"train": ..., "validation": ..., "test": ..., "manifest": ...}`` paths.
    """
    out_dir = Path(out_dir).expanduser().resolve()
    make_parent(out_dir)
    from kglightning.data.store.cache_marks import MARK

    if os.path.lexists(out_dir) and not (out_dir.is_dir() and not out_dir.is_symlink() and not any(out_dir.iterdir())):
        _refuse_other(out_dir)  # before the work, as _publish would after it
        _refuse_foreign(out_dir, {MARK, "manifest.json", *(f"{s}.jsonl" for s in SPLITS)})
    kg = build_knowledge_graph()
    questions = generate_questions(kg)
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    records = make_records(kg, questions, seed, SubgraphConfig(), workers, progress)
    splits = split_records(records, seed)
    manifest = summarize(kg, splits, seed)
    tmp = _build_folder(out_dir)
    try:
        for s in SPLITS:
            _write_jsonl(tmp / f"{s}.jsonl", splits[s])
        with _new_file(tmp / "manifest.json") as f:
            f.write(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        os.chmod(tmp, 0o755)
        _publish(tmp, out_dir, replace)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    paths = {s: out_dir / f"{s}.jsonl" for s in SPLITS}
    paths["manifest"] = out_dir / "manifest.json"
    return paths
