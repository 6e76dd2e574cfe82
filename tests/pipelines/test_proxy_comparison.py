"""Proxy comparison: the scores of hand-written proxy outputs, and `kglightning compare-proxies` end to end."""

from __future__ import annotations

import json
import math

import pytest

from kglightning.cli import main
from kglightning.datamodules import ProxyGRPODataModule
from kglightning.evidence.rewards import EvidenceReward
from kglightning.pipelines.proxy_comparison import comparison_table, score_proxy


@pytest.fixture
def capitals(tiny_chat_model_dir, capitals_dir, tmp_path):
    dm = ProxyGRPODataModule(tokenizer=tiny_chat_model_dir, data_dir=capitals_dir, cache_dir=str(tmp_path / "cache"))
    records = {r.id: r for r in dm.read_split("test")}
    return dm, records, dm.gold_evidence("test")


def test_scores_by_hand(capitals):
    dm, records, gold = capitals
    ids = sorted(records)[:4]
    rows = [
        {"id": ids[0], "raw": ["<PATH confidence=0.9>capital</PATH>"]},  # right path; target (0.5+1)/(1+1) = 0.75
        {"id": ids[1], "raw": ["<PATH confidence=0.6>borders</PATH>"]},  # the neighbour: no answer; target 0.25
        {"id": ids[2], "raw": ["<PATH confidence=1.5>capital</PATH>"]},  # confidence out of range: invalid
        {"id": ids[3], "raw": ["no path at all"]},
        {"id": "not-scored", "raw": ["<PATH confidence=0.5>capital</PATH>"]},  # no gold evidence (unknown id)
    ]
    summary, details = score_proxy(rows, records, gold, dm.builder)
    assert summary["n_questions"] == 4 and [d["valid"] for d in details] == [True, True, False, False]
    assert summary["invalid"] == 0.5
    assert [d["target"] for d in details[:2]] == [0.75, 0.25]
    assert summary["hit"] == 0.25 and summary["f1"] == 0.25  # one exact answer out of four questions
    # match: 'capital' vs gold 'capital' = 1; 'borders' vs 'capital' = 0
    assert summary["match"] == 0.25
    # 10 bins: 0.9 -> |0.9 - 0.75|, 0.6 -> |0.6 - 0.25|, each half of the valid outputs
    assert summary["target_ece"] == pytest.approx(0.5 * 0.15 + 0.5 * 0.35)
    assert summary["answer_ece"] == pytest.approx(0.5 * 0.1 + 0.5 * 0.6)
    assert summary["distinct"] == 1.0 and summary["spearman"] == pytest.approx(
        1.0, abs=1e-5
    )  # torchmetrics adds an eps
    reward = EvidenceReward()
    assert summary["reward"] == pytest.approx(sum(reward.score(r["raw"][0], gold[r["id"]]) for r in rows[:4]) / 4)
    assert details[2]["reward"] == -3.0 and details[3]["reward"] == -3.0


def test_constant_confidence_has_no_rank_correlation(capitals):
    dm, records, gold = capitals
    rows = [{"id": i, "raw": ["<PATH confidence=0.75>capital</PATH>"]} for i in sorted(records)]
    summary, _ = score_proxy(rows, records, gold, dm.builder)
    assert math.isnan(summary["spearman"]) and summary["distinct"] == pytest.approx(1 / 6)
    assert "| – |" in comparison_table({"sft": summary})


@pytest.mark.e2e
def test_compare_proxies_command(tiny_chat_model_dir, tiny_sft_adapter, capitals_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    from pathlib import Path

    config = str(Path(__file__).resolve().parents[2] / "configs/proxy_grpo.yaml")
    status = main(
        [
            "compare-proxies",
            "--config",
            config,
            "--proxy",
            f"sft={tiny_sft_adapter}",
            "--proxy",
            f"rl={tiny_sft_adapter}@rl",
            "--max_new_tokens",
            "8",
            "--confidence",
            "both",
            "--model.init_args.model",
            tiny_chat_model_dir,
            "--data.init_args.data_dir",
            capitals_dir,
            "--trainer.enable_progress_bar",
            "false",
        ]  # fmt: skip
    )
    assert status == 0
    out = tmp_path / "outputs/proxy_comparison"
    results = json.loads((out / "proxy_comparison.json").read_text())
    assert list(results) == ["sft", "sft-expected", "rl", "rl-expected"]
    assert all(r["n_questions"] == 6 for r in results.values())
    for name in ("sft", "rl"):  # the same greedy outputs; only the confidences are read differently
        stated, expected = ((out / f"{n}.jsonl").read_text().splitlines() for n in (name, f"{name}-expected"))
        assert [json.loads(r)["valid"] for r in stated] == [json.loads(r)["valid"] for r in expected]
    assert (out / "proxy_confidence.png").stat().st_size > 0
    assert len((out / "rl.jsonl").read_text().splitlines()) == 6
    assert "| sft | 6 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["compare-proxies", "--proxy", "no-equals-sign"])


@pytest.mark.e2e
def test_compare_proxies_under_ddp_scores_every_question_once(
    tiny_chat_model_dir, tiny_sft_adapter, capitals_dir, tmp_path
):
    """On 2 DDP processes each predicts its shard; the table covers every question once and equals one process's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    args = [
        sys.executable, "-m", "kglightning", "compare-proxies", "--config", str(root / "configs/proxy_grpo.yaml"),
        "--proxy", f"sft={tiny_sft_adapter}", "--max_new_tokens", "8", "--model.init_args.model", tiny_chat_model_dir,
        "--data.init_args.data_dir", capitals_dir, "--trainer.enable_progress_bar", "false",
        "--trainer.accelerator", "cpu",
    ]  # fmt: skip
    env = dict(os.environ, KGLIGHTNING_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", PYTHONPATH=str(root))
    results = {}
    for name, extra in (("one", []), ("two", ["--trainer.strategy", "ddp", "--trainer.devices", "2"])):
        out = tmp_path / name
        cmd = [*args, *extra, "--output_dir", str(out)]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        results[name] = json.loads((out / "proxy_comparison.json").read_text())
        ids = [json.loads(line)["id"] for line in (out / "sft.jsonl").read_text().splitlines()]
        assert len(ids) == len(set(ids)) == 6
    assert results["two"]["sft"]["n_questions"] == 6
    assert results["two"]["sft"] == pytest.approx(results["one"]["sft"], nan_ok=True)
