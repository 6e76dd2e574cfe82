"""The numbers of README.md and the docs are written from the result files of the runs (tools/docs_numbers.py)."""

from __future__ import annotations

import importlib.util
import json
import re
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
    for page in (*numbers.PAGES, *numbers.RENDER_ONLY):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    shutil.copytree(numbers.RESULTS, tmp_path / "docs" / "results")
    monkeypatch.setattr(numbers, "ROOT", tmp_path)
    monkeypatch.setattr(numbers, "RESULTS", tmp_path / "docs" / "results")
    return numbers


def _edit(path: Path, change) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def test_the_pages_show_what_the_result_files_hold():
    assert _tool("docs_numbers").main(["--check"]) == 0


def test_every_page_has_its_blocks_and_the_home_page_includes_the_table():
    numbers = _tool("docs_numbers")
    found = {page: [m["name"] for m in numbers.BLOCK.finditer((ROOT / page).read_text())] for page in numbers.PAGES}
    assert found == {
        "README.md": ["main-job-time", "main-table", "startup-line", "test-suite"],
        "docs/index.md": ["main-job-time", "main-job-breakdown", "test-suite"],
        "BENCHMARKS.md": ["startup", "main-job-speed", "threads", "serve-load", "serve-large"],
        "docs/methods/conformal.md": [],
        "docs/methods/doublycal.md": [],
        "docs/methods/kg-guard.md": ["main-table", "misses-table"],
        "docs/methods/sgic.md": ["sgic-table"],
        "docs/methods/trust.md": [],
        "docs/methods/uag.md": ["uag-table"],
    } | {page: [] for page in numbers.PAGES if page.startswith(("docs/guides/", "docs/tutorials/"))} | {
        "docs/benchmark.md": [], "docs/data.md": [], "docs/architecture.md": [],
        # the commands' times, from record_run.py tutorial (own-llm-answers' on a stand-in for the reader's answers)
        "docs/tutorials/conformal-sets.md": ["tutorial-times"],
        "docs/tutorials/answers-with-a-guarantee.md": ["tutorial-times"],
        "docs/tutorials/own-llm-answers.md": ["tutorial-times"],
        "docs/tutorials/your-own-modules.md": ["tutorial-times"]}  # fmt: skip
    # every method page is checked, and each results section named for the check exists
    assert {p for p in numbers.PAGES if p.startswith("docs/methods/")} == {
        f"docs/methods/{p.name}" for p in (ROOT / "docs" / "methods").glob("*.md")
    }
    for page, headings in numbers.RESULTS_SECTIONS.items():
        for heading in headings:
            numbers.section((ROOT / page).read_text(), heading, page)
    # the home page's table is the KG-Guard page's, included; and what is included there is the block alone
    assert '--8<-- "docs/methods/kg-guard.md:main-table"' in (ROOT / "docs/index.md").read_text()
    kg_guard = (ROOT / "docs/methods/kg-guard.md").read_text()
    included = kg_guard.split("<!-- --8<-- [start:main-table] -->\n")[1].split("<!-- --8<-- [end:main-table] -->")[0]
    assert numbers.BLOCK.fullmatch(included.strip())


def test_a_number_edited_by_hand_fails_the_check(copy, capsys):
    readme = copy.ROOT / "README.md"
    text = readme.read_text()
    f1 = f"{json.loads((copy.RESULTS / 'main_job.json').read_text())['metrics']['test/f1']:.3f}"
    assert f"**{f1}**" in text
    readme.write_text(text.replace(f"**{f1}**", "**0.999**", 1))
    assert copy.main(["--check"]) == 1
    assert "README.md: block 'main-table'" in capsys.readouterr().out
    assert copy.main([]) == 0  # rewritten from the result file
    assert readme.read_text() == text


