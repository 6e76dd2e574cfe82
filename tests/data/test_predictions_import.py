"""kglightning import-predictions end to end: GCR beams, joins onto a records folder, and the defects a review found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from kglightning.cli import main as cli_main
from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.sources import read_records, write_records
from kglightning.data.sources.predictions_import import detect_format, import_predictions, split_by_question
from kglightning.data.sources.prompt_predictions import record_from_prompt
from kglightning.data.store.temporaries import temporary_name

PROMPT = "Reasoning Paths:\nJamaica -> language.spoken -> Jamaican English\n\nQuestion:\nwhat do they speak?"


def gcr_beam(path: str, answer: str) -> str:
    return f"# Reasoning Path:\n{path}\n# Answer:\n{answer}"


def prompt_row(i: int, **over) -> dict:
    row = {"id": f"q{i}", "question": f"question {i}?", "prediction": "Jamaican English\nPatois",
           "ground_truth": ["Jamaican English"], "input": PROMPT}  # fmt: skip
    return {**row, **over}


def write_lines(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli_main(["import-predictions", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def folder_state(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.exists() else {}


GCR_ROWS = [
    {"id": "WebQTest-0", "question": "what does jamaican people speak", "ground_truth": ["Jamaican English"],
     "prediction": [gcr_beam("Jamaica -> location.country.languages_spoken -> Jamaican English", "Jamaican English"),
                    gcr_beam("Jamaica -> location.country.languages_spoken -> Jamaican English", "Jamaican English"),
                    gcr_beam("Jamaica -> location.country.official_language", "Patois")]},  # a path that does not parse
    {"id": "WebQTest-1", "question": "what did james k polk do", "ground_truth": ["Governor"],
     "prediction": [gcr_beam("James K. Polk -> people.person.profession -> Lawyer", "Lawyer"),
                    gcr_beam("James K. Polk -> people.person.profession -> Lawyer", "Lawyer"),
                    gcr_beam("James K. Polk -> gov.position -> m.04j60kc -> gov.title -> Governor", "Governor")],
     "label": "kept out"},
    {"id": "WebQTest-2", "question": "where is the eiffel tower", "ground_truth": ["Paris"],
     "prediction": [gcr_beam("Eiffel Tower -> location.containedby -> Paris", "Paris"),
                    "# Reasoning Path:\nEiffel Tower -> location.containedby -> France"]},  # no answer: skipped
]  # fmt: skip


def test_gcr_beams_become_answers_with_the_paths_they_cite(tmp_path, capsys):
    src = write_lines(tmp_path / "gcr.jsonl", GCR_ROWS)
    out = tmp_path / "gcr_records"
    code, text, _ = run(capsys, "--input", src, "--output", out, "--fractions", 0.34, 0.33, 0.33)
    assert code == 0
    got = {r.id: r for name in ("train", "validation", "test") for r in read_records(str(out / f"{name}.jsonl"))}
    assert sorted(got) == ["WebQTest-0", "WebQTest-1", "WebQTest-2"]
    lang = ["Jamaica", "location.country.languages_spoken", "Jamaican English"]
    q0 = got["WebQTest-0"]
    assert q0.prediction == ["Jamaican English", "Jamaican English", "Patois"]  # repeats are votes: kept
    assert q0.prediction_paths == [[lang], [lang], []]
    assert q0.graph == [tuple(lang)] and q0.q_entity == ["Jamaica"] and q0.a_entity == ["Jamaican English"]
    q1 = got["WebQTest-1"]
    assert len(q1.graph) == 3 and q1.a_entity == ["Governor"] and q1.q_entity == ["James K. Polk"]
    assert q1.extra == {"source": "reasoning paths GCR wrote"}
    assert got["WebQTest-2"].prediction == ["Paris"] and len(got["WebQTest-2"].prediction_paths) == 1
    assert "(gcr): 3 lines" in text and "answers: 7 kept in order" in text
    assert "gcr: 8 beams, 1 without an answer (skipped), 6 cited paths kept, 1 paths that did not parse" in text
    assert "'Jamaica -> location.country.official_language'" in text


def _records_folder(tmp_path):
    folder = tmp_path / "rog"
    rows = {
        "train": [("WebQTrn-0", "Jamaica", "Jamaican English"), ("WebQTrn-1", "France", "Paris")],
        "validation": [("WebQTrn-2", "Peru", "Lima")],
        "test": [("WebQTest-0", "Jamaica", "Jamaican English"), ("WebQTest-1", "James K. Polk", "Governor")],
    }
    for split, recs in rows.items():
        write_records([{"id": i, "question": f"about {q}?", "answer": [a], "q_entity": [q], "a_entity": [a],
                        "graph": [[q, "r", a], [q, "s", "m.0x"], ["m.0x", "t", a]], "note": split}
                       for i, q, a in recs], folder / f"{split}.jsonl")  # fmt: skip
    return folder


def test_plain_predictions_join_onto_a_records_folder(tmp_path, capsys):
    folder = _records_folder(tmp_path)
    src = write_lines(tmp_path / "plain.jsonl", [
        {"id": "WebQTest-1", "prediction": "Governor\nLawyer\nGovernor"},
        {"id": "WebQTrn-0", "prediction": ["Jamaican English", 3, None, "Patois"], "question": "ignored"},
        {"id": "WebQTrn-2", "prediction": []},
    ])  # fmt: skip
    out = tmp_path / "joined"
    code, text, _ = run(capsys, "--input", src, "--records", folder, "--output", out)
    assert code == 0
    train, val, test = (read_records(str(out / f"{s}.jsonl")) for s in ("train", "validation", "test"))
    assert [r.id for r in train] == ["WebQTrn-0"] and [r.id for r in val] == ["WebQTrn-2"]
    assert [r.id for r in test] == ["WebQTest-1"]  # kept in the split it came from
    source = {r.id: r for r in read_records(str(folder / "train.jsonl"))}["WebQTrn-0"]
    assert (train[0].question, train[0].graph, train[0].q_entity, train[0].a_entity, train[0].extra) == (
        source.question, source.graph, source.q_entity, source.a_entity, {"note": "train"}
    )  # fmt: skip
    assert train[0].prediction == ["Jamaican English", "Patois"] and train[0].prediction_paths is None
    assert test[0].prediction == ["Governor", "Lawyer", "Governor"] and val[0].prediction == []
    assert "train 1, validation 1, test 1 questions (kept in the splits of" in text
    assert "dropped: 2 non-string items" in text
    assert "records: 5 read from" in text and "2 without a prediction line (left out)" in text

    resplit = tmp_path / "resplit"
    assert run(capsys, "--input", src, "--records", folder, "--output", resplit, "--resplit", "--seed", "1")[0] == 0
    ids = sorted(r.id for s in ("train", "validation", "test") for r in read_records(str(resplit / f"{s}.jsonl")))
    assert ids == ["WebQTest-1", "WebQTrn-0", "WebQTrn-2"]


def test_a_prediction_for_no_record_is_an_error_unless_skipped(tmp_path, capsys):
    folder = _records_folder(tmp_path)
    src = write_lines(tmp_path / "plain.jsonl", [{"id": "WebQTest-1", "prediction": "Governor"},
                                                 {"id": "WebQTest-99", "prediction": "Mars"}])  # fmt: skip
    out = tmp_path / "joined"
    code, _, err = run(capsys, "--input", src, "--records", folder, "--output", out)
    assert code == 2 and f"{src}:2: field 'id' id 'WebQTest-99' is in no record" in err and not out.exists()
    code, text, _ = run(capsys, "--input", src, "--records", folder, "--output", out, "--on-missing", "skip")
    assert code == 0 and "1 prediction lines whose id is in no record (skipped)" in text
    code, _, err = run(capsys, "--input", src, "--output", tmp_path / "alone")
    assert code == 2 and "is a plain predictions file" in err and "--records" in err


def test_gcr_beams_join_with_their_paths_and_the_records_graph(tmp_path, capsys):
    folder = _records_folder(tmp_path)
    src = write_lines(tmp_path / "gcr.jsonl", GCR_ROWS[:2])
    out = tmp_path / "joined"
    code, text, _ = run(capsys, "--input", src, "--records", folder, "--output", out)
    assert code == 0 and "(gcr)" in text
    test = read_records(str(out / "test.jsonl"))
    assert [r.id for r in test] == ["WebQTest-0", "WebQTest-1"]
    assert test[0].graph == [("Jamaica", "r", "Jamaican English"), ("Jamaica", "s", "m.0x"),
                             ("m.0x", "t", "Jamaican English")]  # fmt: skip
    assert test[0].prediction == ["Jamaican English", "Jamaican English", "Patois"]
    assert test[0].prediction_paths[2] == [] and len(test[0].prediction_paths[0]) == 1


def test_the_format_is_detected_per_file_from_its_first_line_with_a_prediction():
    gcr = [(1, {"id": "a", "prediction": []}), (2, GCR_ROWS[0])]
    assert detect_format(gcr) == "gcr"
    assert detect_format([(1, prompt_row(0))]) == "prompt"
    assert detect_format([(1, {"id": "a", "prediction": ""}), (2, {"id": "b", "prediction": ["x"]})]) == "plain"
    assert detect_format([]) == "plain"
    # a first question whose beams were all cut before "# Answer:" does not make a GCR file plain
    cut = [(1, {"id": "a", "prediction": ["# Reasoning Path:\nA -> r -> B"]}), (2, GCR_ROWS[0])]
    assert detect_format(cut) == "gcr"


def test_ids_repeated_across_files_name_both_places(tmp_path):
    a = write_lines(tmp_path / "a.jsonl", [prompt_row(1)])
    b = write_lines(tmp_path / "b.jsonl", [prompt_row(2), prompt_row(1)])
    with pytest.raises(RecordError, match=r"b.jsonl:2: field 'id' repeats id 'q1' of line .*a.jsonl:1"):
        import_predictions([a, b])


# the four defects a review reproduced; each test fails on the code before this change


@pytest.mark.parametrize(
    "hostile", ['{"id": "q9", "n": ' + "7" * 5000 + "}", "[" * 100_000 + "]" * 100_000], ids=["long_int", "nested"]
)
def test_a_line_json_cannot_read_is_an_error_naming_the_file_and_line(tmp_path, capsys, hostile):
    src = tmp_path / "predictions.jsonl"
    src.write_text(json.dumps(prompt_row(1)) + "\n" + hostile + "\n", encoding="utf-8")
    out = tmp_path / "out"
    code, _, err = run(capsys, "--input", src, "--output", out)
    assert code == 2 and f"{src}:2: invalid JSON" in err and not out.exists()


def test_a_failed_write_leaves_the_output_folder_as_it_was(tmp_path, capsys):
    rows = [prompt_row(i) for i in range(10)]
    out = tmp_path / "out"
    assert run(capsys, "--input", write_lines(tmp_path / "a.jsonl", rows), "--output", out)[0] == 0
    before = folder_state(out)
    test_id = split_by_question([record_from_prompt(r) for r in rows], [0.6, 0.2, 0.2], seed=0)["test"][-1].id
    rows = [prompt_row(i, prediction="new answer") for i in range(10)]
    rows[int(test_id[1:])]["ground_truth"] = ["Jamaican English", "\ud800"]  # a lone surrogate: no UTF-8 for it
    src = write_lines(tmp_path / "b.jsonl", rows)
    code, _, err = run(capsys, "--input", src, "--output", out)
    assert code == 2 and f"{src}:{int(test_id[1:]) + 1}: field 'answer'" in err and "UTF-8" in err
    assert folder_state(out) == before  # no new train/validation beside the old test, no temporary files
    fresh = tmp_path / "fresh"
    assert run(capsys, "--input", src, "--output", fresh)[0] == 2 and not fresh.exists()


def test_a_failed_rename_puts_the_old_files_back(tmp_path, capsys, monkeypatch):
    """Found by a review: the files were renamed one at a time as each was closed, so a failure at the second
    rename left a new test file beside the old train file."""
    import os

    from kglightning.data.sources import predictions_import

    rows = [prompt_row(i) for i in range(10)]
    out = tmp_path / "out"
    assert run(capsys, "--input", write_lines(tmp_path / "a.jsonl", rows), "--output", out)[0] == 0
    before = folder_state(out)
    calls = []
    real = os.replace

    def flaky(src, dst):
        calls.append(dst)
        if str(dst).endswith("validation.jsonl") and ".tmp" in str(src):  # the second new file fails to land
            raise OSError("disk gone")
        return real(src, dst)

    monkeypatch.setattr(predictions_import.os, "replace", flaky)
    new = [record_from_prompt(prompt_row(i, prediction="new answer")) for i in range(10)]
    with pytest.raises(OSError, match="disk gone"):
        predictions_import.write_splits(split_by_question(new, [0.6, 0.2, 0.2], seed=0), out)
    assert folder_state(out) == before and calls  # the old three files, and nothing else


def test_a_record_that_would_not_be_read_back_is_refused_at_import(tmp_path, capsys):
    src = write_lines(tmp_path / "predictions.jsonl", [prompt_row(1), prompt_row(2, question="  ")])
    out = tmp_path / "out"
    code, _, err = run(capsys, "--input", src, "--output", out)
    assert code == 2 and f"{src}:2: field 'question' expected a non-empty string" in err and not out.exists()


def test_items_of_a_prediction_list_that_are_not_strings_are_counted(tmp_path, capsys):
    src = write_lines(tmp_path / "p.jsonl", [prompt_row(1, prediction=["Jamaican English", 3, None, {"a": 1}, " "])])
    code, text, _ = run(capsys, "--input", src, "--output", tmp_path / "out", "--fractions", 1, 0, 0)
    assert code == 0 and "dropped: 3 non-string items of a prediction list" in text and "1 blank items" in text
    assert read_records(str(tmp_path / "out" / "train.jsonl"))[0].prediction == ["Jamaican English"]


def _dead_pid() -> int:
    out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(out.stdout)


def test_a_killed_import_leaves_backups_named_and_temporaries_removed_and_modes_kept(tmp_path, capsys, caplog):
    from kglightning.data.sources import predictions_import

    rows = [prompt_row(i) for i in range(10)]
    out = tmp_path / "out"
    assert run(capsys, "--input", write_lines(tmp_path / "a.jsonl", rows), "--output", out)[0] == 0
    (out / "train.jsonl").chmod(0o600)
    dead, day_ago = _dead_pid(), time.time() - 2 * 86400
    killed = [out / temporary_name("test.jsonl", pid=dead)]
    users = [out / ".train.jsonl.backup-2024.tmp", out / ".test.jsonl.v1.tmp", out / ".test.jsonl.1-notes.tmp",
             out / ".train.jsonl.1733480000-0a1b2c3d.tmp", out / ".test.jsonl.1733480000123-0a1b2c3d.tmp"]  # fmt: skip
    for path in [*killed, *users]:
        path.write_text("half")  # as a process killed while writing leaves them, or a user's own files
        os.utime(path, (day_ago, day_ago))
    (out / ".validation.jsonl.1-dead.old").write_text("the old validation")
    new = [record_from_prompt(prompt_row(i, prediction="new answer")) for i in range(10)]
    with caplog.at_level("WARNING"):
        predictions_import.write_splits(split_by_question(new, [0.6, 0.2, 0.2], seed=0), out)
    assert not any(p.exists() for p in killed) and (out / ".validation.jsonl.1-dead.old").exists()
    assert all(p.read_text() == "half" for p in users)  # reviews 4, 5: a user's ".train.jsonl.*.tmp" was deleted
    assert ".validation.jsonl.1-dead.old" in caplog.text
    assert (out / "train.jsonl").stat().st_mode & 0o777 == 0o600


def test_an_import_never_writes_over_its_inputs(tmp_path, capsys):
    """Issue 57: ``--records data/rog --output data/rog`` with test predictions emptied train and validation, and
    ``--input results/test.jsonl --output results`` replaced the input; both exited 0."""
    folder = _records_folder(tmp_path)
    src = write_lines(tmp_path / "plain.jsonl", [{"id": "WebQTest-1", "prediction": "Governor"}])
    before = folder_state(folder)
    for out in (folder, folder / "sub", folder / ".." / "rog"):
        code, _, err = run(capsys, "--input", src, "--records", folder, "--output", out)
        assert code == 2 and "inside the input folder" in err and folder_state(folder) == before
    results = tmp_path / "results"
    results.mkdir()
    gcr = write_lines(results / "test.jsonl", GCR_ROWS)
    kept = (results / "test.jsonl").read_bytes()
    code, _, err = run(capsys, "--input", gcr, "--output", results)
    assert code == 2 and "over the input" in err and (results / "test.jsonl").read_bytes() == kept
    assert sorted(p.name for p in results.iterdir()) == ["test.jsonl"]
    # through a link to the input folder too
    (tmp_path / "link").symlink_to(results)
    assert run(capsys, "--input", gcr, "--output", tmp_path / "link")[0] == 2
    assert (results / "test.jsonl").read_bytes() == kept


def test_an_empty_input_or_split_never_replaces_an_earlier_import(tmp_path, capsys):
    """Issue 57: an empty predictions file exited 0 and wrote three empty splits over the previous import."""
    out = tmp_path / "out"
    src = write_lines(tmp_path / "a.jsonl", [prompt_row(i) for i in range(10)])
    assert run(capsys, "--input", src, "--output", out)[0] == 0
    before = folder_state(out)
    for text in ("", "\n\n  \n"):
        (tmp_path / "empty.jsonl").write_text(text)
        code, _, err = run(capsys, "--input", tmp_path / "empty.jsonl", "--output", out)
        assert code == 2 and "holds no prediction line" in err and folder_state(out) == before
    # predictions of the test split only, joined into a folder holding an earlier import of every split
    folder = _records_folder(tmp_path)
    joined = tmp_path / "joined"
    every = write_lines(tmp_path / "every.jsonl", [{"id": i, "prediction": "x"} for i in ("WebQTrn-0", "WebQTrn-2",
                                                                                           "WebQTest-0")])  # fmt: skip
    assert run(capsys, "--input", every, "--records", folder, "--output", joined)[0] == 0
    before = folder_state(joined)
    only_test = write_lines(tmp_path / "test_only.jsonl", [{"id": "WebQTest-1", "prediction": "Governor"}])
    code, _, err = run(capsys, "--input", only_test, "--records", folder, "--output", joined)
    assert code == 2 and "holds no question of split 'train'" in err and folder_state(joined) == before
    # every line skipped: nothing to write, an error
    none = write_lines(tmp_path / "none.jsonl", [{"id": "WebQTest-99", "prediction": "Mars"}])
    code, _, err = run(
        capsys, "--input", none, "--records", folder, "--output", tmp_path / "new", "--on-missing", "skip"
    )
    assert code == 2 and "gave no record to write" in err and not (tmp_path / "new").exists()


def test_records_read_through_links_are_inputs_too(tmp_path, capsys):
    """Review of issue 57: a --records folder of links to another folder's split files; writing into that folder
    replaced the files the import had just read."""
    real = _records_folder(tmp_path)
    view = tmp_path / "view"
    view.mkdir()
    for split in ("train", "validation", "test"):
        (view / f"{split}.jsonl").symlink_to(real / f"{split}.jsonl")
    src = write_lines(tmp_path / "plain.jsonl", [{"id": i, "prediction": "x"} for i in ("WebQTrn-0", "WebQTrn-2",
                                                                                         "WebQTest-0")])  # fmt: skip
    before = folder_state(real)
    code, _, err = run(capsys, "--input", src, "--records", view, "--output", real)
    assert code == 2 and "over the input" in err and folder_state(real) == before


def test_fractions_that_are_not_numbers_are_a_usage_error(tmp_path, capsys):
    src = write_lines(tmp_path / "a.jsonl", [prompt_row(i) for i in range(5)])
    for bad in (["nan", "0.5", "0.5"], ["inf", "0", "0"], ["-0.5", "1", "0.5"]):
        with pytest.raises(SystemExit) as exc:
            run(capsys, "--input", src, "--output", tmp_path / "out", "--fractions", *bad)
        assert exc.value.code == 2 and "--fractions must be" in capsys.readouterr().err
    with pytest.raises(ValueError, match="fractions must be"):
        split_by_question([], [float("nan"), 0.5, 0.5], 0)


def test_an_output_that_is_a_file_or_an_input_that_is_a_folder_is_one_line(tmp_path, capsys):
    """Review 4: both ended in a traceback (FileExistsError, IsADirectoryError) where a missing input gets one line."""
    rows = write_lines(tmp_path / "a.jsonl", [prompt_row(i) for i in range(10)])
    (tmp_path / "ofile").write_text("mine")
    code, _, err = run(capsys, "--input", rows, "--output", tmp_path / "ofile")
    assert code == 2 and err.startswith("error: ") and "ofile" in err and "Traceback" not in err
    assert (tmp_path / "ofile").read_text() == "mine"
    (tmp_path / "indir").mkdir()
    code, _, err = run(capsys, "--input", tmp_path / "indir", "--output", tmp_path / "o2")
    assert code == 2 and "indir" in err and "Traceback" not in err and not (tmp_path / "o2").exists()


def test_a_folder_at_a_splits_name_is_refused_not_moved_aside(tmp_path, capsys):
    """Review 5: a user's folder out/train.jsonl was renamed to a hidden backup name and a file put in its place."""
    rows = write_lines(tmp_path / "a.jsonl", [prompt_row(i) for i in range(10)])
    (tmp_path / "out" / "train.jsonl").mkdir(parents=True)
    (tmp_path / "out" / "train.jsonl" / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "--input", rows, "--output", tmp_path / "out")
    assert code == 2 and "train.jsonl exists and is not a file" in err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train.jsonl"]
    assert (tmp_path / "out" / "train.jsonl" / "notes.txt").read_text() == "mine"


