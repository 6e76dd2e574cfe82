"""``kglightning build-subgraphs``: RoG records with G-Retriever PCST subgraphs, from a user's KG and questions.

Example::

    kglightning build-subgraphs --kg triples.tsv --questions train=q_train.jsonl --questions test=q_test.jsonl \\
        --out data/my_kgqa
    kglightning fit --config configs/detector.yaml --data.init_args.data_dir data/my_kgqa

``--kg embedded`` takes the embedded benchmark's whole KG, and with it ``--questions`` may be left out: the
benchmark's three splits are re-cut with PCST. Each split is written to ``OUT/<split>.jsonl`` with the subgraph
statistics (KG-Guard's Table 13 and the answer recall of its Table 15) in ``OUT/subgraph_stats.json`` and a
per-question time and size list in ``OUT/<split>.times.jsonl``.

On several cores and machines (:mod:`~kglightning.retrieval.prepare`; from the same starting embedding cache, the
records do not depend on either)::

    kglightning build-subgraphs ... --workers 8                # one machine, 8 processes
    kglightning build-subgraphs ... --shard 2/4 --workers 8    # the third of 4 machines (0/4 ... 3/4)
    kglightning build-subgraphs --merge data/my_kgqa           # the 4 machines' files gathered in one folder
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from kglightning.data.embeddings import SentenceEncoder
from kglightning.data.kg import KGIndex
from kglightning.data.sources.loaders import read_questions, write_records
from kglightning.data.sources.triples import load_kg
from kglightning.data.splits import locate_splits
from kglightning.data.store.stage_map import parse_shard, shard_bounds, shard_suffix
from kglightning.fileio import OutputOverInputError, atomic_write, check_outputs_apart
from kglightning.retrieval.pcst import PCSTRetriever, SubgraphStats
from kglightning.retrieval.prepare import (
    cut_records,
    embed_texts,
    merge_shards,
    needed_texts,
    rows_key,
    settings,
    write_stats,
)

__all__ = ["build_subgraphs", "embedded_kg", "main"]

log = logging.getLogger(__name__)


def embedded_kg() -> KGIndex:
    from kglightning.data.sources.embedded import build_knowledge_graph

    kg = build_knowledge_graph()
    return KGIndex.from_triples([kg.triple(i) for i in range(kg.num_triples)])


def _question_files(specs: list[str] | None, kg_arg: str, parser: argparse.ArgumentParser) -> dict[str, str]:
    if not specs:
        if kg_arg != "embedded":
            parser.error("--questions is required (unless --kg embedded)")
        return {s: path for s, (path, _) in locate_splits(None).items()}
    files: dict[str, str] = {}
    for spec in specs:
        split, sep, path = spec.partition("=")
        if not sep:
            split, path = "test", spec
        if not split or not path or split in files:
            parser.error(f"--questions {spec!r}: expected FILE or SPLIT=FILE, each split once")
        files[split] = path
    return files


def build_subgraphs(
    kg: KGIndex,
    questions: dict[str, str],
    out_dir: str | Path,
    retriever: PCSTRetriever,
    limit: int | None = None,
    workers: int = 1,
    shard: tuple[int, int] | None = None,
    embed_only: bool = False,
) -> dict[str, dict]:
    """Cut a PCST subgraph for every question of every split and write the records; returns the stats per split.

    The embeddings of every split are encoded first, in fixed blocks, then the cuts run over ``workers``
    processes, cached and resumable; ``shard=(i, N)`` cuts part ``i`` of ``N`` of each split
    (``<split>.shard-i-of-N.jsonl``, merged by :func:`merge_shards`) and ``embed_only`` stops after the embeddings
    (with ``shard``: its share of them). See :mod:`~kglightning.retrieval.prepare`.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stats: dict[str, dict] = {}
    raw: dict[str, SubgraphStats] = {}
    suffix = "" if shard is None else f".{shard_suffix(*shard)}"
    # a graph already there (e.g. the embedded benchmark) is ignored
    splits = {split: read_questions(path, limit=limit) for split, path in questions.items()}
    # the blocks of phase 1 over every split's strings at once: the same blocks on every machine and for any order
    texts = needed_texts(retriever, [r for records in splits.values() for r in records], kg)
    new = embed_texts(retriever, texts, shard=shard if embed_only else None, progress=retriever.show_progress)
    log.info("%d strings to embed, %d of them new", len(texts), new)
    if embed_only:
        return stats
    key = rows_key(retriever, texts)
    for split, records in splits.items():
        path = questions[split]
        cuts, s = cut_records(retriever, records, kg, workers, desc=f"PCST {split}", key=key, shard=shard)
        out = [r for r in cuts if r is not None]
        write_records(out, out_dir / f"{split}{suffix}.jsonl")
        with atomic_write(out_dir / f"{split}{suffix}.times.jsonl") as f:
            for rec, sec, n, t in zip(out, s.seconds, s.nodes, s.triples, strict=True):
                f.write(json.dumps({"id": rec.id, "seconds": round(sec, 5), "nodes": n, "triples": t}) + "\n")
        stats[split], raw[split] = {"questions_file": str(path), **s.summary()}, s
        if shard is not None:  # the rows of the split this part holds: merge_shards checks that the parts tile it
            stats[split]["part"] = [*shard_bounds(len(records), *shard), len(records)]
    used = {**settings(retriever), "limit": limit}
    write_stats(out_dir / f"subgraph_stats{suffix}.json", used, stats, raw if shard is not None else None)
    return stats