@pytest.mark.parametrize(
    ("page", "line", "results_section"),
    [
        ("README.md", "KG-Guard reaches F1 0.999 here.\n", False),
        ("docs/index.md", "| KG-Guard | 0.999 |\n", False),  # a table written where the KG-Guard page's is included
        ("docs/index.md", "The first run took 4 min 2 s.\n", False),
        ("docs/methods/kg-guard.md", "The GAT scored 0.951.\n", True),
        # every method page, anywhere on it: three decimals and times
        ("docs/methods/conformal.md", "On the embedded data the sets covered 0.912 of the answers.\n", False),
        ("docs/methods/doublycal.md", "The GRPO proxy's reward was 0.244.\n", False),
        ("docs/methods/trust.md", "`top` kept FDR at 0.178 over 20 splits.\n", False),
        ("docs/methods/sgic.md", "The run took 3 min 6 s.\n", False),
        ("docs/methods/uag.md", "The whole predict run took 1 min 49 s.\n", False),
        # in a results section, a share and a decimal table cell too
        ("docs/methods/uag.md", "| 0.2 | ≥ 80 | 87.5 | 34.8 |\n", True),
        ("docs/methods/uag.md", "| 0.2 | 93.3 / 112.2 |\n", True),
        ("docs/methods/sgic.md", "| baseline | 0.0 | 37.5 | 11.81 |\n", True),
        ("docs/methods/sgic.md", "The fine-tuning set kept 23% of the questions.\n", True),
        ("docs/methods/doublycal.md", "| DoublyCal | **45.7** |\n", True),
        ("docs/methods/trust.md", "At 0.2, `top` answers 97.6% of the questions.\n", True),
        # a metric named with two decimals, a clock time, and the tutorials and guides are checked too
        ("docs/methods/trust.md", "`top` at 0.1 reached an FDR of 0.30.\n", False),
        ("docs/tutorials/conformal-sets.md", "The sets covered 0.482 of the questions.\n", False),
        ("docs/tutorials/own-llm-answers.md", "The detector reached F1 0.96 here.\n", False),
        ("docs/guides/data.md", "The cut took 2:03 on 2 cores.\n", False),
        ("README.md", "The main job reached 0.96 F1.\n", False),
        ("README.md", "The main job reached an F1 of 95.8%.\n", False),
        ("docs/guides/serving.md", "Two workers gave 3.98x the throughput of one.\n", False),
        ("docs/guides/serving.md", "Two workers scored about 1.7 times as many requests a second.\n", False),
        # a time something took, in seconds alone (a setting, "a timeout of 30 s", is not one)
        ("docs/tutorials/answers-with-a-guarantee.md", "On 2 CPU cores, this step took 14 s.\n", False),
        ("docs/guides/serving.md", "A graph of 5,000 new triples took about 12 s.\n", False),
        ("README.md", "A request at concurrency 1 took 77 to 80 ms at the median.\n", False),
        ("README.md", "The fit took **69 s** alone.\n", False),
        ("docs/data.md", "The training split takes about 20 minutes on 2 cores.\n", False),
        ("docs/guides/cli.md", "The cross-validation ran in 345 s.\n", False),
        # an estimated time or a rate, with no verb of taking
        ("docs/data.md", "A 10^6-triple graph builds in about 2 s on a 2-core machine.\n", False),
        ("docs/guides/data.md", "It is read and indexed once (2.5 s for a million triples).\n", False),
        ("docs/methods/conformal.md", "1,000 configurations calibrate in roughly 5 ms.\n", False),
        ("docs/guides/serving.md", "Each worker spends 4.1 ms per request.\n", False),
        ("docs/guides/serving.md", "Each worker spends 4.1 ms/request.\n", False),
        ("docs/data.md", "A KG indexes in approximately 2 s.\n", False),
        ("docs/data.md", "A KG indexes in ~2 s.\n", False),
        ("docs/data.md", "A KG indexes in about 2 to 3 min.\n", False),
        ("docs/guides/data.md", "It is read and indexed once (2.5 s for 1 million triples).\n", False),
    ],
)
def test_a_result_written_outside_the_blocks_fails_the_check(copy, capsys, page, line, results_section):
    path = copy.ROOT / page
    text = path.read_text()
    if results_section:
        anchor = copy.RESULTS_SECTIONS[page][0] + "\n"
        at = text.index(anchor) + len(anchor)
    else:
        at = len(text)
    path.write_text(text[:at] + "\n" + line + text[at:])
    assert copy.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert f"{page}: " in out and "outside a block" in out


