"""The tutorial "Keep answers with a guarantee" (docs/tutorials/answers-with-a-guarantee.md), run as a reader would:
its commands are read from the page and run in order in a fresh folder, on 120/60/60 questions of the embedded data,
with a tiny text encoder, a small model and two epochs added. What each step says it writes is checked. The last
command (``select`` on files of the reader's own) is not run."""

from __future__ import annotations

import json

import pytest

PAGE = "docs/tutorials/answers-with-a-guarantee.md"
pytestmark = [pytest.mark.e2e, pytest.mark.heavy]


def test_the_tutorial_runs_as_written_and_writes_what_it_says(tmp_path, tiny_options, page_commands, run_command):
    commands = page_commands(PAGE)
    steps = [(c[3], "--pool" in c) for c in commands]
    assert steps == [("fit", False), ("predict", False), ("predict", False), ("select", True), ("select", False)]
    for command in commands[:3]:
        run_command(command, *tiny_options())
    run_command(commands[3])

    trusted = [json.loads(x) for x in (tmp_path / "outputs/trust/test/trusted_answers.jsonl").open()]
    assert len(trusted) == 60  # one line per test question
    for row in trusted:
        assert {"prediction", "hallucination_prob", "grounding", "kept", "kept_scores", "dropped", "abstained",
                "selection"} <= set(row)  # fmt: skip
        assert row["selection"]["rule"] == "top" and row["selection"]["alpha"] == 0.1
        assert row["abstained"] == (not row["kept"]) and len(row["kept"]) <= 2  # at most one per group
        assert len(row["kept"]) + len(row["dropped"]) == len(row["hallucination_prob"])  # every answer, once
    for name in ("report.md", "selection.png", "reliability.png"):
        assert (tmp_path / "outputs/trust/test" / name).is_file(), name
    report = (tmp_path / "outputs/selection/check/report.md").read_text()
    assert "| top | 0.1 |" in report and "| fdr | 0.2 |" in report  # a row per rule and level
