"""tools/bench/bench_scale.py and rog_generator.py: generated records read back, stages measured, rows tabled."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools/bench"))  # bench_scale imports rog_generator as a sibling
_spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "tools/bench/bench_scale.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
from rog_generator import RoGGenerator, write  # noqa: E402


def test_stages_measure_generated_records(tmp_path):
    data = tmp_path / "r.jsonl"
    triples = write(RoGGenerator(seed=1, triples=60), 6, "train", data)
    assert triples > 0 and len(data.read_text().splitlines()) == 6
    cache = tmp_path / "cache"
    read = bench.run_stage("read", data, cache, None)
    assert read["questions"] == 6 and read["triples"] == triples and read["strings"] > 0
    warm = bench.run_stage("warm", data, cache, None, warm_questions=6)
    assert warm["strings"] > 0 and warm["peak_anon_mib"] > 0
    det = bench.run_stage("detector", data, cache, None)
    assert det["questions"] == 6 and det["strings"] == warm["strings"]  # warm: nothing new encoded
    rows = [{"impl": "current", **r} for r in (read, det)] + [{"stage": "uag", "impl": "baseline", "error": ["boom"]}]
    text = bench.table(rows)
    assert text.count("\n") == 4 and "error: boom" in text and all(line.count("|") == 11 for line in text.splitlines())
    json.dumps(rows)  # what --output writes


def test_plot_draws_both_panels(tmp_path):
    rows = [{"stage": s, "seconds": q * t / 1e4, "size_questions": q, "size_triples": t}
            for s in ("read", "pcst") for q, t in ((10, 100), (20, 100), (10, 200))]  # fmt: skip
    out = tmp_path / "p.png"
    bench.plot(rows, out, triples=100, questions=10)
    assert out.stat().st_size > 5000


def test_slopes_read_linear_and_quadratic_growth():
    rows = [{"stage": "lin", "seconds": q / 10, "size_questions": q, "size_triples": 100, "triples": q * 100,
             "questions": q} for q in (10, 20, 40)]  # fmt: skip
    rows += [{"stage": "quad", "seconds": (q / 10) ** 2, "size_questions": q, "size_triples": 100,
              "triples": q * 100, "questions": q} for q in (10, 20, 40)]  # fmt: skip
    text = bench.slopes(rows, triples=100, questions=10)
    assert "| lin | 1.0 s | 2.0 s | 4.0 s | 1.00 | n/a |" in text and "| quad | 1.0 s | 4.0 s | 16.0 s | 2.00 |" in text
