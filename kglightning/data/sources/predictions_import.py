"""``kglightning import-predictions``: RoG records with a KGQA system's answers, from the files such systems write.

Three input formats, detected per file from all its lines (``--format auto``: a line whose ``input`` holds a
``Reasoning Paths:`` block makes the file ``prompt``, else a line with a GCR beam makes it ``gcr``, else ``plain``),
or named with ``--format``:

* ``prompt``: RoG / GNN-RAG (:mod:`~kglightning.data.sources.prompt_predictions`), a reply with one answer per line
  and the prompt as ``input``, whose ``Reasoning Paths:`` block lists the paths the LLM was given;
* ``gcr``: GCR (:mod:`~kglightning.data.sources.gcr_predictions`), a list of beams ``# Reasoning Path: ...
  # Answer: ...``; each beam's answer is an entry of ``prediction`` and its path the entry of ``prediction_paths``;
* ``plain``: any line with ``id`` and ``prediction`` (a string with one answer per line, or a list of strings).

On its own a ``prompt`` or ``gcr`` line is a record whose graph is the paths it lists (the prompt's, or those the
beams cite). With ``--records DIR`` every line is instead joined by ``id`` onto a RoG records folder: the question's
graph, ``q_entity``, ``answer`` and ``a_entity`` come from its record (the question's full subgraph, KG-Guard's
setting), the answers (and GCR's cited paths) from the line. Records stay in the split they came from unless
``--resplit``; without ``--records`` the questions are split by a seeded shuffle (:func:`split_by_question`).

Every record is validated before anything is written, and the three split files are written whole or not at all
(temporary files renamed once all three are written): a failed import leaves the output folder as it was. The
output's split files may not be an input file or lie inside ``--records`` (refused before anything is read), an
input file with no line is an error, and an import never empties a non-empty split file of the output folder
(:func:`refuse_emptying`).

    kglightning import-predictions --input predictions.jsonl --output data/gnn_rag_webqsp
    kglightning import-predictions --input gcr/predictions.jsonl --records data/RoG-webqsp --output data/gcr_webqsp
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import stat
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.sources.gcr_predictions import gcr_answers, is_gcr_row, record_from_gcr
from kglightning.data.sources.loaders import read_records
from kglightning.data.sources.prediction_lines import (
    ImportStats,
    field_of,
    question_id,
    read_json_objects,
    split_reply,
    validated,
)
from kglightning.data.sources.prompt_predictions import is_prompt_row, record_from_prompt
from kglightning.data.splits import SPLITS, locate_splits
from kglightning.data.store.owned_files import create_new
from kglightning.data.store.temporaries import writer_temporary
from kglightning.fileio import check_outputs_apart
from kglightning.help_format import DefaultsHelpFormatter

log = logging.getLogger(__name__)

__all__ = [
    "FORMATS",
    "detect_format",
    "import_predictions",
    "main",
    "refuse_emptying",
    "split_by_question",
    "write_splits",
]

FORMATS = ("auto", "prompt", "gcr", "plain")
Format = Literal["auto", "prompt", "gcr", "plain"]
#: where a record came from: (input file, line), for the messages of errors found after it was built
Origin = dict[str, tuple[str, int]]


def detect_format(rows: Sequence[tuple[int, dict[str, Any]]]) -> str:
    """The format of a file's lines: ``prompt`` when a line's ``input`` holds a ``Reasoning Paths:`` block, else
    ``gcr`` when any line's ``prediction`` holds a GCR beam (``# Answer:``; a first question whose beams were all cut
    short does not make the file plain), else ``plain``."""
    if any(is_prompt_row(row) for _, row in rows):
        return "prompt"
    if any(is_gcr_row(row) for _, row in rows):
        return "gcr"
    return "plain"


def split_by_question(
    records: Sequence[KGQARecord], fractions: Sequence[float], seed: int
) -> dict[str, list[KGQARecord]]:
    """Train / validation / test by a seeded shuffle of the distinct question ids (each id in exactly one split)."""
    if len(fractions) != 3 or not all(0 <= f <= 1 for f in fractions) or not abs(sum(fractions) - 1) <= 1e-6:
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


def _read_lines(paths: Sequence[str], fmt: Format, stats: ImportStats) -> list[tuple[str, int, str, dict, str]]:
    """``(source, line, id, row, format)`` of every line of every input; a repeated id is an error naming both."""
    out = []
    first: dict[str, tuple[str, int]] = {}
    for path in paths:
        source = str(path)
        rows = list(read_json_objects(path, stats))
        if not rows:  # an empty file must never replace an earlier import with empty splits
            raise RecordError("holds no prediction line (it is empty, or blank lines only): nothing to import",
                              source=source)  # fmt: skip
        file_fmt = detect_format(rows) if fmt == "auto" else fmt
        stats.formats[source] = file_fmt
        for line, row in rows:
            qid = question_id(row, source=source, line=line)
            if qid in first:
                where = first[qid][1] if first[qid][0] == source else f"{first[qid][0]}:{first[qid][1]}"
                raise RecordError(f"repeats id {qid!r} of line {where}", source=source, line=line, field="id")
            first[qid] = (source, line)
            out.append((source, line, qid, row, file_fmt))
    return out


def _answers(row: dict, fmt: str, source: str, line: int, stats: ImportStats) -> tuple[list[str], Any]:
    """A line's ``(prediction, prediction_paths)`` for a join (no graph is built from the line)."""
    reply = field_of(row, "prediction", (str, list), source=source, line=line)
    if fmt == "gcr":
        return gcr_answers(reply, stats)
    answers = split_reply(reply, stats)
    stats.answers += len(answers)
    return answers, None


