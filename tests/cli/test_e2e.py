"""End-to-end: the CLI as a user runs it (subprocesses), on the small fixture with the tiny encoder.

Includes the DDP check: ``fit`` runs on 2 CPU processes (gloo), and ``test`` of one checkpoint gives the same
metrics on 1 process and on 2.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
METRICS = (
    "test/f1",
    "test/precision",
    "test/recall",
    "test/acc",
    "test/auroc",
    "test/auc_pr",
    "test/mostfrequent/f1",
    "test/mostfrequent/auc_pr",
    "test/random/f1",
    "test/random/auc_pr",
)


def _cli(tmp_path: Path, *args: str, cache: str = "cache") -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        KGLIGHTNING_CACHE=str(tmp_path / cache),
        WANDB_MODE="offline",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "kglightning", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def _fixture_args(detection_dir: str, tiny_encoder_dir: str, version: str) -> list[str]:
    return [
        "--config",
        str(ROOT / "configs/detector.yaml"),
        "--data.init_args.data_dir",
        detection_dir,
        "--data.init_args.proposer",
        "null",
        "--data.init_args.encoder",
        "kglightning.data.SentenceEncoder",
        "--data.init_args.encoder.init_args.model",
        tiny_encoder_dir,
        "--data.init_args.batch_size",
        "8",
        "--model.init_args.encoder.init_args.hidden_channels",
        "32",
        "--model.init_args.encoder.init_args.heads",
        "4",
        "--trainer.max_epochs",
        "3",
        "--trainer.logger.init_args.version",
        version,
        "--trainer.enable_progress_bar",
        "false",
    ]


def _metrics(tmp_path: Path, version: str) -> dict[str, float]:
    path = tmp_path / "outputs/detector/graph_transformer" / version / "metrics.csv"
    out: dict[str, float] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            out.update({k: float(v) for k, v in row.items() if v not in ("", None)})
    return out


def _check_consistent(metrics: dict[str, float]) -> None:
    """Every metric is logged, and F1 is the harmonic mean of the logged precision and recall."""
    assert set(METRICS) <= set(metrics), set(METRICS) - set(metrics)
    p, r = metrics["test/precision"], metrics["test/recall"]
    assert metrics["test/f1"] == pytest.approx(2 * p * r / (p + r) if p + r else 0.0, abs=1e-5)


def _odd_test_split(detection_dir: str, tmp_path: Path) -> str:
    """The fixture with 15 test questions: on 2 processes the distributed sampler repeats one to pad the last shard,
    and test metrics must count it once."""
    odd = tmp_path / "odd"
    odd.mkdir(exist_ok=True)
    for split in ("train", "validation", "test"):
        lines = Path(detection_dir, f"{split}.jsonl").read_text().splitlines(keepends=True)
        (odd / f"{split}.jsonl").write_text("".join(lines[:15] if split == "test" else lines))
    return str(odd)


def test_fit_test_predict_and_ddp(detection_dir, tiny_encoder_dir, tmp_path):
    ckpt = tmp_path / "outputs/detector/graph_transformer/checkpoints/best.ckpt"
    _cli(tmp_path, "fit", *_fixture_args(detection_dir, tiny_encoder_dir, "fit"))
    assert ckpt.exists() and (tmp_path / "outputs/detector/graph_transformer/fit/config.yaml").exists()
    fit_metrics = _metrics(tmp_path, "fit")
    assert "val/auc_pr" in fit_metrics and "train/loss_epoch" in fit_metrics

    odd = _odd_test_split(detection_dir, tmp_path)  # a padded test shard on 2 processes
    _cli(tmp_path, "test", *_fixture_args(odd, tiny_encoder_dir, "test1"), "--ckpt_path", str(ckpt))
    single = _metrics(tmp_path, "test1")
    _check_consistent(single)

    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    _cli(tmp_path, "test", *_fixture_args(odd, tiny_encoder_dir, "test2"), *ddp, "--ckpt_path", str(ckpt))
    double = _metrics(tmp_path, "test2")
    for name in METRICS:
        assert double[name] == pytest.approx(single[name], abs=1e-6), name

    _cli(tmp_path, "fit", *_fixture_args(detection_dir, tiny_encoder_dir, "fitddp"), *ddp, "--trainer.max_epochs", "2")
    assert "val/auc_pr" in _metrics(tmp_path, "fitddp")

    _cli(tmp_path, "predict", *_fixture_args(detection_dir, tiny_encoder_dir, "pred"), "--ckpt_path", str(ckpt))
    rows = [
        json.loads(line)
        for line in (tmp_path / "outputs/detector/graph_transformer/hallucination_predictions_test.jsonl").open()
    ]
    assert len(rows) == 16 and all(len(r["hallucination_prob"]) == len(r["prediction"]) for r in rows)


def test_baseline_predict_then_evaluate(detection_dir, tiny_encoder_dir, tmp_path):
    out = tmp_path / "outputs/baseline/predictions_test.jsonl"  # the config's path, relative to the run folder
    _cli(
        tmp_path,
        "predict",
        "--config",
        str(ROOT / "configs/baseline_predict.yaml"),
        "--data.init_args.data_dir",
        detection_dir,
        "--model.init_args.reasoner.init_args.encoder",
        "kglightning.data.SentenceEncoder",
        "--model.init_args.reasoner.init_args.encoder.init_args.model",
        tiny_encoder_dir,
        "--trainer.enable_progress_bar",
        "false",
    )
    rows = [json.loads(line) for line in out.open()]
    assert len(rows) == 16
    for row in rows:
        assert row["prediction"] and len(row["confidence"]) == len(row["prediction"])
        assert all(0 <= c <= 1 for c in row["confidence"]) and row["evidence"]
    proc = _cli(tmp_path, "evaluate", "--predictions", str(out), "--output", str(tmp_path / "eval"))
    text = (tmp_path / "eval/predictions_test.eval_result.txt").read_text()  # the predictions file's own name first
    assert text.startswith("Accuracy: ") and " Hit1: " in text and "ECE: " in text
    assert (tmp_path / "eval/predictions_test.reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "eval/predictions_test.detailed_eval_result.jsonl").exists() and "Hit" in proc.stdout


def test_wandb_logger_offline(detection_dir, tiny_encoder_dir, tmp_path):
    args = _fixture_args(detection_dir, tiny_encoder_dir, "wb")
    args = [a for a in args if a not in ("--trainer.logger.init_args.version", "wb")]
    _cli(tmp_path, "fit", *args, "--config", str(ROOT / "configs/logger/wandb.yaml"), "--trainer.max_epochs", "1")
    runs = list((tmp_path / "outputs/wandb/wandb").glob("offline-run-*"))
    assert runs and any(p.suffix == ".wandb" for p in runs[0].iterdir())


def test_main_job_on_embedded_subset(tmp_path):
    """The README's main job as written, bounded: embedded benchmark built from scratch, the real bundled MiniLM,
    the baseline's proposals, 200 records per split, 2 epochs; then ``test`` from the checkpoint."""
    bound = [
        "--data.init_args.max_records",
        "200",
        "--trainer.max_epochs",
        "2",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.version",
        "main",
    ]
    _cli(tmp_path, "fit", "--config", str(ROOT / "configs/detector.yaml"), *bound)
    ckpt = tmp_path / "outputs/detector/graph_transformer/checkpoints/best.ckpt"
    assert (tmp_path / "cache/embedded-v1-seed0/manifest.json").exists() and ckpt.exists()
    proc = _cli(tmp_path, "test", "--config", str(ROOT / "configs/detector.yaml"), *bound, "--ckpt_path", str(ckpt))
    assert "test/mostfrequent/f1" in proc.stdout and "test/random/auc_pr" in proc.stdout
    metrics = _metrics(tmp_path, "main")
    _check_consistent(metrics)
    # the same test from an empty cache (benchmark, embeddings and records built again): the same numbers
    cold = [*bound[:-1], "main_cold"]
    _cli(
        tmp_path, "test", "--config", str(ROOT / "configs/detector.yaml"), *cold, "--ckpt_path", str(ckpt), cache="cold"
    )
    tested = {k: v for k, v in metrics.items() if k.startswith("test/")}
    assert {k: v for k, v in _metrics(tmp_path, "main_cold").items() if k.startswith("test/")} == tested
    # configs/trust.yaml on the same checkpoint: the kept answers of every test question and the report
    _cli(tmp_path, "predict", "--config", str(ROOT / "configs/trust.yaml"), *bound[:2], *bound[4:6])
    rows = [json.loads(line) for line in (tmp_path / "outputs/trust/test/trusted_answers.jsonl").open()]
    assert rows and all(set(r["kept"]) | set(r["dropped"]) == set(r["prediction"]) for r in rows)
    assert all(len(r["kept"]) <= 2 for r in rows)  # rule top: each question's best grounded and ungrounded answer
    report = json.loads((tmp_path / "outputs/trust/test/report.json").read_text())
    assert report["questions"] == len(rows) and report["rule"] == "top" and "achieved" in report
    assert (tmp_path / "outputs/trust/test/selection.png").exists() and (
        tmp_path / "outputs/trust/test/reliability.png"
    ).exists()


