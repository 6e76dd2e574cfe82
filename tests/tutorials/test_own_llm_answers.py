"""The tutorial "Flag hallucinations in your own LLM's answers" (docs/tutorials/own-llm-answers.md), run as a reader
would: its commands are read from the page and run in order, as subprocesses, on an answers file in GNN-RAG's format
made from the small detection fixture, with the tiny encoder and a small model (the only options added). Then what
the page says each step writes is checked.

Run from the page: the first ``import-predictions`` command, ``fit``, and the two ``predict`` commands. Not run: the
``--records`` import (it needs a RoG records folder) and the optional ``seeds`` cross-validation (tested in
``tests/cli/test_seeds.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PAGE = "docs/tutorials/own-llm-answers.md"
pytestmark = pytest.mark.e2e


def answers_file(path: Path, records: list[dict]) -> None:
    """GNN-RAG's predictions format: the prompt's reasoning paths are the question's graph."""
    rows = []
    for i, r in enumerate(records):
        paths = "\n".join(" -> ".join(t) for t in r["graph"])
        rows.append({"id": f"q{i}", "question": r["question"], "prediction": "\n".join(r["prediction"]),
                     "ground_truth": r["answer"], "input": f"Reasoning Paths:\n{paths}\n\nQuestion:\n{r['question']}"})  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def test_the_tutorial_runs_as_written_and_writes_what_it_says(
    tmp_path, tiny_options, detection_records, page_commands, run_command
):
    commands = page_commands(PAGE)
    # the own-KG path (build-subgraphs, then the --records import) and seeds are tested apart
    wanted = [c for c in commands if "--records" not in c and c[3] not in ("seeds", "build-subgraphs", "serve")]
    assert sum(c[3] == "build-subgraphs" for c in commands) == 1
    # the last step serves the detector (tests/serve starts the server): its options are the server's, and the rest
    # go to the detector's config as --data.* / --model.*
    from kglightning.cli.serve import _parser

    (serve,) = [c for c in commands if c[3] == "serve"]
    _, rest = _parser().parse_known_args(serve[4:])
    assert all(not a.startswith("--") or a.startswith(("--data.", "--model.")) for a in rest), serve
    assert [c[3] for c in wanted] == ["import-predictions", "fit", "predict", "predict"], commands
    answers_file(tmp_path / "predictions.jsonl", detection_records(80, 3))
    for command in wanted:
        extra = (
            []
            if command[3] == "import-predictions"
            else [*tiny_options(part=False), "--data.init_args.batch_size", "8"]
        )
        run_command(command, *extra)

    data = tmp_path / "data" / "my_llm"
    splits = {s: (data / f"{s}.jsonl").read_text().splitlines() for s in ("train", "validation", "test")}
    assert sum(map(len, splits.values())) == 80 and all(splits.values())  # split by question
    assert (tmp_path / "outputs/detector_real/graph_transformer/checkpoints/best.ckpt").is_file()
    flagged = [json.loads(x) for x in
               (tmp_path / "outputs/detector_real/graph_transformer/hallucination_predictions_test.jsonl").open()]  # fmt: skip
    assert len(flagged) == len(splits["test"])  # one line per test question
    for row in flagged:
        assert len(row["hallucination_prob"]) == len(row["hallucination_logit"]) == len(row["grounding"]) > 0
        assert all(0.0 <= p <= 1.0 for p in row["hallucination_prob"])
        assert set(row["grounding"]) <= {"exact", "near_miss", "ungrounded"}
    trusted = [json.loads(x) for x in (tmp_path / "outputs/trust/test/trusted_answers.jsonl").open()]
    assert len(trusted) == len(splits["test"])
    for row in trusted:
        assert len(row["kept"]) <= 1 and isinstance(row["abstained"], bool) and "dropped" in row  # rule top
    assert (tmp_path / "outputs/trust/test/report.md").is_file()