def _read_folder(folder: str, stats: ImportStats) -> tuple[dict[str, list[KGQARecord]], dict[str, str]]:
    """The records of each split of a RoG records folder, and the split of each id (an id in two splits is an error)."""
    splits: dict[str, list[KGQARecord]] = {}
    split_of: dict[str, str] = {}
    for name, (path, split) in locate_splits(folder).items():
        records = read_records(path, split=split)
        stats.records_read += len(records)
        for r in records:
            if r.id in split_of:
                raise RecordError(f"id {r.id!r} is in split {split_of[r.id]!r} too", source=records.source,
                                  field="id")  # fmt: skip
            split_of[r.id] = name
        splits[name] = records
    return splits, split_of


def import_predictions(
    inputs: Sequence[str],
    *,
    records: str | None = None,
    fmt: Format = "auto",
    resplit: bool = False,
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    seed: int = 0,
    on_missing: Literal["error", "skip"] = "error",
    stats: ImportStats | None = None,
) -> tuple[dict[str, list[KGQARecord]], Origin]:
    """The validated records of an import, by split, and the input line each came from (see the module docstring).

    Raises:
        RecordError: naming the file, the line and the field: a line that cannot be read, a bad field, a repeated
            id, a record that would not be read back, a line whose id is in no record (``on_missing="error"``), or
            a ``plain`` file without ``records``.
    """
    stats = ImportStats() if stats is None else stats
    lines = _read_lines(inputs, fmt, stats)
    origin: Origin = {qid: (source, line) for source, line, qid, _, _ in lines}
    if records is None:
        built = []
        for source, line, _, row, file_fmt in lines:
            if file_fmt == "plain":
                raise RecordError("is a plain predictions file (no paths to build a graph from): give --records DIR "
                                  "to join its lines onto their questions' records", source=source)  # fmt: skip
            build = record_from_prompt if file_fmt == "prompt" else record_from_gcr
            built.append(build(row, source=source, line=line, stats=stats))
        return split_by_question(built, fractions, seed), origin
    folder, split_of = _read_folder(records, stats)
    answers: dict[str, tuple[list[str], Any]] = {}
    for source, line, qid, row, file_fmt in lines:
        if qid not in split_of:
            if on_missing == "skip":
                stats.unknown_ids += 1
                continue
            raise RecordError(f"id {qid!r} is in no record of {records} (--on-missing skip leaves such lines out)",
                              source=source, line=line, field="id")  # fmt: skip
        answers[qid] = _answers(row, file_fmt, source, line, stats)
    out: dict[str, list[KGQARecord]] = {name: [] for name in SPLITS}
    for name, recs in folder.items():
        for r in recs:
            if r.id not in answers:
                stats.records_without_prediction += 1
                continue
            prediction, paths = answers[r.id]
            joined = replace(r, prediction=prediction, confidence=None, prediction_paths=paths)
            source, line = origin[r.id]
            validated(replace(joined, graph=[]), source=source, line=line)  # the graph was checked when read
            out[name].append(joined)
    if resplit:
        out = split_by_question([r for name in SPLITS for r in out[name]], fractions, seed)
    return out, origin