def test_conformal_callback_through_the_cli_and_ddp(detection_dir, tiny_encoder_dir, tmp_path):
    """fit keeps qhat in its checkpoints (fit_on=validation, also on 2 DDP processes: scores gathered); test on 1 and
    2 processes restores it and reports the same coverage and set size; predict writes the sets."""
    import torch

    conformal = [
        "--trainer.callbacks+=kglightning.callbacks.ConformalCallback",
        "--trainer.callbacks.alpha=0.2",
        "--trainer.callbacks.fit_on=validation",
        "--trainer.callbacks.by_group=true",
    ]
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    ckpt = tmp_path / "outputs/detector/graph_transformer/checkpoints/last.ckpt"
    _cli(tmp_path, "fit", *_fixture_args(detection_dir, tiny_encoder_dir, "cfit"), *conformal, *ddp)
    state = torch.load(ckpt, weights_only=False)["callbacks"]
    (key,) = [k for k in state if "ConformalCallback" in k]
    assert state[key]["alpha"] == 0.2 and state[key]["n_cal"] > 0
    assert state[key]["group_qhat"] and state[key]["group_names"][0] == "grounded"  # gathered by group on 2 processes

    results = {}
    odd = _odd_test_split(detection_dir, tmp_path)  # a padded test shard on 2 processes
    for name, extra in (("c1", []), ("c2", ddp)):
        _cli(
            tmp_path,
            "test",
            *_fixture_args(odd, tiny_encoder_dir, name),
            *conformal,
            *extra,
            "--ckpt_path",
            str(ckpt),
        )
        results[name] = _metrics(tmp_path, name)
    for metric in ("test/conformal_coverage", "test/conformal_set_size", "test/conformal_coverage/grounded"):
        assert results["c2"][metric] == pytest.approx(results["c1"][metric], abs=1e-6), metric
    assert 0.0 <= results["c1"]["test/conformal_coverage"] <= 1.0
    assert 0.0 <= results["c1"]["test/conformal_set_size"] <= 2.0