def test_a_time_in_a_docstring_which_the_api_pages_show_is_named(tmp_path):
    numbers = _tool("docs_numbers")
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text(
        '"""A module whose index builds in about 2 s."""\n\n\n'
        "def f():\n"
        '    """Fast.\n\n    >>> f()  # took 3 s in a doctest: not prose\n    """\n\n\n'
        "class C:\n"
        '    """It took 33 ms at concurrency 1; a timeout of 30 s is a setting."""\n'
    )
    assert numbers.docstring_times(package) == [
        "pkg/mod.py: the module's docstring: 'about 2 s' (a time belongs in a result file)",
        "pkg/mod.py: C's docstring: 'took 33 ms' (a time belongs in a result file)",
    ]
    assert numbers.docstring_times() == []  # the package's own docstrings point to their records


def test_settings_and_prose_decimals_are_not_results():
    numbers = _tool("docs_numbers")
    page = "docs/methods/uag.md"
    settings = ("## Running it\n| option | value |\n|---|---|\n| alpha | 0.2 |\n| grid_step | 0.1 |\nIt keeps 10% of the pool.\n"
                "## Results on the embedded test split\nAt α = 0.2 and δ = 0.05, with lr 5e-5 (`alpha: 0.3`):\n"
                "<!-- numbers: uag-table -->\n| 0.2 | 87.5 | 0.953 |\n<!-- numbers: end -->\n"
                "```\n| 0.2 | 87.5 |\n```\n"
                "## The evaluator in the loop, and the paper's grid\n## LLM baselines: Top-K and split CP on the "
                "LLM's scores, CLM and LoFreeCP\n")  # fmt: skip
    assert numbers.stray_numbers(settings, page) == []
    assert (
        numbers.stray_numbers(
            "At alpha 0.10 the target coverage is 90%; version 2.8, Python 3.11; a timeout of 30 s, "
            "waits up to 120 s. As in its Table 15, seconds per question.\n",
            "README.md",
        )
        == []
    )
    results = settings.replace("(`alpha: 0.3`):", "(`alpha: 0.3`): coverage 81.8%, APSS 0.912\n| 0.3 | **79.9** |")
    assert sorted(numbers.stray_numbers(results, page)) == ["0.3", "0.912", "79.9", "81.8%", "coverage 81.8%"]


def test_a_results_section_runs_to_the_next_heading_of_its_level():
    numbers = _tool("docs_numbers")
    text = "# Page\n## A\na\n### A CPU run\nrun\n#### detail\nd\n### Next\nn\n## B\nb\n"
    assert numbers.section(text, "### A CPU run", "p.md") == "### A CPU run\nrun\n#### detail\nd\n"
    assert numbers.section(text, "## A", "p.md") == "## A\na\n### A CPU run\nrun\n#### detail\nd\n### Next\nn\n"
    assert numbers.section(text, "## B", "p.md") == "## B\nb\n"
    with pytest.raises(SystemExit, match="p.md: no section '## C'"):
        numbers.section(text, "## C", "p.md")


def test_numbers_in_code_are_not_results_and_a_method_page_is_read_as_a_whole(copy):
    assert copy.stray_numbers("run `sleep 0.125`\n```\nF1 0.951\n```\n", "README.md") == []
    page = ("## Results on the embedded test split\nno numbers\n## What the detector catches and misses\nnone\n"
            "## Every answer, graph node or not\n| 12.5 | 40% |\n")  # fmt: skip
    # outside the results sections a share or a decimal table cell is a setting
    assert copy.stray_numbers(page, "docs/methods/kg-guard.md") == []
    # three decimals and times are results in every section
    later = page.replace("| 12.5 |", "| 0.911 | 4 min 21 s |")
    assert copy.stray_numbers(later, "docs/methods/kg-guard.md") == ["0.911", "4 min 21 s"]
    assert copy.stray_numbers(page.replace("no numbers", "F1 0.955"), "docs/methods/kg-guard.md") == ["0.955"]
    with pytest.raises(SystemExit, match="no section"):
        copy.stray_numbers("## Other\n", "docs/methods/kg-guard.md")