def test_records_from_the_hub_without_a_network_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    rows = write_lines(tmp_path / "a.jsonl", [{"id": "q1", "prediction": ["x"]}])
    code, _, err = run(capsys, "--input", rows, "--records", "hf:someone/nothing", "--output", tmp_path / "out")
    assert code == 2 and "--records hf:someone/nothing: cannot be fetched" in err and not (tmp_path / "out").exists()


def test_a_gcr_beam_written_as_one_string_is_read_as_gcr(tmp_path, capsys):
    """Review 5: GCR writes one beam as a bare string; auto called the file plain and its header and path lines
    became answers."""
    rows = [{"id": f"q{i}", "question": f"question {i}?", "ground_truth": [f"Ans{i}"],
             "prediction": f"# Reasoning Path:\nE{i} -> rel.x -> Ans{i}\n# Answer:\nAns{i}"} for i in range(10)]  # fmt: skip
    assert detect_format(list(enumerate(rows, start=1))) == "gcr"
    code, _, _ = run(capsys, "--input", write_lines(tmp_path / "g.jsonl", rows), "--output", tmp_path / "out")
    assert code == 0
    imported = [
        r for split in ("train", "validation", "test") for r in read_records(tmp_path / "out" / f"{split}.jsonl")
    ]
    assert sorted(r.prediction for r in imported) == sorted([f"Ans{i}"] for i in range(10))


