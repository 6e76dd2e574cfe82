"""RoG records from a KGQA system's published predictions whose prompts list the reasoning paths it was given.

RoG and GNN-RAG write one jsonl line per question: ``id``, ``question``, ``prediction`` (the LLM's reply, one answer
per line), ``ground_truth`` (the gold answers) and ``input`` (the prompt), whose ``Reasoning Paths:`` block holds one
path per line, ``entity -> relation -> entity -> relation -> entity``. Those paths are the subgraph the LLM saw:
:func:`record_from_prompt` turns a line into a :class:`~kglightning.data.records.KGQARecord` whose ``graph`` is the
paths' triples, whose ``q_entity`` are the paths' first entities and whose ``prediction`` is the reply's lines, so
the detector (``DetectionDataModule``) can label and score every answer the LLM gave.

    kglightning import-predictions --input predictions.jsonl --output data/gnn_rag_webqsp
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.sources.loaders import write_records

log = logging.getLogger(__name__)

PATHS_HEADER = "Reasoning Paths:"
QUESTION_HEADER = "Question:"
ARROW = " -> "


@dataclass
class PromptStats:
    """Counts of an import: records, paths read, lines that were not a path, records whose prompt had no paths."""

    records: int = 0
    paths: int = 0
    malformed_paths: int = 0
    without_paths: int = 0
    malformed_examples: list[str] = field(default_factory=list)


def parse_reasoning_paths(prompt: str, stats: PromptStats | None = None) -> list[list[str]]:
    """The paths of a prompt's ``Reasoning Paths:`` block, each as ``[e0, r1, e1, r2, e2, ...]``.

    The block runs from the header to a line that starts with ``Question:`` (or the end); blank lines in it are skipped. A line that
    does not alternate entities and relations (an even number of ``" -> "``-separated parts, or fewer than 3, as
    when a name holds a line break) is skipped and counted in ``stats``.

    Example:
        >>> parse_reasoning_paths("Reasoning Paths:\\nJamaica -> lang.spoken -> Jamaican English\\n\\nQuestion:\\n...")
        [['Jamaica', 'lang.spoken', 'Jamaican English']]
    """
    start = prompt.find(PATHS_HEADER)
    if start < 0:
        return []
    out = []
    for line in prompt[start + len(PATHS_HEADER) :].split("\n")[1:]:  # [0]: the rest of the header's line
        if line.strip().startswith(QUESTION_HEADER):  # "Question:" alone, or with the question on its line
            break
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(ARROW)]
        if len(parts) < 3 or len(parts) % 2 == 0 or not all(parts):
            if stats is not None:
                stats.malformed_paths += 1
                if len(stats.malformed_examples) < 5:
                    stats.malformed_examples.append(line[:200])
            continue
        out.append(parts)
    if stats is not None:
        stats.paths += len(out)
    return out


def split_reply(reply: str | Sequence[str]) -> list[str]:
    """The answers of an LLM reply: its non-empty lines, stripped (a list is taken as already split)."""
    lines = reply.split("\n") if isinstance(reply, str) else list(reply)
    return [s.strip() for s in lines if isinstance(s, str) and s.strip()]


def record_from_prompt(row: dict[str, Any], *, source: str = "<record>", line: int | None = None,
                       stats: PromptStats | None = None) -> KGQARecord:  # fmt: skip
    """One predictions line (``id``, ``question``, ``prediction``, ``ground_truth``, ``input``) as a RoG record.

    Raises:
        RecordError: naming the source, the line and the field, when one is missing or of the wrong type.
    """

    def need(name: str, kind: type | tuple[type, ...]) -> Any:
        if name not in row:
            raise RecordError("is missing", source=source, line=line, field=name)
        if not isinstance(row[name], kind):
            raise RecordError(f"has type {type(row[name]).__name__}", source=source, line=line, field=name)
        return row[name]

    qid = need("id", (str, int))
    if isinstance(qid, bool):
        raise RecordError("has type bool", source=source, line=line, field="id")
    need("question", str)
    reply = need("prediction", (str, list))
    gold = need("ground_truth", (list, str))
    prompt = need("input", str)
    bad = [g for g in ([gold] if isinstance(gold, str) else gold) if not isinstance(g, str)]
    if bad:
        raise RecordError(f"holds {bad[0]!r} ({type(bad[0]).__name__}), expected strings", source=source, line=line,
                          field="ground_truth")  # fmt: skip
    paths = parse_reasoning_paths(prompt, stats)
    triples = list(dict.fromkeys((p[i], p[i + 1], p[i + 2]) for p in paths for i in range(0, len(p) - 2, 2)))
    nodes = {n for h, _, t in triples for n in (h, t)}
    gold_list = [gold] if isinstance(gold, str) else list(gold)
    if stats is not None:
        stats.records += 1
        stats.without_paths += not triples
    return KGQARecord(
        id=str(row["id"]),
        question=row["question"],
        answer=gold_list,
        q_entity=list(dict.fromkeys(p[0] for p in paths)),
        a_entity=[g for g in gold_list if g in nodes],
        graph=triples,
        prediction=split_reply(reply),
        extra={"source": "reasoning paths of the prompt"},
    )


def read_prompt_predictions(path: str | Path, stats: PromptStats | None = None) -> list[KGQARecord]:
    """Every line of a RoG / GNN-RAG ``predictions.jsonl`` as a record (see :func:`record_from_prompt`)."""
    out: list[KGQARecord] = []
    first_line: dict[str, int] = {}
    with open(path, encoding="utf-8-sig") as f:  # a byte-order mark is not part of the first record
        i = 0
        try:
            for i, text in enumerate(f, 1):
                if not text.strip():
                    continue
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as err:
                    raise RecordError(f"is not JSON ({err.msg})", source=str(path), line=i) from None
                if not isinstance(row, dict):
                    raise RecordError("is not a JSON object", source=str(path), line=i)
                record = record_from_prompt(row, source=str(path), line=i, stats=stats)
                if record.id in first_line:
                    raise RecordError(f"repeats id {record.id!r} of line {first_line[record.id]}", source=str(path),
                                      line=i, field="id")  # fmt: skip
                first_line[record.id] = i
                out.append(record)
        except UnicodeDecodeError as err:
            raise RecordError(f"is not UTF-8 ({err.reason})", source=str(path), line=i + 1) from None
    return out


def split_by_question(
    records: Sequence[KGQARecord], fractions: Sequence[float], seed: int
) -> dict[str, list[KGQARecord]]:
    """Train / validation / test by a seeded shuffle of the distinct question ids (each id in exactly one split)."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"fractions must be three non-negative numbers that sum to 1, got {list(fractions)}")
    ids = sorted({r.id for r in records})
    random.Random(seed).shuffle(ids)
    n_train = round(fractions[0] * len(ids))  # cumulative rounding: the three sizes add up to len(ids)
    n_val = round((fractions[0] + fractions[1]) * len(ids)) - n_train
    split_of = {q: "train" for q in ids[:n_train]}
    split_of |= {q: "validation" for q in ids[n_train : n_train + n_val]}
    split_of |= {q: "test" for q in ids[n_train + n_val :]}
    out: dict[str, list[KGQARecord]] = {"train": [], "validation": [], "test": []}
    for r in records:
        out[split_of[r.id]].append(r)
    return out


