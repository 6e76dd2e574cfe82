"""What the side-by-side benchmarks share: a base commit's tree to run beside this one, and their result files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def unpack(rev: str, into: Path, *paths: str) -> Path:
    """``paths`` of commit ``rev`` (``git archive``) unpacked into the folder ``into``, which is returned."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", rev, *paths], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def write_result(output: Path | None, result: dict) -> None:
    """Write ``result`` as the JSON result file ``output`` (nothing when ``None``) and say so."""
    if output:
        output.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {output}")