def test_threshold_and_qhat_do_not_depend_on_the_number_of_processes(detection_dir, tiny_encoder_dir, tmp_path):
    """15 validation questions on 2 processes: the distributed sampler repeats one to pad the second shard. The
    repeat must not enter the tuned threshold nor the conformal calibration, so with frozen weights (lr 0) one and
    two processes save the same threshold, qhat and calibration size."""
    import torch

    fixed = [
        "--data.init_args.max_records", "{validation: 15}", "--model.init_args.optimizer.init_args.lr", "0",
        "--trainer.max_epochs", "1", "--trainer.num_sanity_val_steps", "0",
        "--trainer.callbacks+=kglightning.callbacks.ConformalCallback", "--trainer.callbacks.alpha=0.2",
        "--trainer.callbacks.fit_on=validation",
    ]  # fmt: skip
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    saved = {}
    for name, extra in (("one", []), ("two", ddp)):
        run = tmp_path / name
        run.mkdir()
        _cli(run, "fit", *_fixture_args(detection_dir, tiny_encoder_dir, name), *fixed, *extra)
        ckpt = torch.load(run / "outputs/detector/graph_transformer/checkpoints/last.ckpt", weights_only=False)
        (conformal,) = [v for k, v in ckpt["callbacks"].items() if "ConformalCallback" in k]
        saved[name] = (float(ckpt["state_dict"]["threshold"]), conformal["qhat"], conformal["n_cal"])
    assert saved["two"] == saved["one"]
    assert saved["one"][2] == 15  # one unit per question (its answers cluster), the padded repeat counted once


def test_selection_callback_is_the_same_on_one_and_two_processes(detection_dir, tiny_encoder_dir, tmp_path):
    """predict with configs/trust/select.yaml: 2 DDP processes gather the rows (a padded shard counted once) and
    write the same kept answers as 1 process."""
    _cli(tmp_path, "fit", *_fixture_args(detection_dir, tiny_encoder_dir, "sfit"))
    ckpt = tmp_path / "outputs/detector/graph_transformer/checkpoints/best.ckpt"
    odd = _odd_test_split(detection_dir, tmp_path)
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    written = {}
    for name, extra in (("one", []), ("two", ddp)):
        out = tmp_path / name
        trust = [
            "--config",
            str(ROOT / "configs/trust/select.yaml"),
            "--trainer.callbacks.init_args.output_dir",
            str(out),
        ]
        _cli(tmp_path, "predict", *_fixture_args(odd, tiny_encoder_dir, name), *trust, *extra, "--ckpt_path", str(ckpt))
        written[name] = sorted((out / "test" / "trusted_answers.jsonl").read_text().splitlines())
    assert written["one"] == written["two"] and len(written["one"]) == 15