def test_a_records_folder_the_import_did_not_write_is_never_replaced(tmp_path, capsys):
    """Review 6: `--input webqsp/predictions.jsonl --output webqsp` replaced the user's own RoG records (10 records
    became 4) with exit 0. A split file is replaced only when an import wrote it (its marker beside it)."""
    mine = tmp_path / "webqsp"
    write_records([KGQARecord(f"u{i}", "q?", ["a"], ["t"], ["a"], [("t", "r", "a")]) for i in range(3)],
                  mine / "train.jsonl")  # fmt: skip
    before = (mine / "train.jsonl").read_bytes()
    rows = write_lines(mine / "predictions.jsonl", [prompt_row(i) for i in range(10)])
    code, _, err = run(capsys, "--input", rows, "--output", mine)
    assert code == 2 and "train.jsonl exists and is not a file that an import wrote" in err
    assert (mine / "train.jsonl").read_bytes() == before and not (mine / "test.jsonl").exists()
    out = tmp_path / "out"  # what an import wrote, it may replace
    assert run(capsys, "--input", rows, "--output", out)[0] == 0
    assert run(capsys, "--input", rows, "--output", out, "--seed", "1")[0] == 0


def test_one_plain_reply_that_mentions_an_answer_header_does_not_make_the_file_gcr():
    """Review 6: a bare string counted as a GCR beam, so one reply with '# Answer:' re-read every line as beams."""
    rows = [{"id": f"q{i}", "prediction": f"a{i}\nb{i}"} for i in range(4)]
    rows.append({"id": "q4", "prediction": "Let me think.\n# Answer: a4"})
    assert detect_format(list(enumerate(rows, start=1))) == "plain"


