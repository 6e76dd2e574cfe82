"""The numbers of README.md and the docs are written from the result files of the runs (tools/docs_numbers.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def copy(tmp_path, monkeypatch):
    """docs_numbers pointed at a copy of the pages and result files."""
    numbers = _tool("docs_numbers")
    for page in numbers.PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    shutil.copytree(numbers.RESULTS, tmp_path / "docs" / "results")
    monkeypatch.setattr(numbers, "ROOT", tmp_path)
    monkeypatch.setattr(numbers, "RESULTS", tmp_path / "docs" / "results")
    return numbers


def test_the_pages_show_what_the_result_files_hold():
    assert _tool("docs_numbers").main(["--check"]) == 0


def test_every_page_has_its_blocks():
    numbers = _tool("docs_numbers")
    found = {page: [m["name"] for m in numbers.BLOCK.finditer((ROOT / page).read_text())] for page in numbers.PAGES}
    assert found == {
        "README.md": ["main-job-time", "main-table", "test-suite"],
        "docs/index.md": ["main-job-time", "test-suite"],  # its main table is the KG-Guard page's, included
        "docs/methods/kg-guard.md": ["main-table"],
    }


def test_a_number_edited_by_hand_fails_the_check(copy, capsys):
    readme = copy.ROOT / "README.md"
    text = readme.read_text()
    f1 = "%.3f" % json.loads((copy.RESULTS / "main_job.json").read_text())["metrics"]["test/f1"]
    assert f"**{f1}**" in text
    readme.write_text(text.replace(f"**{f1}**", "**0.999**", 1))
    assert copy.main(["--check"]) == 1
    assert "README.md: block 'main-table'" in capsys.readouterr().out
    assert copy.main([]) == 0  # rewritten from the result file
    assert readme.read_text() == text


def test_a_result_file_recorded_again_makes_its_pages_stale(copy, capsys):
    path = copy.RESULTS / "detector_gat.json"
    result = json.loads(path.read_text())
    result["metrics"]["test/auroc"] = 0.123456
    path.write_text(json.dumps(result))
    assert copy.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "README.md: block 'main-table'" in out and "docs/methods/kg-guard.md: block 'main-table'" in out
    assert "main-job-time" not in out  # the blocks that do not read that file stay as they are
    copy.main([])
    assert "| 0.123 |" in (copy.ROOT / "docs/methods/kg-guard.md").read_text()


def test_the_best_value_of_each_column_is_bold(copy):
    table = copy.main_table()
    rows = [line.split(" | ")[1:] for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    for column in zip(*rows):
        values = [float(cell.strip(" |*")) for cell in column]
        bold = [cell.strip(" |").startswith("**") for cell in column]
        assert bold == [f"{v:.3f}" == f"{max(values):.3f}" for v in values]


def test_unknown_block_and_missing_result_file_are_named(copy):
    with pytest.raises(SystemExit, match="page.md: unknown numbers block 'nope'"):
        copy.render("<!-- numbers: nope -->\n<!-- numbers: end -->", "page.md")
    (copy.RESULTS / "test_suite.json").unlink()
    with pytest.raises(SystemExit, match=r"docs/results/test_suite.json: no such result file"):
        copy.test_suite()


def test_record_run_reads_the_metrics_and_the_split_counts(tmp_path):
    record = _tool("record_run")
    csv = tmp_path / "metrics.csv"
    csv.write_text("epoch,val/f1,test/f1,test/auroc\n0,0.5,,\n1,0.6,,\n1,,0.9,0.8\n")
    assert record.test_metrics(csv) == {"test/auroc": 0.8, "test/f1": 0.9}
    csv.write_text("epoch,val/f1\n0,0.5\n")
    with pytest.raises(SystemExit, match="no test/"):
        record.test_metrics(csv)
    log = (
        "train: 10 questions -> 9 graphs, 20 answers (50.0% hallucinated): 20 node; excluded: ...\n"
        "test: 1497 questions -> 1497 graphs, 3805 answers (70.5% hallucinated): 3805 node (70.5% hallucinated)\n"
    )
    assert record.split_counts(log)["test"] == {
        "questions": 1497, "graphs": 1497, "answers": 3805, "hallucinated_percent": 70.5,
    }  # fmt: skip
    assert set(record.split_counts(log)) == {"train", "test"}