def test_trust_run_with_an_openai_compatible_endpoint_answering_first(detection_dir, tiny_encoder_dir, tmp_path):
    """configs/trust/select.yaml with the KAPING answerer behind a real loopback endpoint: the endpoint answers the
    calibration and test questions, the detector scores the answers, the selection keeps or drops each, in one predict
    run.
    The endpoint's LLM is scripted (it names the tails of the first two facts it is shown, and one name that is in
    no fact, which the answerer drops and counts): what is tested is the run, not an LLM."""
    from kglightning.llm.backends import ChatCompletionServer, Generation, LLMBackend

    class FactReader(LLMBackend):
        name = "fact-reader"

        def __init__(self) -> None:
            self.replies: dict[str, list[list[str]]] = {}  # question -> replies (one question text, several graphs)

        def _generate_uncached(self, batch, params, on_result) -> None:
            for i, messages in enumerate(batch):
                lines = messages[-1]["content"].splitlines()
                facts = [ln for ln in lines if ln.startswith("(") and ln.endswith(")")]
                tails = list(dict.fromkeys(f[1:-1].rsplit(", ", 1)[1] for f in facts[:2]))
                question = lines[-1].removeprefix("Question: ")
                self.replies.setdefault(question, []).append(tails)
                on_result(i, Generation(text="\n".join([*tails, "Atlantis of the Nowhere"]), completion_tokens=5))

    _cli(tmp_path, "fit", *_fixture_args(detection_dir, tiny_encoder_dir, "efit"))
    ckpt = tmp_path / "outputs/detector/graph_transformer/checkpoints/best.ckpt"
    asking = tmp_path / "unanswered"  # the calibration and test questions without answers: the endpoint gives them
    asking.mkdir()
    for split in ("train", "validation", "test"):
        records = [json.loads(line) for line in Path(detection_dir, f"{split}.jsonl").read_text().splitlines()]
        if split != "train":
            records = [{k: v for k, v in r.items() if k not in ("prediction", "confidence")} for r in records]
        (asking / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    llm = FactReader()
    with ChatCompletionServer(llm, port=0, model_name="fact-reader") as server:
        endpoint = tmp_path / "endpoint.yaml"
        endpoint.write_text(json.dumps({"data": {"init_args": {"proposer": {
            "class_path": "kglightning.llm.kaping.KAPINGAnswerer",
            "init_args": {
                "backend": {"class_path": "kglightning.llm.OpenAIChatBackend", "init_args": {
                    "base_url": server.url, "model": "fact-reader", "show_progress": False,
                    "cache_dir": str(tmp_path / "llm_cache")}},
                "encoder": {"class_path": "kglightning.data.SentenceEncoder", "init_args": {"model": tiny_encoder_dir}},
                "cache_dir": str(tmp_path / "kaping"), "constrained": False, "top_triples": 3, "show_progress": False,
            },
        }}}}))  # fmt: skip
        root = tmp_path / "trust_endpoint"
        _cli(tmp_path, "predict", *_fixture_args(str(asking), tiny_encoder_dir, "epred"), "--config", str(endpoint),
             "--config", str(ROOT / "configs/trust/select.yaml"), "--trainer.callbacks.init_args.output_dir", str(root),
             "--ckpt_path", str(ckpt))  # fmt: skip
        asked = server.request_count
    out = root / "test"  # the predicted split's folder
    rows = [json.loads(line) for line in (out / "trusted_answers.jsonl").open()]
    n_test = len(Path(detection_dir, "test.jsonl").read_text().splitlines())
    n_val = len(Path(detection_dir, "validation.jsonl").read_text().splitlines())
    # the endpoint answered the calibration and test questions (identical conversations once: the response cache)
    assert len(rows) == n_test and n_test < asked <= n_test + n_val
    assert not any("Atlantis of the Nowhere" in r["prediction"] for r in rows)  # in no fact: dropped
    answered = [r for r in rows if r["prediction"]]
    asked_of = {r["id"]: r["question"] for r in map(json.loads, (asking / "test.jsonl").read_text().splitlines())}
    assert answered and all(r["prediction"] in llm.replies[asked_of[r["id"]]] for r in answered)
    assert all(set(r["kept"]) | set(r["dropped"]) == set(r["prediction"]) for r in rows)
    report = json.loads((out / "report.json").read_text())
    assert report["rule"] == "top" and report["questions"] == n_test