def test_a_permission_error_is_one_line(tmp_path, capsys, monkeypatch):
    from kglightning.data.sources import predictions_import

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro" / "out"))

    monkeypatch.setattr(predictions_import, "write_splits", denied)
    code, _, err = run(capsys, "--input", write_lines(tmp_path / "a.jsonl", [prompt_row(i) for i in range(10)]),
                       "--output", tmp_path / "ro" / "out")  # fmt: skip
    assert code == 2 and "Permission denied" in err and "Traceback" not in err


def test_a_mark_that_does_not_match_the_file_lets_nothing_be_replaced(tmp_path, capsys):
    """Review 7: a mark was not tied to its file, so after `rm out/train.jsonl` (the hidden mark stays) a user's
    own records put there were replaced by the next import, exit 0."""
    rows = write_lines(tmp_path / "a.jsonl", [prompt_row(i) for i in range(10)])
    out = tmp_path / "out"
    assert run(capsys, "--input", rows, "--output", out)[0] == 0
    assert (out / ".train.jsonl.kglightning-import").is_file()
    (out / "train.jsonl").unlink()
    write_records([KGQARecord("MY-OWN", "q?", ["a"], ["t"], ["a"], [("t", "r", "a")])], out / "train.jsonl")
    mine = (out / "train.jsonl").read_bytes()
    code, _, err = run(capsys, "--input", rows, "--output", out, "--seed", "1")
    assert code == 2 and "train.jsonl exists and is not a file that an import wrote" in err
    assert (out / "train.jsonl").read_bytes() == mine
    with open(out / "validation.jsonl", "a") as f:  # an import's file edited by hand: the user's now
        f.write("\n")
    (out / "train.jsonl").unlink()
    assert run(capsys, "--input", rows, "--output", out, "--seed", "1")[0] == 2