@pytest.mark.parametrize(
    "line",
    [
        "In 5-fold cross-validation the detector's F1 over every answer was 0.668.\n",
        "| KG-Guard | 0.668 ± 0.075 | 0.747 ± 0.086 |\n",
        "The cross-validation took 24 min 50 s on 2 cores.\n",
    ],
)
def test_a_result_written_by_hand_in_the_kg_guard_gnn_rag_section_fails_the_check(copy, capsys, line):
    path = copy.ROOT / "docs/methods/kg-guard.md"
    heading = "## A real LLM's answers: GNN-RAG on WebQSP\n"
    text = path.read_text()
    at = text.index(heading) + len(heading)
    path.write_text(text[:at] + "\n" + line + text[at:])
    assert copy.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "docs/methods/kg-guard.md: " in out and "outside a block" in out


def test_no_section_of_a_checked_page_is_exempt(copy):
    for page in copy.PAGES:
        text = (copy.ROOT / page).read_text()
        prose = re.sub(r"```.*?```", "", text, flags=re.S)  # a "# comment" in a code block is no heading
        headings = re.findall(r"^#{1,6} .*$", prose, flags=re.M)
        assert headings or "guides/" in page, page  # a short guide may be one section under its title
        history = copy.HISTORY.get(page)
        for heading in headings[: headings.index(history)] if history else headings:
            at = text.index(heading + "\n") + len(heading) + 1
            edited = text[:at] + "\nIt scored 0.987 here.\n" + text[at:]
            assert "0.987" in copy.stray_numbers(edited, page), (page, heading)


def test_benchmarks_is_checked_down_to_its_dated_records_which_are_history(copy, capsys):
    page = copy.ROOT / "BENCHMARKS.md"
    text = page.read_text()
    history = text.index("\n## Dated records\n")
    assert "### The main job: earlier runs" in text[history:]  # older runs sit under the history heading
    assert not re.search(r"^## ", text[history + 1 :].split("\n", 1)[1], flags=re.M), "a section after the history"
    page.write_text(text[:history] + "\nThe main job took 4 min 2 s.\n" + text[history:])
    assert copy.main(["--check"]) == 1 and "BENCHMARKS.md: '4 min 2 s' outside a block" in capsys.readouterr().out
    page.write_text(text + "\nAn old run took 4 min 2 s and scored 0.987.\n")
    assert copy.main(["--check"]) == 0
    page.write_text(text.replace("\n## Dated records\n", "\n## Older\n"))
    with pytest.raises(SystemExit, match="no heading '## Dated records'"):
        copy.main(["--check"])


def test_a_result_file_recorded_again_makes_its_pages_stale(copy, capsys):
    def change(result):
        result["metrics"]["test/auroc"] = 0.123456
        return result

    _edit(copy.RESULTS / "detector_gat.json", change)
    assert copy.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "README.md: block 'main-table'" in out and "docs/methods/kg-guard.md: block 'main-table'" in out
    assert "main-job-time" not in out  # the blocks that do not read that file stay as they are
    copy.main([])
    assert "| 0.123 |" in (copy.ROOT / "docs/methods/kg-guard.md").read_text()