def main(argv: list[str] | None = None, prog: str = "import-predictions") -> int:
    p = argparse.ArgumentParser(
        prog=prog,
        description="RoG records with predictions (train/validation/test jsonl) from a RoG or GNN-RAG predictions "
        "jsonl whose prompts ('input') list the reasoning paths the LLM was given; the paths become each record's "
        "graph. Feed the folder to the detector: kglightning fit --config configs/detector_real.yaml "
        "--data.init_args.data_dir OUTPUT",
    )
    p.add_argument("--input", required=True, help="predictions jsonl (id, question, prediction, ground_truth, input)")
    p.add_argument("--output", required=True, help="folder for train.jsonl, validation.jsonl and test.jsonl")
    p.add_argument("--fractions", type=float, nargs=3, default=[0.6, 0.2, 0.2], metavar=("TRAIN", "VAL", "TEST"))
    p.add_argument("--seed", type=int, default=0, help="seed of the split by question")
    args = p.parse_args(argv)
    stats = PromptStats()
    records = read_prompt_predictions(args.input, stats)
    splits = split_by_question(records, args.fractions, args.seed)
    out = Path(args.output)
    for name, rows in splits.items():
        write_records(rows, out / f"{name}.jsonl")
    sizes = ", ".join(f"{k} {len(v)}" for k, v in splits.items())
    print(
        f"wrote {out}: {sizes} questions; {stats.paths} paths, {stats.malformed_paths} lines that were not a path "
        f"(skipped{', e.g. ' + repr(stats.malformed_examples[0]) if stats.malformed_examples else ''}), "
        f"{stats.without_paths} questions with no path (their answers are all ungrounded)"
    )
    return 0