def test_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    from kglightning.data.sources import predictions_import

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(predictions_import, "write_splits", full)
    code, _, err = run(capsys, "--input", write_lines(tmp_path / "a.jsonl", [prompt_row(i) for i in range(10)]),
                       "--output", tmp_path / "out")  # fmt: skip
    assert code == 2 and "No space left on device" in err and "Traceback" not in err


def test_a_planted_link_at_a_marks_name_is_never_written_through(tmp_path, capsys):
    """Review 8: the mark was written with the link-following atomic writer, replacing the link's target."""
    victim = tmp_path / "victim.txt"
    victim.write_text("my precious notes")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".train.jsonl.kglightning-import").symlink_to(victim)
    rows = write_lines(tmp_path / "a.jsonl", [prompt_row(i) for i in range(10)])
    assert run(capsys, "--input", rows, "--output", out)[0] == 0
    assert victim.read_text() == "my precious notes" and (out / ".train.jsonl.kglightning-import").is_symlink()
    assert run(capsys, "--input", rows, "--output", out, "--seed", "1")[0] == 2  # unmarked: not replaced


def test_a_records_value_json_cannot_write_is_one_line(tmp_path, capsys):
    """Review 8: a parquet timestamp column in --records ended in a TypeError traceback."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "rec").mkdir()
    for s in ("train", "validation", "test"):
        t = pa.table({"id": [f"{s}1"], "question": ["who?"], "answer": [["B"]], "q_entity": [["A"]],
                      "a_entity": [["B"]], "graph": [[["A", "r", "B"]]], "created": [datetime.datetime(2024, 1, 1)]})  # fmt: skip
        pq.write_table(t, tmp_path / "rec" / f"{s}.parquet")
    rows = write_lines(
        tmp_path / "p.jsonl", [{"id": f"{s}1", "prediction": ["B"]} for s in ("train", "validation", "test")]
    )
    code, _, err = run(capsys, "--input", rows, "--records", tmp_path / "rec", "--output", tmp_path / "out")
    assert code == 2 and "field 'created'" in err and "JSON cannot write" in err and not (tmp_path / "out").exists()


def test_one_answer_in_a_list_that_mentions_an_answer_header_does_not_make_the_file_gcr():
    """Review 8: the list form of review 6's case: 11 of 12 answers were dropped and 'X'' kept."""
    rows = [{"id": f"q{i}", "prediction": ["Paris", "Lyon"]} for i in range(5)]
    rows.append({"id": "q5", "prediction": ["Paris", "The format is '# Answer: X'"]})
    assert detect_format(list(enumerate(rows, start=1))) == "plain"


def test_a_path_on_the_headers_line_and_beams_cut_before_their_answer_are_read():
    """Review 9: the text after 'Reasoning Paths:' on its line was dropped uncounted; a GCR file whose beams were all
    cut short before '# Answer:' was read as plain, its headers becoming answers."""
    from kglightning.data.sources.prompt_predictions import parse_reasoning_paths

    prompt = "Reasoning Paths: X -> r -> A\nX -> s -> B\n\nQuestion:\na?"
    assert parse_reasoning_paths(prompt) == [["X", "r", "A"], ["X", "s", "B"]]
    rows = [{"id": "q1", "prediction": ["# Reasoning Path:\n<PATH>X -> r -> A</PATH>"]},
            {"id": "q2", "prediction": "# Reasoning Path:\nX -> r -> A\n# Ans"}]  # fmt: skip
    assert detect_format(list(enumerate(rows, start=1))) == "gcr"