def test_the_best_value_of_each_column_is_bold_and_the_findings_follow_the_values(copy):
    def gat_wins(result):
        result["metrics"] = {k: (0.9999 if k.count("/") == 1 else v) for k, v in result["metrics"].items()}
        return result

    for change in (lambda r: r, gat_wins):
        _edit(copy.RESULTS / "detector_gat.json", change)
        table = copy.main_table()
        rows = [line.split(" | ")[1:] for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
        for column in zip(*rows):
            values = [float(cell.strip(" |*")) for cell in column]
            bold = [cell.strip(" |").startswith("**") for cell in column]
            assert bold == [f"{v:.3f}" == f"{max(values):.3f}" for v in values]
        assert not any(line.startswith("| **") for line in table.splitlines())  # labels are never bold
    assert "The GraphTransformer is ahead of the GAT on 0 of 6 metrics and behind on" in table
    assert "Both detectors score above every baseline on F1, Precision, Accuracy, AUC-PR, AUROC; not on Recall" in table


def test_the_labels_give_each_run_s_width_epochs_seed_and_device(copy):
    def gpu_run(result):
        result["config"]["hidden_channels"], result["epochs_trained"], result["config"]["seed"] = 64, 7, 3
        result["machine"]["gpu"] = "NVIDIA H200"
        return result

    _edit(copy.RESULTS / "detector_gat.json", gpu_run)
    table = copy.main_table()
    assert "`configs/detector_gat.yaml` (hidden 64, 7 epochs trained)" in table
    assert "seed 3, GPU (NVIDIA H200)" in table


def test_results_on_another_test_split_are_refused(copy):
    def other(result):
        result["splits"]["test"]["answers"] += 1
        return result

    _edit(copy.RESULTS / "detector_gat.json", other)
    with pytest.raises(SystemExit, match="detector_gat.json: its test split"):
        copy.main_table()


def test_unknown_block_and_missing_result_file_are_named(copy):
    with pytest.raises(SystemExit, match="page.md: unknown numbers block 'nope'"):
        copy.render("<!-- numbers: nope -->\n<!-- numbers: end -->", "page.md")
    (copy.RESULTS / "test_suite.json").unlink()
    with pytest.raises(SystemExit, match=r"docs/results/test_suite.json: no such result file"):
        copy.test_suite()


def test_tutorial_times_say_what_stood_in_why_a_step_was_left_out_and_what_a_fit_came_out_with(copy):
    run = {"page": "docs/tutorials/t.md", "date": "2026-12-07", "commit": "abc1234",
           "machine": {"gpu": None, "cpu": "AMD EPYC", "cores": 2},
           "files": {"predictions.jsonl": "a stand-in for your answers"}, "rerun": "python tools/record_run.py x --y",
           "steps": [{"command": "python -m kglightning import-predictions --input predictions.jsonl", "seconds": 12.0},
                     {"command": "python -m kglightning fit --config c.yaml", "seconds": 200.4, "epochs": 9,
                      "test": {"test/f1": 0.95123, "test/auc_pr": 0.99, "test/structural/f1": 0.9}},
                     {"command": "python -m kglightning serve --config s.yaml", "skipped": "a server runs until stopped"},
                     {"command": "python -m kglightning select --calibration cal.jsonl", "skipped": True}]}  # fmt: skip
    (copy.RESULTS / "tutorial_t.json").write_text(json.dumps(run))
    block = copy.tutorial_times("docs/tutorials/t.md")
    assert (
        "`python tools/record_run.py x --y` measures it again). `predictions.jsonl` was a stand-in for your " in block
    )
    assert "- `import-predictions --input predictions.jsonl`: 12 s\n" in block
    assert "- `fit --config c.yaml`: 3 min 20 s; 9 epochs, test F1 0.951 and AUC-PR 0.990 (the structural " in block
    assert "- `serve --config s.yaml`: not run (a server runs until stopped)\n" in block
    assert "- `select --calibration cal.jsonl`: not run (it reads your own files)\n" in block


def test_record_run_tutorial_saves_the_pages_file_copies_a_stand_in_and_says_why_it_skipped(tmp_path, monkeypatch):
    import argparse
    import os

    record = _tool("record_run")
    root = tmp_path / "repo"
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "c.yaml").write_text("a: 1\n")
    page = root / "docs" / "t.md"
    page.parent.mkdir()
    page.write_text("```python\nprint('not this one')\n```\n```python\n# my_models.py\nX = 1\n```\n```bash\n"
                    "python -m kglightning --version\npython -m kglightning serve \\\n  --config s.yaml\n"
                    "python -m kglightning select --calibration cal.jsonl  # your files\n```\n")  # fmt: skip
    (tmp_path / "mine.jsonl").write_text("{}\n")
    monkeypatch.setattr(record, "ROOT", root)
    args = argparse.Namespace(page="docs/t.md", python_block=["my_models.py"], file=[f"in/p.jsonl={tmp_path / 'mine.jsonl'}"],
                              about=["in/p.jsonl=a stand-in"], skip=["serve=a server", "cal.jsonl"])  # fmt: skip
    work_tmp = tmp_path / "tmp"
    work_tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = record.record_tutorial(args, env, work_tmp)
    work = work_tmp / "work"
    assert (work / "my_models.py").read_text() == "# my_models.py\nX = 1\n"
    assert (work / "in" / "p.jsonl").read_text() == "{}\n" and (work / "configs" / "c.yaml").is_file()
    assert result["files"] == {"in/p.jsonl": "a stand-in"}
    assert result["rerun"] == ("python tools/record_run.py tutorial docs/t.md --python-block my_models.py "
                               "--file in/p.jsonl=FILE --skip=serve --skip=cal.jsonl")  # fmt: skip
    steps = result["steps"]
    assert [s.get("skipped") for s in steps] == [None, "a server", True]
    assert steps[0]["command"] == "python -m kglightning --version" and steps[0]["seconds"] >= 0
    assert steps[1]["command"] == "python -m kglightning serve --config s.yaml"
    args.python_block = ["other.py"]
    with pytest.raises(SystemExit, match="no python block starting with `# other.py`"):
        record.record_tutorial(args, env, tmp_path / "again")
    args.python_block, args.file = [], ["in/q.jsonl=/no/such/file"]
    with pytest.raises(SystemExit, match="expected DEST=SOURCE with an existing SOURCE"):
        record.record_tutorial(args, env, tmp_path / "once_more")
    args.file = [f"../outside.jsonl={tmp_path / 'mine.jsonl'}"]
    with pytest.raises(SystemExit, match="DEST must be a path inside the working folder"):
        record.record_tutorial(args, env, tmp_path / "outside")
    assert not (tmp_path / "outside" / "outside.jsonl").exists()


