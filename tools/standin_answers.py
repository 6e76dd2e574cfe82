"""Write the embedded benchmark's answers as a KGQA system's predictions file: a stand-in for a reader's own LLM
answers, so that the own-answers tutorial's steps can be timed at a realistic size on a machine that has none.

    python tools/standin_answers.py --output /tmp/predictions.jsonl
    python tools/record_run.py tutorial docs/tutorials/own-llm-answers.md \\
        --file predictions.jsonl=/tmp/predictions.jsonl --about "predictions.jsonl=..." ...

Every question of the embedded benchmark (all three splits), with the answers the main job's proposer gave it
(``configs/detector.yaml``'s data module, from the kglightning cache when it holds them), is written as one line of
GNN-RAG's ``predictions.jsonl``: ``id``, ``question``, ``prediction`` (the answers, one a line), ``ground_truth``
(the gold answers) and ``input``, a prompt whose reasoning paths are the question's graph, one triple a path. The
answers are a retrieval baseline's, not an LLM's: the file stands in for the size and shape of a reader's file, not
for what its LLM got wrong.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def gnn_rag_line(record) -> dict:
    """One record (a ``KGQARecord`` with ``prediction``) as a line of GNN-RAG's predictions file."""
    paths = "\n".join(" -> ".join(triple) for triple in record.graph)
    return {"id": record.id, "question": record.question, "prediction": "\n".join(record.prediction or []),
            "ground_truth": list(record.answer),
            "input": f"Reasoning Paths:\n{paths}\n\nQuestion:\n{record.question}"}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="the predictions file (JSON lines) to write")
    parser.add_argument("--config", default="configs/detector.yaml", help="the config whose data module proposes")
    args = parser.parse_args(argv)
    from kglightning.cli.trainer import configured
    from kglightning.data.splits import SPLITS

    cli = configured("predict", args=["--config", args.config])
    dm = cli.datamodule
    dm.prepare_data()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with args.output.open("w", encoding="utf-8") as out:
        for split in SPLITS:
            for record in dm.records(split):
                out.write(json.dumps(gnn_rag_line(record), ensure_ascii=False) + "\n")
                count += 1
    print(f"wrote {count} questions' answers to {args.output}")


if __name__ == "__main__":
    main()