def stats_table(stats: dict[str, dict]) -> str:
    """A Markdown table of the per-split statistics (Table 13 columns plus answer recall and time)."""
    rows = ["| split | questions | avg nodes | max nodes | avg triples | max triples | answer in graph | s/question | "
            "skipped (no topic) |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for split, s in stats.items():
        rows.append(
            f"| {split} | {s['questions']} | {s['avg_nodes']:.1f} | {s['max_nodes']} | {s['avg_triples']:.1f} | "
            f"{s['max_triples']} | {s['answer_in_graph_pct']:.1f}% | {s['seconds_per_question']:.3f} | "
            f"{s['missing_topic']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None, prog: str = "kglightning build-subgraphs") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--kg", help="triples file (.tsv/.txt: head<TAB>relation<TAB>tail; .parquet) or "
                   "'embedded' (the embedded benchmark's KG)")  # fmt: skip
    p.add_argument("--questions", action="append", metavar="[SPLIT=]FILE",
                   help="questions (.jsonl/.json/.parquet: id, question, q_entity, optional answer/a_entity); "
                   "repeat per split; a FILE alone is the test split")  # fmt: skip
    p.add_argument("--out", help="output folder (RoG records per split, subgraph_stats.json)")
    p.add_argument("--hops", type=int, default=2, help="neighbourhood radius around the topic entities")
    p.add_argument("--topk", type=int, default=3, help="nodes with a prize (G-Retriever: 3)")
    p.add_argument("--topk-e", type=int, default=5, help="edge scores with a prize (G-Retriever WebQSP: 5)")
    p.add_argument("--cost-e", type=float, default=0.5, help="edge cost (G-Retriever: 0.5)")
    p.add_argument("--max-degree", type=int, default=1000, help="hubs with more edges are not expanded")
    p.add_argument("--max-nodes", type=int, default=20000, help="bound on a neighbourhood's nodes")
    p.add_argument("--on-missing-topic", choices=["skip", "error"], default="skip",
                   help="a question none of whose topic entities is in the KG: skip it (counted) or stop")  # fmt: skip
    p.add_argument("--encoder", default=None, help="a sentence-transformers folder (default: bundled MiniLM)")
    p.add_argument("--limit", type=int, default=None, help="at most this many questions per split")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the cached KG index")
    p.add_argument("--workers", type=int, default=1,
                   help="processes that cut subgraphs (the output does not depend on it)")  # fmt: skip
    p.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                   help="cut only part I (from 0) of N of each split, into SPLIT.shard-I-of-N.jsonl; --merge joins "
                   "the parts into the file one run writes")  # fmt: skip
    p.add_argument("--embed-only", action="store_true",
                   help="only encode the embeddings (with --shard: its share of them), e.g. before the cuts on "
                   "several machines that then share one cache folder")  # fmt: skip
    p.add_argument("--merge", metavar="OUT",
                   help="join the --shard I/N outputs in folder OUT into the files of one run, and stop")  # fmt: skip
    args = p.parse_args(argv)
    if args.merge:
        try:
            stats = merge_shards(args.merge)
        except ValueError as err:
            p.error(str(err))
        print(stats_table(stats))
        print(f"merged the shards of {', '.join(stats)} in {args.merge}")
        return 0
    missing = [f"--{name}" for name in ("kg", "out") if getattr(args, name) is None]
    if missing:
        p.error(f"the following arguments are required: {', '.join(missing)}")
    if args.workers < 1:
        p.error(f"--workers must be at least 1, got {args.workers}")
    questions = _question_files(args.questions, args.kg, p)
    suffix = "" if args.shard is None else f".{shard_suffix(*args.shard)}"
    out = Path(args.out)
    written = [out / f"{s}{suffix}{kind}" for s in questions for kind in (".jsonl", ".times.jsonl")]
    written.append(out / f"subgraph_stats{suffix}.json")
    try:  # before anything is read or written: no output replaces a questions file or the KG
        check_outputs_apart(written, [*questions.values(), None if args.kg == "embedded" else args.kg])
    except OutputOverInputError as err:
        p.error(str(err))
    kg = embedded_kg() if args.kg == "embedded" else load_kg(args.kg, use_cache=not args.no_cache)
    print(f"KG {args.kg}: {kg}")
    encoder = SentenceEncoder(args.encoder) if args.encoder else SentenceEncoder()
    retriever = PCSTRetriever(encoder, hops=args.hops, topk=args.topk, topk_e=args.topk_e, cost_e=args.cost_e,
                              max_degree=args.max_degree, max_nodes=args.max_nodes,
                              on_missing_topic=args.on_missing_topic)  # fmt: skip
    stats = build_subgraphs(kg, questions, args.out, retriever, limit=args.limit, workers=args.workers,
                            shard=args.shard, embed_only=args.embed_only)  # fmt: skip
    if args.embed_only:
        print(f"embeddings of {', '.join(questions)} encoded into {retriever.embeddings.folder}")
        return 0
    print(stats_table(stats))
    print(f"wrote {', '.join(f'{s}{suffix}.jsonl' for s in stats)} and subgraph_stats{suffix}.json to {args.out}")
    return 0


def _shard(spec: str) -> tuple[int, int]:
    try:
        return parse_shard(spec)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