def _encoded(record: KGQARecord, origin: Origin) -> bytes:
    data = record.to_dict()
    try:
        return (json.dumps(data, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate ("\ud800" in the input's JSON)
        bad = next((k for k, v in data.items() if not _encodes(v)), None)
        source, line = origin.get(record.id, ("<records>", None))
        raise RecordError(f"holds text that cannot be written as UTF-8 ({err.reason}: {err.object[err.start:err.end]!r})",
                          source=source, line=line, field=bad) from None  # fmt: skip
    except (TypeError, ValueError) as err:  # a value JSON has no form for (a parquet timestamp, bytes, a Decimal)
        bad = next((k for k, v in data.items() if not _encodes(v)), None)
        source, line = origin.get(record.id, ("<records>", None))
        raise RecordError(f"of record {record.id!r} holds a value JSON cannot write ({err})", source=source, line=line,
                          field=bad) from None  # fmt: skip


def _encodes(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, TypeError, ValueError):
        return False
    return True


def write_splits(splits: dict[str, list[KGQARecord]], out: str | Path, origin: Origin | None = None) -> None:
    """Write ``<split>.jsonl`` for every split into ``out``, all or none.

    Every record is encoded first (so a record that cannot be written fails before any file is touched); each file is
    then written and synced under a temporary name; only when all are written are the old files moved aside, the new
    ones renamed into place and the old ones deleted, the new ones keeping the old ones' file modes. A failure at any
    step puts the old files back and removes the temporary ones (and a folder this call created). A process killed
    between the renames can leave a mix; the next import into the folder removes its temporary files (its own names
    only, once their process is gone) and names the
    old splits it kept as ``.<split>.jsonl.<tag>.old`` in a WARNING.

    Raises:
        RecordError: a record holds text that cannot be encoded as UTF-8 (naming its input file, line and field).
    """
    out = Path(out)
    for name in splits:  # a split file an import did not write (no matching mark beside it) is a user's
        target = out / f"{name}.jsonl"
        if os.path.lexists(target) and not _written_by_an_import(target):
            raise FileExistsError(f"{target} exists and is not a file that an import wrote (no {IMPORT_MARK} mark "
                                  "beside it that matches its content): it is never replaced; move it away, or import "
                                  "into another folder")  # fmt: skip
    encoded = {name: b"".join(_encoded(r, origin or {}) for r in rows) for name, rows in splits.items()}
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    _warn_backups(out, list(encoded))
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    # .<split>.jsonl.kgl-<host>.<pid>.tmp, after removing those that killed imports left (and nothing else)
    temps = {name: writer_temporary(out / f"{name}.jsonl", "an import of predictions") for name in encoded}
    backups = {name: out / f".{name}.jsonl.{tag}.old" for name in encoded}
    moved: list[str] = []  # old files moved aside
    placed: list[str] = []  # new files renamed into place
    try:
        for name, data in encoded.items():
            with os.fdopen(create_new(temps[name], 0o666), "wb") as f:  # 0666 less the umask, as open() makes
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        for name in encoded:
            if (out / f"{name}.jsonl").exists():
                shutil.copymode(out / f"{name}.jsonl", temps[name])  # the new file keeps the old one's mode
                os.replace(out / f"{name}.jsonl", backups[name])
                moved.append(name)
        for name in encoded:
            os.replace(temps[name], out / f"{name}.jsonl")
            placed.append(name)
    except BaseException:
        for name in placed:
            with contextlib.suppress(OSError):
                os.unlink(out / f"{name}.jsonl")
        for name in moved:
            with contextlib.suppress(OSError):
                os.replace(backups[name], out / f"{name}.jsonl")
        for path in temps.values():
            with contextlib.suppress(OSError):
                os.unlink(path)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if empty
        raise
    for name in moved:
        with contextlib.suppress(OSError):
            os.unlink(backups[name])
    for name, data in encoded.items():  # after the renames: a file is marked only once it is in place
        _mark_written(out / f"{name}.jsonl", data)
    with contextlib.suppress(OSError):  # the renames themselves survive a crash once the folder is synced
        fd = os.open(out, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: the mark an import leaves beside each split file it writes: ``.<split>.jsonl`` + this, holding the file's digest
IMPORT_MARK = ".kglightning-import"


def _mark_of(target: Path) -> Path:
    return target.with_name(f".{target.name}{IMPORT_MARK}")


def _mark_written(target: Path, data: bytes) -> None:
    """Leave the mark that says an import wrote ``target`` with these bytes (its size and SHA-256); one that cannot
    be written only means the next import refuses to replace the file (a WARNING says so)."""
    mark = _mark_of(target)
    text = json.dumps({"size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    try:
        if os.path.lexists(mark):  # only a mark of this user that is a regular file is replaced, never written through
            st = mark.lstat()
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                raise OSError(f"{mark} is not a regular file of this user")
            mark.unlink()
        with os.fdopen(create_new(mark, 0o644), "w", encoding="utf-8") as f:  # O_EXCL | O_NOFOLLOW
            f.write(text)
    except OSError as err:
        log.warning("%s cannot be marked as an import's (%s): the next import into %s will not replace it",
                    target, err, target.parent)  # fmt: skip


def _written_by_an_import(target: Path) -> bool:
    """Whether ``target`` is a regular file whose mark (this user's regular file) holds its size and SHA-256: a file
    replaced, edited or put there after the import, or a mark left from an earlier file, does not match."""
    mark = _mark_of(target)
    try:
        st, ms = target.lstat(), mark.lstat()
        if not stat.S_ISREG(st.st_mode) or not stat.S_ISREG(ms.st_mode) or ms.st_uid != os.getuid():
            return False
        if ms.st_size > 4096:
            return False
        recorded = json.loads(mark.read_text(encoding="utf-8"))
        if not isinstance(recorded, dict) or recorded.get("size") != st.st_size:
            return False
        with open(target, "rb") as f:
            return recorded.get("sha256") == hashlib.file_digest(f, "sha256").hexdigest()
    except (OSError, ValueError):
        return False


def _warn_backups(out: Path, names: list[str]) -> None:
    """Backups of older splits (``.old``) that a killed earlier import left in ``out`` are kept and named in a
    WARNING, as they may be the only copy of a split it replaced. (Its temporary files, named by
    :func:`~kglightning.data.store.temporaries.temporary_name`, are removed by
    :func:`~kglightning.data.store.temporaries.writer_temporary` once no process will finish them; any other
    ``.train.jsonl.<anything>.tmp``, a user's or one of the release before, is never touched.)"""
    for name in names:
        for path in out.glob(f".{name}.jsonl.*.old"):
            log.warning("%s: a backup left by an import that was killed while renaming; %s is the split it replaced",
                        path, out / f"{name}.jsonl")  # fmt: skip


def refuse_emptying(splits: dict[str, list[KGQARecord]], out: str | Path, inputs: Sequence[str]) -> None:
    """Refuse an import that would replace records with nothing: one that holds no record at all, or an empty split
    where ``out`` holds a non-empty file of that split (an earlier import's, say).

    Raises:
        RecordError: naming the inputs and, for a split, the file it would empty.
    """
    source = ", ".join(map(str, inputs))
    if not any(splits.values()):
        raise RecordError("gave no record to write (every line was skipped or joined no record): nothing written",
                          source=source)  # fmt: skip
    for name, rows in splits.items():
        old = Path(out) / f"{name}.jsonl"
        if not rows and old.is_file() and old.stat().st_size > 0:
            raise RecordError(f"holds no question of split {name!r}, and {old} is not empty: writing would empty it; "
                              "choose a new --output folder, or remove that file first", source=source)  # fmt: skip


def _summary(stats: ImportStats, splits: dict[str, list[KGQARecord]], out: Path, args: argparse.Namespace) -> str:
    sizes = ", ".join(f"{k} {len(v)}" for k, v in splits.items())
    how = (
        f"kept in the splits of {args.records}"
        if args.records is not None and not args.resplit
        else f"split by question, seed {args.seed}"
    )
    used = set(stats.formats.values())
    lines = [
        f"wrote {out}: {sizes} questions ({how})",
        "read " + ", ".join(f"{src} ({fmt})" for src, fmt in stats.formats.items()) + f": {stats.lines} lines",
        f"answers: {stats.answers} kept in order (repeats kept); dropped: {stats.non_string_items} non-string items "
        f"of a prediction list (numbers, null, objects), {stats.blank_items} blank items",
    ]
    if "prompt" in used and args.records is None:
        eg = f", e.g. {stats.malformed_examples[0]!r}" if stats.malformed_examples else ""
        lines.append(f"prompts: {stats.paths} paths, {stats.malformed_paths} lines that were not a path (skipped{eg})")
    if "gcr" in used:
        eg = f", e.g. {stats.unparsed_examples[0]!r}" if stats.unparsed_examples else ""
        lines.append(
            f"gcr: {stats.beams} beams, {stats.beams_without_answer} without an answer (skipped), "
            f"{stats.cited_paths} cited paths kept, {stats.unparsed_paths} paths that did not parse or were missing "
            f"(kept out of prediction_paths{eg})"
        )
    if args.records is None:
        lines.append(f"{stats.without_paths} questions with no path (their answers are all ungrounded)")
    else:
        lines.append(
            f"records: {stats.records_read} read from {args.records}, {stats.records_without_prediction} without a "
            f"prediction line (left out), {stats.unknown_ids} prediction lines whose id is in no record (skipped)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "import-predictions") -> int:
    p = argparse.ArgumentParser(
        formatter_class=DefaultsHelpFormatter,
        prog=prog,
        description="RoG records with predictions (train/validation/test jsonl) from a KGQA system's predictions "
        "jsonl: RoG / GNN-RAG (prompts listing reasoning paths), GCR (beams of reasoning path and answer) or any "
        "file of id and prediction joined onto a RoG records folder (--records). Feed the folder to the detector: "
        "kglightning fit --config configs/detector_real.yaml --data.init_args.data_dir OUTPUT",
    )
    p.add_argument("--input", required=True, nargs="+", metavar="FILE",
                   help="predictions jsonl file(s), one line per question (ids unique across the files)")  # fmt: skip
    p.add_argument("--output", required=True, help="folder for train.jsonl, validation.jsonl and test.jsonl")
    p.add_argument("--format", choices=FORMATS, default="auto",
                   help="input format; auto decides per file from all its lines: an 'input' with 'Reasoning Paths:' "
                   "makes it prompt, else a list of '# Answer:' beams gcr, else plain (which needs --records)")  # fmt: skip
    p.add_argument("--records", metavar="DIR", default=None,
                   help="RoG records folder (train/validation/test) to join the predictions onto by id: the graph, "
                   "q_entity, answer and a_entity come from the records, the answers from the input")  # fmt: skip
    p.add_argument("--resplit", action="store_true",
                   help="with --records: split the questions anew by --fractions/--seed instead of keeping each "
                   "record's split")  # fmt: skip
    p.add_argument("--on-missing", choices=("error", "skip"), default="error",
                   help="with --records: a prediction line whose id is in no record is an error (default) or is "
                   "skipped and counted")  # fmt: skip
    p.add_argument("--fractions", type=float, nargs=3, default=[0.6, 0.2, 0.2], metavar=("TRAIN", "VAL", "TEST"),
                   help="shares of the questions in each split, without --records or with --resplit (default: "
                   "0.6 0.2 0.2)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the split by question (default: 0)")
    args = p.parse_args(argv)
    f = args.fractions
    if not all(0 <= x <= 1 for x in f) or not abs(sum(f) - 1) <= 1e-6:  # NaN fails both
        p.error(f"--fractions must be three non-negative numbers that sum to 1, got {f}")
    # before anything is read or written: the output folder's split files are never an input, nor inside --records
    check_outputs_apart([Path(args.output) / f"{name}.jsonl" for name in SPLITS], [*args.input, args.records])
    stats = ImportStats()
    try:
        splits, origin = import_predictions(args.input, records=args.records, fmt=args.format, resplit=args.resplit,
                                            fractions=f, seed=args.seed, on_missing=args.on_missing,
                                            stats=stats)  # fmt: skip
    except OSError as e:  # --records hf:... with no network (requests' errors are OSErrors): one line
        if not str(args.records or "").startswith("hf:") or isinstance(e, FileNotFoundError):
            raise
        raise FileNotFoundError(f"--records {args.records}: cannot be fetched ({type(e).__name__}: {e})") from e
    out = Path(args.output)
    refuse_emptying(splits, out, args.input)
    write_splits(splits, out, origin)
    print(_summary(stats, splits, out, args))
    return 0
