"""How each per-question stage scales: questions per second and peak memory on RoG-size records.

Records come from :mod:`rog_generator` (seeded, RoG format, ``--triples`` per question). Every stage runs in a
fresh process, so its peak RSS (``VmHWM``) is its own: the records read and validated, plus the stage's work. Peak
RSS counts the pages of memory-mapped embedding shards the stage touched, which the kernel can drop under pressure;
*peak anon* (``RssAnon``, sampled every 50 ms, so a lower bound) is the memory it cannot.

* ``read``: :func:`~kglightning.data.sources.loaders.read_records` (parse and validate); its RSS is the records';
* ``index``: :meth:`KGIndex.from_record <kglightning.data.kg.KGIndex.from_record>` per question;
* ``evidence``: :meth:`EvidenceBuilder.mine <kglightning.evidence.EvidenceBuilder.mine>` per question;
* ``pcst``: :meth:`PCSTRetriever.retrieve_record <kglightning.retrieval.PCSTRetriever.retrieve_record>` per question;
* ``detector``: the detector's data path, records to batched graphs (the graph rows built by their cached map and
  read back, ``graph_rows``; in trees before it, ``build_detection_graph``), then per batch of 32 what
  ``DetectionDataModule.collate`` does: ``Batch.from_data_list``, the text-embedding lookup, the edge types. With
  graph rows, ``seconds`` is a run's whose rows are stored (reading them, ``rows_read_s``, and the batches,
  ``batches_s``); the first run adds the build, ``rows_build_s``; the row also gives the rows' size on disk;
* ``uag``: :func:`~kglightning.conformal.uag.scores.score_questions` (UAG's candidate scores, 3 hops; with
  ``BENCH_UAG_QUESTIONS=n``, of the first ``n`` questions of all those read), and the size of the scores it keeps;
  then calibration on them (:class:`~kglightning.conformal.uag.UAGController` ``fit`` and ``select(0.1)``, its
  seconds in ``calibrate_s``, not in ``seconds``; the peak RSS covers both);
* ``embed``: every text of each question looked up in :class:`~kglightning.data.embeddings.EmbeddingCache`;
* ``cuts``: ``build-subgraphs``' path over every question of the split, each cut from its own graph:
  :func:`~kglightning.retrieval.prepare.cut_records` with a cache key (its fingerprint of the questions, then the
  cached map of the cuts, written to an emptied folder, and the cuts read back as records).

The stages after ``index`` read a warm embedding cache (``warm`` fills it first, untimed in the table). The text
encoder is a hashing encoder with MiniLM's width (384): the benchmark measures the data path, not the encoder, and a
CPU cannot encode millions of strings in a benchmark's time.

``--baseline SRC`` runs every stage a second time with ``SRC`` (a checkout of another commit, e.g. ``git worktree
add /tmp/base <commit>``) first on ``PYTHONPATH``, side by side in one run, as BENCHMARKS.md reports it.

    PYTHONPATH=. python tools/bench/bench_scale.py --questions 300 --triples 4000 [--baseline /tmp/base]
    PYTHONPATH=. python tools/bench/bench_scale.py --data /tmp/scale/webqsp/train.jsonl --stages read index
    PYTHONPATH=. python tools/bench/bench_scale.py --sweep-questions 250 500 1000 --plot docs/img/bench_scale.png

``--sweep-questions`` times the current code at each number of questions (``--triples`` each) and, at the first of
them, at each of ``--sweep-triples``, and plots seconds against both on log axes: a slope of 1 is linear growth.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zlib
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STAGES = ("read", "index", "evidence", "pcst", "detector", "uag", "embed", "cuts")
STAGE_LIMITS = {"evidence": 300, "pcst": 300, "uag": 300}  # slow per-question stages: the first N questions
_ANON: AnonPeak | None = None
_STAGE_MODULES = (
    "torch_geometric.data",
    "kglightning.conformal.uag.scores",
    "kglightning.datamodules.detection_graphs",
    "kglightning.evidence",
    "kglightning.nn.kgguard",
    "kglightning.retrieval.pcst",
)


class HashEncoder:
    """A deterministic stand-in for a sentence encoder: each string's vector is the normalised sum of three rows of
    a seeded table, picked by hashes of the string (``cache_key``, ``dim`` and ``encode`` are all
    :class:`~kglightning.data.embeddings.EmbeddingCache` needs). Vectorised, so that the stages measure the
    toolkit's own work; a real encoder's time per text comes on top (see BENCHMARKS.md)."""

    ROWS = 4096

    def __init__(self, dim: int = 384) -> None:
        import numpy as np

        self.dim = dim
        self.cache_key = f"hash3-{dim}"  # "hash-" caches hold the earlier per-string generator's vectors
        self._table = np.random.default_rng(0).standard_normal((self.ROWS, dim), dtype=np.float32)

    def encode(self, texts):
        import numpy as np
        import torch

        raw = [t.encode() for t in texts]
        h = np.fromiter((zlib.crc32(b) for b in raw), dtype=np.int64, count=len(raw))
        g = np.fromiter((zlib.adler32(b) for b in raw), dtype=np.int64, count=len(raw))
        rows = self.ROWS
        out = self._table[h % rows] + self._table[(h >> 12) % rows] + self._table[(g ^ (h >> 20)) % rows]
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return torch.from_numpy(out)


def _rss(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process in MiB."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


_PHASE_PEAKS: list[float] = []  # the peaks phase_peak reset


def phase_peak() -> float:
    """``VmHWM`` in MiB, then reset to the current RSS (``/proc/self/clear_refs``), so that the next call gives the
    peak of the phase in between; ``nan`` where the kernel does not allow the reset."""
    peak = _rss("VmHWM")
    _PHASE_PEAKS.append(peak)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return float("nan")
    return round(peak, 1)


class AnonPeak:
    """The highest ``RssAnon`` (memory of this process not backed by a file) seen by a thread that samples it every
    ``interval`` seconds. ``VmHWM`` also counts the pages of memory-mapped files (the embedding shards), which the
    kernel can drop and read again; this is the part it cannot."""

    def __init__(self, interval: float = 0.05) -> None:
        import threading

        self.peak = _rss("RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.peak = max(self.peak, _rss("RssAnon"))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _rss("RssAnon"))


def run_stage(stage: str, data: Path, cache: Path, limit: int | None, warm_questions: int | None = None) -> dict:
    """One stage in this process; returns its measurements. ``warm`` embeds every question's node texts, and the UAG
    and PCST texts of the first ``warm_questions`` (default: as many as those stages run on)."""
    global _ANON
    _ANON = AnonPeak()
    from kglightning.data.sources.loaders import read_records

    if stage != "read":  # the read stage measures what reading costs a fresh process, imports included
        import torch

        torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
        from kglightning.data.embeddings import EmbeddingCache
        from kglightning.data.kg import KGIndex

    for module in _STAGE_MODULES if stage != "read" else ():  # before any timer: torch_geometric alone takes seconds
        try:
            importlib.import_module(module)
        except ImportError:  # an older checkout may lack one; its stage then fails on its own import
            pass
    try:  # this tree: a large file's records come from the record store after its first read
        store_folder = _module("kglightning.data.store.record_store", "kglightning.data.record_store").store_folder
        folder = store_folder(data, None, "raise", limit)
        stored = folder is not None and (folder / "meta.json").is_file()
    except ImportError:  # an older checkout (--baseline) has no store
        stored = False
    base = _rss("VmRSS")
    t0 = time.perf_counter()
    records = read_records(data, report=False, limit=limit)  # a limited stage reads only its first questions
    read_s = time.perf_counter() - t0
    after_read = _rss("VmRSS")
    triples = sum(len(r.graph) for r in records)
    encoder = HashEncoder()
    t0 = time.perf_counter()
    if stage == "read":
        vocab = getattr(records, "vocab", None)  # the distinct strings of the split (this tree)
        touched = sum(int(r.graph.ids.sum()) if hasattr(r.graph, "ids") else len(r.graph) for r in records)
        return _result(
            stage, records, triples, read_s, base, after_read, strings=len(vocab) if vocab else None, stored=stored,
            touched=touched,
        )  # fmt: skip
    elif stage == "index":
        for r in records:
            KGIndex.from_record(r)
    elif stage == "evidence":
        from kglightning.evidence import EvidenceBuilder

        builder = EvidenceBuilder()
        for r in records:
            builder.mine(r)
    elif stage in ("pcst", "detector", "uag", "embed", "warm", "cuts"):
        emb = EmbeddingCache(encoder, cache)
        load_s = time.perf_counter() - t0
        extra: dict = {}
        t0 = time.perf_counter()
        if stage == "warm":
            from kglightning.conformal.uag.scores import _texts, _walks
            from kglightning.datamodules.detection_graphs import node_texts

            texts: set[str] = set()
            for r in records:
                texts.update(node_texts(r))
            emb.add(texts)
            import kglightning.data.embeddings as embeddings

            # a tree whose UAG keeps its path texts out of the disk cache (TransientEmbeddings) stores none; an older
            # one stored them, and its warm cache holds them as its own run would leave them
            if not hasattr(embeddings, "TransientEmbeddings"):
                for r in records[: STAGE_LIMITS["uag"] if warm_questions is None else warm_questions]:
                    emb.add(_texts(r, _walks(r, KGIndex.from_record(r), 3, 5000), None))
            for r in records[: STAGE_LIMITS["pcst"] if warm_questions is None else warm_questions]:
                emb.add([r.question])
        elif stage == "pcst":
            from kglightning.retrieval.pcst import PCSTRetriever

            retriever = PCSTRetriever(encoder, cache_dir=str(cache.parent), show_progress=False)
            retriever._cache = emb
            for r in records:
                retriever.retrieve_record(r, KGIndex.from_record(r))
        elif stage == "detector":
            from torch_geometric.data import Batch

            from kglightning.datamodules.detection_graphs import DetectionStats, build_detection_graph
            from kglightning.nn.kgguard import edge_types

            stats = DetectionStats()
            # this tree: the graphs built as stored Arrow rows by a map, then read back; older trees: built directly
            extra["peak_before_mib"] = phase_peak()  # the read and the embedding table, and each phase's own below
            graphs = _detector_rows(records, emb, cache.parent / "graph_rows", extra)
            if "rows_build_s" in extra:  # ``seconds`` is a run's whose rows are stored: read and batches
                t0 += extra["rows_build_s"]
                extra["rows_build_s"] = round(extra["rows_build_s"], 1)
            if graphs is None:
                graphs = []
                try:  # one vocabulary-to-row map for the split, graphs kept compact; older code: neither
                    from kglightning.datamodules.detection_graphs import compact_graph, expand_graph  # older trees
                    from kglightning.datamodules.text_rows import TextRows

                    text_id = TextRows(emb._index)
                except ImportError:  # older code (a --baseline checkout); the row says so (``compat``)
                    text_id, compact_graph, expand_graph = emb._index, (lambda g: g), (lambda g: g)
                    extra["compat"] = True
                for r in records:
                    g = build_detection_graph(r, text_id, stats, True, "keep")
                    if g is not None:
                        graphs.append(compact_graph(g))
            else:
                try:
                    from kglightning.datamodules.graph_forms import expand_graph
                except ImportError:  # a tree with graph rows before graph_forms
                    from kglightning.datamodules.detection_graphs import expand_graph
            rows = getattr(emb, "rows", None) or emb.table.__getitem__  # older code: one float32 table
            t_batches = time.perf_counter()
            for lo in range(0, len(graphs), 32):  # what DetectionDataModule.collate does per batch
                batch = Batch.from_data_list([expand_graph(g) for g in graphs[lo : lo + 32]])
                batch.x_text = rows(batch.node_text)
                batch.ungrounded_x = rows(batch.ungrounded_text)
                type_text, _, _ = edge_types(batch.edge_text, batch.edge_kind)
                batch.type_text_emb = rows(type_text)
            extra["batches_s"] = round(time.perf_counter() - t_batches, 1)
            extra["peak_batches_mib"] = round(_rss("VmHWM"), 1)
        elif stage == "uag":
            from kglightning.conformal.uag.scores import score_questions

            n = int(os.environ.get("BENCH_UAG_QUESTIONS", "0")) or len(records)  # score the first n (all read)
            extra["peak_before_mib"] = phase_peak()  # the read and the embedding table; the scoring's and fit's below
            pool = score_questions(records[:n], emb, max_hops=3, progress=False)
            extra["peak_score_mib"] = phase_peak()
            extra.update(scored=len(pool), pool_mib=round(_pool_bytes(pool) / 2**20, 1))
            # then what calibration does with the pool: the controller's grid outcomes and Learn-Then-Test
            from kglightning.conformal.uag import UAGController

            t_fit = time.perf_counter()
            chosen = UAGController().fit(pool).select(0.1)
            calibrate_s = time.perf_counter() - t_fit
            extra["peak_calibrate_mib"] = phase_peak()
            t0 += calibrate_s  # ``seconds`` is the scoring's alone, as before this step was added
            extra.update(calibrate_s=round(calibrate_s, 1), chosen=chosen.summary().get("selected"))
        elif stage == "cuts":
            from kglightning.retrieval.pcst import PCSTRetriever
            from kglightning.retrieval.prepare import cut_records

            retriever = PCSTRetriever(encoder, cache_dir=str(cache.parent), show_progress=False)
            retriever._cache = emb
            os.environ["KGLIGHTNING_CACHE"] = str(cache.parent / "cuts-cache")  # where the stored cuts go
            shutil.rmtree(cache.parent / "cuts-cache", ignore_errors=True)
            cuts, _ = cut_records(retriever, records, None, key="bench")
            extra["cut"] = sum(c is not None for c in cuts)
        elif stage == "embed":
            from kglightning.datamodules.detection_graphs import node_texts

            for r in records:
                emb.embed(node_texts(r))
        seconds = time.perf_counter() - t0
        return _result(
            stage, records, triples, seconds, base, after_read, cache_load_s=load_s, strings=len(emb), **extra
        )
    else:
        raise ValueError(f"unknown stage {stage!r}")
    return _result(stage, records, triples, time.perf_counter() - t0, base, after_read)


def _module(*names: str):
    """The first of the modules ``names`` that imports (a module's place in this tree, then in older ones)."""
    for name in names[:-1]:
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    return importlib.import_module(names[-1])


def _detector_rows(records, emb, folder: Path, extra: dict) -> list | None:
    """DetectionDataModule's graphs: the cached map that builds the graph rows into ``folder`` (emptied first, so
    they are built: ``rows_build_s``, what a first run adds), then the graphs read from the stored rows, as every
    later run does (``rows_read_s``). ``None`` where the tree has no graph rows."""
    try:
        import datasets

        from kglightning.datamodules.graph_rows import build_graph_rows, graph_features, graphs_from_rows

        stage_map = _module("kglightning.data.store.stage_map", "kglightning.data.stage_map")
        cached_map, stored_map = stage_map.cached_map, stage_map.stored_map
    except ImportError:
        return None
    shutil.rmtree(folder, ignore_errors=True)
    t0 = time.perf_counter()
    questions = datasets.Dataset.from_dict({"index": list(range(len(records)))})
    state = (records, True, "keep", lambda r: None, "readable")
    rows = cached_map(questions, build_graph_rows, graph_features(), folder, state=state, piece=256, progress=False)
    extra["rows_build_s"] = time.perf_counter() - t0
    del rows
    extra["peak_build_mib"] = phase_peak()
    t0 = time.perf_counter()
    graphs = [g for _, g in graphs_from_rows(stored_map(folder), emb._index)]
    extra["rows_read_s"] = round(time.perf_counter() - t0, 1)
    extra["peak_read_mib"] = phase_peak()
    extra["rows_mib"] = round(sum(p.stat().st_size for p in folder.glob("*.arrow")) / 2**20, 1)
    return graphs


def _pool_bytes(pool) -> int:
    """The bytes of UAG's scores (arrays, and 8 per list entry), the part of the pool that grows with questions."""
    total = 0
    for s in pool:
        paths = getattr(s.paths, "rows", None)
        total += paths.nbytes if paths is not None else 80 * len(s.paths)  # older code: a tuple per path
        total += 8 * len(s.entities) + sum(t.nbytes for t in (s.expand, s.path_score, s.incidence, s.evaluator, s.gold))
    return total


def _result(stage, records, triples, seconds, base, after_read, **extra) -> dict:
    return {
        "stage": stage,
        "questions": len(records),
        "triples": triples,
        "seconds": round(seconds, 3),
        "questions_per_s": round(len(records) / seconds, 2) if seconds > 0 else None,
        "records_mib": round(after_read - base, 1),
        "bytes_per_triple": round((after_read - base) * 2**20 / max(triples, 1), 1),
        "peak_rss_mib": round(max([_rss("VmHWM"), *_PHASE_PEAKS]), 1),  # the whole process's, over phase_peak's resets
        "peak_anon_mib": round(_ANON.stop(), 1) if _ANON is not None else None,
        **extra,
    }


def _child(
    impl: str, src: Path, stage: str, data: Path, cache: Path, limit: int | None, warm: int | None = None
) -> dict:
    path = os.pathsep.join(p for p in (str(src), str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS=os.environ.get("BENCH_THREADS", "2"))
    env["KGLIGHTNING_CACHE"] = str(cache)  # record stores beside the embeddings: one cache per tree and file
    cmd = [sys.executable, str(Path(__file__)), "--child", stage, "--data", str(data), "--cache", str(cache)]
    if limit:
        cmd += ["--limit", str(limit)]
    if warm:
        cmd += ["--warm-questions", str(warm)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=src)
    if out.returncode != 0:
        return {"stage": stage, "impl": impl, "error": out.stderr.strip().splitlines()[-1:]}
    return {"impl": impl, **json.loads(out.stdout.strip().splitlines()[-1])}


def table(rows: list[dict]) -> str:
    head = "| stage | code | questions | triples | seconds | questions/s | records MiB | B/triple | peak RSS MiB |"
    head += " peak anon MiB |"
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['stage']} | {r['impl']} | error: {' '.join(r['error'])[:80]} ||||||||")
            continue
        stage = f"{r['stage']} ({r['pass']})" if r.get("pass") else r["stage"]
        lines.append(
            f"| {stage} | {r['impl']} | {r['questions']} | {r['triples']} | {r['seconds']:.2f} | "
            f"{r['questions_per_s']} | {r['records_mib']:.0f} | {r['bytes_per_triple']:.0f} | {r['peak_rss_mib']:.0f} |"
            f" {float('nan') if r.get('peak_anon_mib') is None else r['peak_anon_mib']:.0f} |"
        )
    return "\n".join(lines)


def sweep(args: argparse.Namespace, stages: list[str]) -> list[dict]:
    """The current code at several sizes: questions x ``--triples``, and ``--sweep-questions[0]`` x triples."""
    from rog_generator import RoGGenerator, write

    sizes = [(q, args.triples) for q in args.sweep_questions]
    sizes += [(args.sweep_questions[0], t) for t in args.sweep_triples if t != args.triples]
    rows = []
    for q, t in sizes:
        data = args.work / f"records-q{q}-t{t}-s{args.seed}.jsonl"
        if not data.exists():
            write(RoGGenerator(seed=args.seed, triples=t), q, "train", data)
        cache = args.work / f"cache-current-{data.stem}"
        _child("current", ROOT, "warm", data, cache, None, warm=q)  # every stage runs on all q questions
        for stage in stages:
            row = {**_child("current", ROOT, stage, data, cache, None), "size_questions": q, "size_triples": t}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def slopes(rows: list[dict], triples: int, questions: int) -> str:
    """A Markdown table: per stage, seconds at each size and the least-squares slope of log(seconds) against
    log(questions) (at ``triples``) and against log(triples per question) (at ``questions``); 1 is linear growth."""
    import numpy as np

    def fit(pts: list[tuple[float, float]]) -> str:
        pts = [(x, y) for x, y in pts if y > 0]
        if len(pts) < 2:
            return "n/a"
        x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
        return f"{np.polyfit(x, y, 1)[0]:.2f}"

    ok = [r for r in rows if "error" not in r]
    qs = sorted({r["size_questions"] for r in ok if r["size_triples"] == triples})
    head = "| stage | " + " | ".join(f"{q} q" for q in qs) + " | slope vs questions | slope vs triples/question |"
    lines = [head, "|---|" + "---:|" * (len(qs) + 2)]
    for stage in dict.fromkeys(r["stage"] for r in ok):
        mine = [r for r in ok if r["stage"] == stage]
        by_q = {r["size_questions"]: r["seconds"] for r in mine if r["size_triples"] == triples}
        by_t = [(r["triples"] / r["questions"], r["seconds"]) for r in mine if r["size_questions"] == questions]
        cells = " | ".join(f"{by_q[q]:.1f} s" if q in by_q else "–" for q in qs)
        lines.append(f"| {stage} | {cells} | {fit(list(by_q.items()))} | {fit(by_t)} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, triples: int, questions: int) -> None:
    """Seconds per stage against questions (at ``triples``) and against triples per question (at ``questions``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, fixed, label in (
        (axes[0], "size_questions", ("size_triples", triples), "questions"),
        (axes[1], "size_triples", ("size_questions", questions), "triples per question (median)"),
    ):
        for stage in dict.fromkeys(r["stage"] for r in rows):
            pts = sorted((r[key], r["seconds"]) for r in rows if r["stage"] == stage and r[fixed[0]] == fixed[1]
                         and "error" not in r)  # fmt: skip
            if len(pts) > 1:
                ax.plot(*zip(*pts), marker="o", label=stage)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("seconds")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title(f"time vs questions ({triples} triples each); slope 1 = linear")
    axes[1].set_title(f"time vs graph size ({questions} questions)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, help="a RoG jsonl (default: generate --questions x --triples)")
    p.add_argument("--questions", type=int, default=300)
    p.add_argument("--triples", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    p.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    p.add_argument("--work", type=Path, default=Path("/tmp/kglightning-scale"))
    p.add_argument("--output", type=Path, help="write the rows as JSON here")
    p.add_argument("--sweep-questions", type=int, nargs="+", help="sweep sizes (current code only), with a plot")
    p.add_argument("--sweep-triples", type=int, nargs="+", default=[1000, 2000, 4000, 8000])
    p.add_argument("--plot", type=Path, default=Path("docs/img/bench_scale.png"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--limit", type=int, help=argparse.SUPPRESS)
    p.add_argument("--warm-questions", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(run_stage(args.child, args.data, args.cache, args.limit, args.warm_questions)))
        return
    if args.sweep_questions:
        rows = sweep(args, args.stages)
        plot(rows, args.plot, args.triples, args.sweep_questions[0])
        print(slopes(rows, args.triples, args.sweep_questions[0]))
        if args.output:
            args.output.write_text(json.dumps(rows, indent=1))
        print(f"plot: {args.plot}")
        return
    from rog_generator import RoGGenerator, write

    data = args.data
    if data is None:
        data = args.work / f"records-q{args.questions}-t{args.triples}-s{args.seed}.jsonl"
        if not data.exists():
            t = write(RoGGenerator(seed=args.seed, triples=args.triples), args.questions, "train", data)
            print(f"generated {data}: {args.questions} questions, {t} triples", flush=True)
    impls = [("current", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    rows = []
    for impl, src in impls:
        cache = args.work / f"cache-{impl}-{data.stem}"
        if any(s not in ("read", "index", "evidence") for s in args.stages):
            warm = _child(impl, src, "warm", data, cache, None)
            print(f"[{impl}] warm cache: {warm.get('strings')} strings in {warm.get('seconds')} s", flush=True)
        for stage in args.stages:
            if stage == "read":  # a first read (parse, write the store) and a second (the store), fresh processes
                shutil.rmtree(cache / "records", ignore_errors=True)
                for n in ("first", "second"):
                    row = {**_child(impl, src, stage, data, cache, None), "pass": n}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                continue
            row = _child(impl, src, stage, data, cache, STAGE_LIMITS.get(stage))
            if impl == "current" and row.get("compat"):
                print(f"WARNING: the {stage} stage of the current tree ran the older code path", file=sys.stderr)
            print(json.dumps(row), flush=True)
            rows.append(row)
    rows.sort(key=lambda r: (STAGES.index(r["stage"]), r.get("pass", ""), r["impl"]))
    print(f"\n{date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {data}\n")
    print(table(rows))
    if args.output:
        args.output.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