def test_record_run_reads_the_last_metrics_the_epochs_and_the_split_counts(tmp_path):
    record = _tool("record_run")
    run = tmp_path / "run" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("epoch,val/f1,test/f1,test/auroc\n0,0.5,,\n1,0.6,,\n1,,0.7,0.6\n2,,0.9,0.8\n")
    # the last test row; two epochs trained (the test after fit logs at the epoch after the last)
    assert record.run_metrics(tmp_path / "run") == ({"test/auroc": 0.8, "test/f1": 0.9}, 2)
    (run / "metrics.csv").write_text("epoch,val/f1\n0,0.5\n")
    with pytest.raises(SystemExit, match="no test/"):
        record.run_metrics(tmp_path / "run")
    with pytest.raises(SystemExit, match="no metrics.csv"):
        record.run_metrics(tmp_path / "nothing")
    log = (
        "train: 10 questions -> 9 graphs, 20 answers (50.0% hallucinated): 20 node; excluded: ...\n"
        "test: 1497 questions -> 1497 graphs, 3805 answers (70.5% hallucinated): 3805 node (70.5% hallucinated)\n"
    )
    assert record.split_counts(log)["test"] == {
        "questions": 1497, "graphs": 1497, "answers": 3805, "hallucinated_percent": 70.5,
    }  # fmt: skip
    assert set(record.split_counts(log)) == {"train", "test"}
    out = "....\n1822 passed, 13 skipped, 3 deselected, 48 warnings in 907.94s (0:15:07)\n"
    assert record.summary_counts(out) == {"passed": 1822, "skipped": 13, "deselected": 3}
    assert record.summary_counts("x\n2 failed, 10 passed, 1 error in 3.0s\n") == {"failed": 2, "passed": 10, "error": 1}
    with pytest.raises(SystemExit, match="no summary"):
        record.summary_counts("collected 0 items\n")


def test_record_run_reads_the_recipe_from_the_config(tmp_path):
    record = _tool("record_run")
    assert record.config_values(ROOT / "configs" / "detector.yaml") == {
        "seed": 0, "max_epochs": 15, "hidden_channels": 128,
    }  # fmt: skip
    (tmp_path / "c.yaml").write_text("trainer: {max_epochs: 2}\nmodel: 3\n")
    assert record.config_values(tmp_path / "c.yaml") == {"seed": None, "max_epochs": 2, "hidden_channels": None}


@pytest.mark.heavy
def test_a_failed_run_writes_no_result_and_keeps_its_log(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  class_path: kglightning.NoSuchModule\n")
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "record_run.py"), "fit", "--config", str(bad),
                           "--output", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode != 0 and not out.exists()
    log = Path(done.stderr.strip().splitlines()[-1].split("its output is in ")[1])
    assert log.is_file() and "NoSuchModule" in log.read_text()
    shutil.rmtree(log.parent)


