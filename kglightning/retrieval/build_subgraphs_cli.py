"""The command line of ``kglightning build-subgraphs`` (:mod:`~kglightning.retrieval.build_subgraphs`): the
arguments are read before the KG, the encoder and torch are imported, so ``--help`` starts at once."""

from __future__ import annotations

import argparse
from pathlib import Path

from kglightning.fileio import OutputOverInputError, check_outputs_apart
from kglightning.help_format import DefaultsHelpFormatter

DESCRIPTION = "RoG records with G-Retriever PCST subgraphs, from a user's KG and questions."


def _question_files(specs: list[str] | None, kg_arg: str, parser: argparse.ArgumentParser) -> dict[str, str]:
    from kglightning.data.splits import locate_splits

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
    p = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter, prog=prog, description=DESCRIPTION)
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
    from kglightning.data.embeddings import SentenceEncoder
    from kglightning.data.sources.triples import load_kg
    from kglightning.data.store.stage_map import shard_suffix
    from kglightning.retrieval.build_subgraphs import build_subgraphs, embedded_kg
    from kglightning.retrieval.pcst import PCSTRetriever
    from kglightning.retrieval.prepare import merge_shards

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
    from kglightning.data.store.stage_map import parse_shard

    try:
        return parse_shard(spec)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
