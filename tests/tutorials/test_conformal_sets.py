"""The tutorial "Conformal sets for any predictions file" (docs/tutorials/conformal-sets.md), run as a reader would:
its commands are read from the page and run in order in a fresh folder.

The retrieval baseline's two ``predict`` commands and ``conformalize`` run exactly as written, on the embedded data
with the bundled encoder, and the lines ``conformalize`` prints must be the page's. The callback's ``fit`` and
``predict`` run with a tiny encoder and a small model added (the page's numbers do not come from them); their
outputs are checked for what the page says they hold.
"""

from __future__ import annotations

import json
import re

import pytest

PAGE = "docs/tutorials/conformal-sets.md"
pytestmark = [pytest.mark.e2e, pytest.mark.heavy]

NUMBER = re.compile(r"-?\d+\.\d+|-?\d+")


def unwrap(lines: list[str]) -> list[str]:
    """The page's output lines as printed: a line that starts with spaces continues the one before (the page wraps
    long lines to fit the column)."""
    out: list[str] = []
    for line in lines:
        if line.startswith("  ") and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def same_output(page: list[str], run: list[str]) -> bool:
    """The lines agree word for word, counts exactly and decimals within 0.01: a CPU with other vector instructions
    may move an encoder's float32 confidences in their last digits, and so flip a question at the threshold (0.002
    of a group's ECR) or an APSS's second decimal."""
    if len(page) != len(run):
        return False
    for want, got in zip(page, run):
        if NUMBER.sub("#", want) != NUMBER.sub("#", got):
            return False
        for a, b in zip(NUMBER.findall(want), NUMBER.findall(got)):
            if ("." in a and abs(float(a) - float(b)) > 0.01) or ("." not in a and a != b):
                return False
    return True


def test_the_tutorial_runs_as_written_and_prints_what_it_shows(
    tmp_path, tiny_options, page_text, page_commands, run_command
):
    text = page_text(PAGE)
    shown = [unwrap(block.strip().splitlines()) for block in re.findall(r"```text\n(.*?)```", text, flags=re.S)]
    commands = page_commands(PAGE)
    names = [c[3] for c in commands]
    assert names == ["predict", "predict", "conformalize", "conformalize", "conformalize", "fit", "predict"], names
    assert len(shown) == 3  # what each conformalize prints
    for command in commands[:2]:
        run_command(command)
    for command, page in zip(commands[2:5], shown):
        printed = run_command(command).stdout.strip().splitlines()
        assert same_output(page, printed), "\n".join(["page:", *page, "run:", *printed])

    out = [json.loads(x) for x in (tmp_path / "outputs/baseline/predictions_test.conformal.jsonl").open()]  # alpha 0.5
    qhat = out[0]["conformal_qhat"]
    for row in out:  # the sets are the answers with 1 - confidence <= qhat, as the page says
        conf = row["confidence"]
        conf = [conf[a] for a in row["prediction"]] if isinstance(conf, dict) else conf
        assert row["conformal_set"] == [a for a, c in zip(row["prediction"], conf) if 1 - c <= qhat]
        assert row["conformal_full_set"] is False and row["conformal_qhat"] == qhat

    fit, predict = commands[5:]
    extra = tiny_options()
    run_command(fit, *extra)
    logged = next((tmp_path / "outputs/detector/graph_transformer").glob("version_*/metrics.csv")).read_text()
    assert "test/conformal_coverage" in logged and "test/conformal_set_size" in logged
    run_command(predict, *extra)
    rows = [json.loads(x) for x in
            (tmp_path / "outputs/detector/graph_transformer/hallucination_predictions_test.jsonl").open()]  # fmt: skip
    assert rows
    for row in rows:
        assert len(row["conformal_set"]) == len(row["hallucination_prob"]) > 0
        assert all(s in (["faithful"], ["hallucinated"], ["faithful", "hallucinated"]) for s in row["conformal_set"])