def test_the_misses_table_and_its_findings_follow_the_result_file(copy):
    path = copy.RESULTS / "detector_misses.json"

    def worse(result):  # the detector now misses wrong relations most
        for row in result["misses"]["groups"][copy.MISSES]:
            if row["group"] == "same length, other relations":
                row["recall"] = 0.5
        return result

    _edit(path, worse)
    assert copy.main(["--check"]) == 1
    assert copy.main([]) == 0
    text = (copy.ROOT / "docs/methods/kg-guard.md").read_text()
    assert '"same length, other relations" (50.0% caught' in text
    (row,) = [r for r in json.loads(path.read_text())["misses"]["groups"][copy.MISSES]
              if r["group"] == "same length, other relations"]  # fmt: skip
    assert f"| mistake: same length, other relations | {row['nodes']:,} | 100.0% | 50.0% | |" in text


def test_a_misses_result_from_another_checkpoint_is_refused(copy):
    _edit(copy.RESULTS / "detector_misses.json", lambda r: {**r, "metrics": {**r["metrics"], "test/f1": 0.5}})
    with pytest.raises(SystemExit, match="not the main job's"):
        copy.main([])


def test_a_result_in_the_misses_section_outside_its_block_fails_the_check(copy, capsys):
    page = copy.ROOT / "docs/methods/kg-guard.md"
    text = page.read_text()
    page.write_text(text.replace("## Every answer, graph node or not", "It scored F1 0.912 there.\n\n"
                                 "## Every answer, graph node or not"))  # fmt: skip
    assert copy.main(["--check"]) == 1 and "'0.912' outside a block" in capsys.readouterr().out


def test_a_share_written_by_hand_in_the_misses_section_fails_the_check(copy, capsys):
    page = copy.ROOT / "docs/methods/kg-guard.md"
    page.write_text(page.read_text().replace("## Every answer, graph node or not", "On 1-hop questions it catches "
                                             "91.1%.\n\n## Every answer, graph node or not"))  # fmt: skip
    assert copy.main(["--check"]) == 1 and "'91.1%' outside a block" in capsys.readouterr().out


def test_the_misses_findings_leave_out_undefined_values_and_odd_groups(copy):
    def odd(result):
        groups = result["misses"]["groups"]
        groups["hops"][0]["false_alarms"] = float("nan")  # 1 hop: no faithful answer
        groups["hops"][1]["recall"] = float("nan")  # 2 hops: no hallucinated answer
        groups["hops"].append({**groups["hops"][0], "group": "?"})  # records without a hop count
        return result

    _edit(copy.RESULTS / "detector_misses.json", odd)
    text = copy.misses_table()
    assert "| questions of unknown length |" in text.splitlines()[6]  # sorted after the lengths
    findings = text.split("\n\n")[1]
    assert "–" not in findings and "2-hop" not in findings and "?" not in findings
    assert "False alarms are highest on 3-hop questions" in findings


def test_misses_groups_that_do_not_pool_to_the_run_s_recall_are_refused(copy):
    def edited(result):
        result["misses"]["groups"]["grounding"][0]["recall"] = 0.5
        return result

    _edit(copy.RESULTS / "detector_misses.json", edited)
    with pytest.raises(SystemExit, match="pool to a recall"):
        copy.main([])


@pytest.mark.parametrize(("name", "page", "block"), [("sgic", "docs/methods/sgic.md", "sgic-table"),
                                                     ("uag", "docs/methods/uag.md", "uag-table")])  # fmt: skip
def test_a_pipeline_result_recorded_again_makes_its_method_page_stale(copy, capsys, name, page, block):
    def change(result):
        if name == "sgic":
            result["files"]["outputs/sgic/sgic_summary.json"]["methods"]["sgic"]["F1"] = 99.99
        else:
            result["files"]["outputs/uag/sweep.json"]["results"][1]["uag"]["apss"] = 1234.5
        return result

    _edit(copy.RESULTS / f"{name}.json", change)
    assert copy.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert f"{page}: block {block!r}" in out and "README.md" not in out
    assert copy.main([]) == 0
    assert ("| 99.99 |" if name == "sgic" else "| 1234.5 |") in (copy.ROOT / page).read_text()


