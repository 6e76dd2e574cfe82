"""Issue 58: the commands that work on files start without Lightning, and their ``--help`` without torch.

Each case runs in a fresh interpreter (``sys.modules`` of this one already holds both) and reports which of the
heavy packages the command imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kglightning.cli import EXTRA_SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("lightning", "torch", "transformers", "torch_geometric", "datasets", "sentence_transformers")
#: the extra subcommands that drive a trainer: their --help may load Lightning
TRAINER_DRIVEN = {"seeds", "compare-proxies"}

_PROBE = """
import json, sys
from kglightning.cli import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "loaded": [m for m in json.loads(sys.argv[2]) if m in sys.modules]}))
"""


def _probe(argv: list[str], tmp_path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), KGLIGHTNING_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argv), json.dumps(HEAVY)], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


FILE_COMMANDS = sorted(set(EXTRA_SUBCOMMANDS) - TRAINER_DRIVEN)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], *([c, "--help"] for c in FILE_COMMANDS)],
                         ids=lambda a: " ".join(a))  # fmt: skip
def test_help_and_version_import_neither_lightning_nor_torch(argv, tmp_path):
    result = _probe(argv, tmp_path)
    assert result == {"code": 0, "loaded": []}


def test_every_extra_subcommand_is_checked_or_drives_a_trainer():
    # the file commands, and serve (its --help and its argument errors come before torch; the server loads it)
    assert TRAINER_DRIVEN <= set(EXTRA_SUBCOMMANDS) and len(FILE_COMMANDS) == 8


def test_cache_du_on_an_empty_cache_and_an_import_load_no_torch(tmp_path):
    assert _probe(["cache", "du"], tmp_path) == {"code": 0, "loaded": []}
    records = [{"id": f"q{i}", "question": "capital of France?", "answer": ["Paris"], "q_entity": ["France"],
                "a_entity": ["Paris"], "graph": [["France", "capital", "Paris"]]} for i in range(3)]  # fmt: skip
    (tmp_path / "rog").mkdir()
    for split in ("train", "validation", "test"):
        lines = "".join(json.dumps({**r, "id": f"{split}-{r['id']}"}) + "\n" for r in records)
        (tmp_path / "rog" / f"{split}.jsonl").write_text(lines, encoding="utf-8")
    rows = [{"id": f"test-q{i}", "prediction": ["Paris"]} for i in range(3)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = _probe(["import-predictions", "--input", "p.jsonl", "--records", "rog", "--output", "imported"], tmp_path)
    assert result == {"code": 0, "loaded": []} and (tmp_path / "imported" / "test.jsonl").is_file()


def test_a_missing_subcommand_is_a_usage_error_and_fit_help_still_loads_the_trainer(tmp_path):
    assert _probe([], tmp_path)["code"] == 2
    result = _probe(["fit", "--help"], tmp_path)
    assert result["code"] == 0 and "lightning" in result["loaded"]


def test_the_select_commands_rules_are_the_selectors():
    from kglightning.conformal.select_cli import RULES
    from kglightning.conformal.selection import RULES as SELECTOR_RULES

    assert RULES == SELECTOR_RULES