@pytest.mark.parametrize("page", ["docs/methods/sgic.md", "docs/methods/uag.md"])
def test_a_method_table_edited_by_hand_fails_the_check(copy, capsys, page):
    path = copy.ROOT / page
    text = path.read_text()
    block = next(copy.BLOCK.finditer(text))
    edited = block["body"].replace("| 0 |", "| 9 |", 1).replace("| 0.2 |", "| 0.25 |", 1)
    assert edited != block["body"]
    path.write_text(text.replace(block["body"], edited))
    assert copy.main(["--check"]) == 1
    assert f"{page}: block {block['name']!r}" in capsys.readouterr().out


def test_the_sgic_findings_follow_the_summary(copy):
    def corrected(result):
        summary = result["files"]["outputs/sgic/sgic_summary.json"]
        summary["transitions"].update({"incorrect => correct": 3, "incorrect => incorrect": 12})
        return result

    _edit(copy.RESULTS / "sgic.json", corrected)
    assert "9 stay right, 3 become right, 0 become wrong and 12 stay wrong" in copy.sgic_table()


def test_the_uag_findings_follow_the_sweep(copy):
    def uncovered(result):
        row = result["files"]["outputs/uag/sweep.json"]["results"][-1]
        row["uag"].update({"abstained": False, "ecr": 1 - row["alpha"] - 0.05})
        return result

    _edit(copy.RESULTS / "uag.json", uncovered)
    last = json.loads((copy.RESULTS / "uag.json").read_text())["files"]["outputs/uag/sweep.json"]["results"][-1]
    assert f"Its coverage is below 1 − α at {last['alpha']:g}" in copy.uag_table()
    (copy.RESULTS / "uag.json").write_text(
        json.dumps({**json.loads((copy.RESULTS / "uag.json").read_text()), "files": {}})
    )
    with pytest.raises(SystemExit, match="no outputs/uag/test/metrics.json among its files"):
        copy.uag_table()


def test_record_run_keeps_the_last_value_of_each_logged_metric(tmp_path):
    record = _tool("record_run")
    run = tmp_path / "scorer" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text(
        "epoch,step,train/loss,val/pair_auc\n0,19,0.5,\n0,39,,0.9\n0,59,0.2,\n0,79,,0.99\n"
    )
    assert record.last_logged(tmp_path) == {"train/loss": 0.2, "val/pair_auc": 0.99}
    assert record.last_logged(tmp_path / "none") == {}


def test_the_serve_load_block_computes_its_ratios_from_the_result_file():
    import json

    numbers = _tool("docs_numbers")
    r = json.loads((ROOT / "docs/results/serve_load.json").read_text())
    text = numbers.serve_load()
    batched = [run for run in r["servers"] if run["max_batch_size"] > 1]
    for run in batched:  # one sentence per batching server (one worker, two)
        by_c = {x["concurrency"]: x["per_second"] for x in run["load"]}
        assert f"{by_c[max(by_c)] / by_c[min(by_c)]:.2f}x the throughput" in text
        assert f"{by_c[max(by_c)] / r['in_process']['per_second']:.0%} of in-process" in text
        # issue 60's throughput target is against in-process `predict` over the same questions
        share = by_c[max(by_c)] / r["predict"]["per_second"]
        verdict = "met" if share >= 0.75 else "**not met**"
        assert f"within 25% of in-process `predict` ({share:.0%}: {verdict})" in text
    assert f"{batched[0]['soak']['server_errors']} answered 5xx" in text


def test_a_serve_record_without_the_predict_baseline_compares_with_in_process_scoring(copy):
    path = copy.RESULTS / "serve_load.json"
    _edit(path, lambda r: {k: v for k, v in r.items() if k != "predict"})
    text = copy.serve_load()
    assert "`predict`" not in text and "within 25% of in-process scoring (" in text


def test_the_detectors_comparison_says_when_their_runs_differ_in_commit_or_machine():
    numbers = _tool("docs_numbers")
    values = [[0.9] * 6, [0.8] * 6, [0.5] * 6, [0.4] * 6, [0.3] * 6]
    same = [{"commit": "abc", "machine": {"cpu": "X"}}] * 2
    assert "differ in commit or machine" not in numbers._findings(values, same)
    other = [same[0], {"commit": "def", "machine": {"cpu": "X"}}]
    assert "differ in commit or machine" in numbers._findings(values, other)
    assert "ahead of the GAT on 6 of 6 metrics" in numbers._findings(values, other)
