"""UAGReasoner run by a Trainer and through the CLI, with the tiny sentence encoder on the embedded benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest

from kglightning.conformal.uag import UAGController, covers, members_at, score_questions
from kglightning.data import SentenceEncoder
from kglightning.data.sources.embedded import build_embedded_benchmark
from kglightning.datamodules import KGQADataModule
from kglightning.pipelines import UAGReasoner

ROOT = Path(__file__).resolve().parents[2]


# every test here reads the module's embedded-benchmark build (seconds): the module is left out of the quick loop
pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("uag_bench")
    build_embedded_benchmark(folder, seed=0)
    return str(folder)


def _run(tmp_path, bench_dir, tiny_encoder_dir, **kw) -> tuple[UAGReasoner, KGQADataModule]:
    model = UAGReasoner(
        encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
        controller=UAGController(grid_step=0.25),
        output_dir=str(tmp_path / "out"),
        cache_dir=str(tmp_path / "cache"),
        progress=False,
        **kw,
    )
    data = KGQADataModule(data_dir=bench_dir, max_records=60, batch_size=32)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    trainer.predict(model, datamodule=data, return_predictions=False)
    return model, data


@pytest.mark.heavy
def test_predict_writes_sets_selection_and_sweep(tmp_path, bench_dir, tiny_encoder_dir):
    model, data = _run(tmp_path, bench_dir, tiny_encoder_dir, alpha=0.4, sweep_alphas=[0.3, 0.5])
    out = tmp_path / "out" / "test"  # the predicted split's folder
    ltt = json.loads((out / "ltt.json").read_text())
    main = model.selections[0.4]
    assert ltt["main"] == json.loads(json.dumps(main.summary()))
    assert ltt["main"]["n_quantile"] + ltt["main"]["n_calibration"] + ltt["main"]["n_selection"] == 60
    assert set(ltt["levels"]) == {"0.4", "0.3", "0.5"} and set(ltt["baselines"]["0.4"]) == {"split_cp", "top_k"}
    rows = [json.loads(line) for line in (out / "predictions.jsonl").open()]
    test = data.split_records("test")
    assert [r["id"] for r in rows] == [r.id for r in test]
    # the traversal's sets are the grid's sets at the selected thresholds
    scores = score_questions(test, model.cache, max_hops=3, progress=False)
    for row, s in zip(rows, scores):
        member = members_at(s, *main.selected_thresholds)
        assert set(row["prediction"]) == {s.entities[i] for i in member.nonzero().flatten().tolist()}
        assert row["covered"] == covers(s, member) == bool(set(row["prediction"]) & set(row["a_entity"]))
        assert row["set_size"] == len(row["prediction"]) and row["abstained"] == main.abstained
        assert set(row["baselines"]) == {"split_cp", "top_k"}
        assert set(row["paths"]) <= set(row["prediction"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["questions_without_candidates"] == sum(r["num_candidates"] == 0 for r in rows)
    assert ltt["calibration_questions_without_candidates"] == model.empty_pools
    assert metrics["uag"]["ecr"] == pytest.approx(sum(r["covered"] for r in rows) / len(rows))
    assert metrics["uag"]["apss"] == pytest.approx(sum(r["set_size"] for r in rows) / len(rows))
    sweep = json.loads((out / "sweep.json").read_text())
    assert [r["alpha"] for r in sweep["results"]] == [0.3, 0.5]
    assert "| 0.3 | ≥ 70 |" in (out / "sweep.md").read_text() and (out / "coverage_vs_alpha.png").stat().st_size > 0
    with pytest.raises(RuntimeError, match="nothing to train"):
        model.configure_optimizers()
    written = {p for p in out.rglob("*") if p.is_file()}
    assert written - set(model.output_files()) == {out / "ltt.json"}  # the list names every output file
    model.on_predict_start()  # a second run starts: the first run's outputs are gone until it writes its own
    assert {p for p in out.rglob("*") if p.is_file()} == {out / "ltt.json"}


@pytest.mark.heavy
def test_unreachable_alpha_abstains_with_the_full_pool(tmp_path, bench_dir, tiny_encoder_dir):
    model, _ = _run(tmp_path, bench_dir, tiny_encoder_dir, alpha=0.01)
    assert model.selections[0.01].abstained
    rows = [json.loads(line) for line in (tmp_path / "out/test/predictions.jsonl").open()]
    assert all(r["abstained"] and r["set_size"] == r["num_candidates"] for r in rows)
    assert all(r["baselines"]["split_cp"]["abstained"] for r in rows)  # 20 questions: rank 20 * 0.99 > n
    assert json.loads((tmp_path / "out/test/ltt.json").read_text())["main"]["abstained"] is True


def test_predicting_on_the_calibration_split_is_refused(tmp_path, bench_dir, tiny_encoder_dir):
    model = UAGReasoner(encoder=SentenceEncoder(tiny_encoder_dir), cache_dir=str(tmp_path), progress=False)
    data = KGQADataModule(data_dir=bench_dir, max_records=30, predict_split="validation")
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match="calibrates on the 'validation' split"):
        trainer.predict(model, datamodule=data, return_predictions=False)


def test_missing_relation_scorer_folder_is_a_clear_error(tmp_path):
    model = UAGReasoner(encoder=SentenceEncoder(str(tmp_path / "nope")), cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="relation_scorer.yaml"):
        _ = model.cache


@pytest.mark.e2e
@pytest.mark.parametrize("devices", [1, 2])
def test_cli_predict_with_alpha_flag(devices, bench_dir, tiny_encoder_dir, tmp_path):
    """``predict --config configs/uag.yaml --model.alpha 0.4`` as a user runs it; rows of 2 DDP ranks are gathered."""
    env = dict(os.environ, KGLIGHTNING_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    args = {
        "--config": str(ROOT / "configs/uag.yaml"),
        "--model.alpha": "0.4",
        "--model.encoder.model": tiny_encoder_dir,
        "--model.controller.init_args.grid_step": "0.25",
        "--data.data_dir": bench_dir,
        "--data.max_records": "45",
        "--trainer.enable_progress_bar": "false",
        "--trainer.devices": str(devices),
    }
    if devices > 1:
        args["--trainer.strategy"] = "ddp"
    cmd = [sys.executable, "-m", "kglightning", "predict", *(x for kv in args.items() for x in kv)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    output = proc.stdout + proc.stderr
    assert "UAG at alpha=0.4" in output and output.count("alpha sweep:") == 1
    folder = tmp_path / "outputs/uag/test"
    rows = [json.loads(line) for line in (folder / "predictions.jsonl").open()]
    assert len(rows) == len({r["id"] for r in rows}) == 45
    assert json.loads((folder / "ltt.json").read_text())["main"]["alpha"] == 0.4
    assert (folder / "sweep.md").exists() and (folder / "coverage_vs_alpha.png").exists()


@pytest.mark.heavy
def test_llm_evaluator_with_a_local_model(tmp_path, bench_dir, tiny_encoder_dir, tiny_chat_model_dir):
    """Eq. 6 with a (tiny, random) local chat model: one call per question, answers cached, a rerun reads them."""
    from kglightning.conformal.uag.evaluator import LLMEvaluator
    from kglightning.llm.backends import LocalHFBackend

    def evaluator():
        backend = LocalHFBackend(
            tiny_chat_model_dir, batch_size=8, show_progress=False, cache_dir=str(tmp_path / "llm")
        )
        return LLMEvaluator(backend, max_paths=3, max_new_tokens=4)

    llm = evaluator()
    model, _ = _run(tmp_path, bench_dir, tiny_encoder_dir, alpha=0.4, llm=llm)
    rows = [json.loads(line) for line in (tmp_path / "out/test/predictions.jsonl").open()]
    answered = [r for r in rows if r["llm_answer"] is not None]
    assert len(answered) + llm.num_no_answer >= len(rows)  # pool and test questions are asked once each
    assert (tmp_path / "llm/responses.jsonl").exists()
    again = evaluator()
    model2, _ = _run(tmp_path, bench_dir, tiny_encoder_dir, alpha=0.4, llm=again)
    rows2 = [json.loads(line) for line in (tmp_path / "out/test/predictions.jsonl").open()]
    assert [r["llm_answer"] for r in rows2] == [r["llm_answer"] for r in rows]
    assert model2.selections[0.4].summary() == model.selections[0.4].summary()
    metrics = json.loads((tmp_path / "out/test/metrics.json").read_text())
    assert metrics["llm_no_answer"] == again.num_no_answer == llm.num_no_answer


def test_constrained_llm_evaluator_answers_with_a_candidate(tmp_path, bench_dir, tiny_encoder_dir, tiny_chat_model_dir):
    """With constrained=True, Phi is one of the question's candidate entities (or no answer)."""
    from kglightning.conformal.uag.evaluator import LLMEvaluator
    from kglightning.llm.backends import LocalHFBackend

    backend = LocalHFBackend(tiny_chat_model_dir, batch_size=8, show_progress=False, cache_dir=str(tmp_path / "llm"))
    llm = LLMEvaluator(backend, max_paths=3, max_new_tokens=16, constrained=True)
    data = KGQADataModule(data_dir=bench_dir, max_records=12)
    records = data.split_records("test")
    cache = _unfitted(tmp_path, tiny_encoder_dir, 0.25, "out").cache
    scores = score_questions(records, cache, max_hops=2, progress=False)
    answers = llm.answers(records, scores)
    assert sum(a is not None for a in answers) + llm.num_no_answer == len(records)
    assert sum(a is not None for a in answers) > 0
    for a, s in zip(answers, scores):
        assert a is None or a in s.entities


def _unfitted(tmp_path, tiny_encoder_dir, grid_step: float, out: str) -> UAGReasoner:
    return UAGReasoner(
        encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
        controller=UAGController(grid_step=grid_step),
        alpha=0.4,
        sweep_alphas=[0.3],
        output_dir=str(tmp_path / out),
        cache_dir=str(tmp_path / "cache"),
        progress=False,
    )


@pytest.mark.heavy
def test_fitted_selections_live_in_the_state_dict(tmp_path, bench_dir, tiny_encoder_dir, monkeypatch):
    """A checkpoint saved after predict reproduces the sets in a fresh module without calibrating again."""
    model, data = _run(tmp_path, bench_dir, tiny_encoder_dir, alpha=0.4, sweep_alphas=[0.3])
    first = [json.loads(line) for line in (tmp_path / "out/test/predictions.jsonl").open()]
    state = model.state_dict()
    assert set(state["_extra_state"]["selections"]) == {0.4, 0.3}  # keyed by the float alpha

    fresh = _unfitted(tmp_path, tiny_encoder_dir, 0.25, "out2")
    fresh.load_state_dict(state)
    assert fresh.selections[0.4].summary() == model.selections[0.4].summary()

    def no_calibration(*args, **kwargs):
        raise AssertionError("calibrated again although the loaded selections match")

    monkeypatch.setattr(fresh, "calibrate", no_calibration)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    trainer.predict(fresh, datamodule=data, return_predictions=False)
    second = [json.loads(line) for line in (tmp_path / "out2/test/predictions.jsonl").open()]
    assert [r["prediction"] for r in second] == [r["prediction"] for r in first]
    assert [r["baselines"] for r in second] == [r["baselines"] for r in first]
    assert json.loads((tmp_path / "out2/test/ltt.json").read_text())["from_loaded_state"] is True

    # other settings (another grid) invalidate the loaded selections: it calibrates again
    other = _unfitted(tmp_path, tiny_encoder_dir, 0.5, "out3")
    other.load_state_dict(state)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    trainer.predict(other, datamodule=data, return_predictions=False)
    assert json.loads((tmp_path / "out3/test/ltt.json").read_text())["from_loaded_state"] is False

    # the same settings on other calibration questions: it calibrates again
    again = _unfitted(tmp_path, tiny_encoder_dir, 0.25, "out4")
    again.load_state_dict(state)
    fewer = KGQADataModule(data_dir=bench_dir, max_records=50, batch_size=32)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    trainer.predict(again, datamodule=fewer, return_predictions=False)
    assert json.loads((tmp_path / "out4/test/ltt.json").read_text())["from_loaded_state"] is False


def test_a_retrained_scorer_or_another_llm_setting_invalidates_the_fitted_selections(
    tmp_path, tiny_encoder_dir, tiny_chat_model_dir
):
    import shutil

    from kglightning.conformal.uag.evaluator import LLMEvaluator
    from kglightning.llm.backends import LocalHFBackend

    folder = shutil.copytree(tiny_encoder_dir, tmp_path / "scorer")
    before = _unfitted(tmp_path, str(folder), 0.25, "a").fit_settings()
    assert _unfitted(tmp_path, str(folder), 0.25, "a").fit_settings() == before
    weights = next(folder.rglob("*.safetensors"))
    st = weights.stat()
    with weights.open("ab") as f:
        f.write(b"\0")  # retrained and exported to the same folder
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert _unfitted(tmp_path, str(folder), 0.25, "a").fit_settings() != before

    def with_llm(**kw):
        model = _unfitted(tmp_path, tiny_encoder_dir, 0.25, "b")
        model.llm = LLMEvaluator(LocalHFBackend(tiny_chat_model_dir, show_progress=False), **kw)
        return model.fit_settings()

    assert with_llm(max_new_tokens=4) != with_llm(max_new_tokens=8)
    assert with_llm(max_paths=3) != with_llm(max_paths=4)
    assert with_llm() != _unfitted(tmp_path, tiny_encoder_dir, 0.25, "b").fit_settings()


@pytest.mark.e2e
def test_clm_and_lofree_on_sampled_llm_answers(tmp_path, bench_dir, tiny_encoder_dir, tiny_chat_model_dir):
    """A KAPING sampler over the tiny local model: CLM and LoFreeCP fitted on UAG's splits, in the rows and sweep."""
    from kglightning.conformal.answer_sampling import AnswerSampler
    from kglightning.conformal.clm import CLM
    from kglightning.llm.backends import LocalHFBackend
    from kglightning.llm.backends.base import GenerationParams
    from kglightning.llm.kaping import KAPINGAnswerer

    backend = LocalHFBackend(tiny_chat_model_dir, batch_size=16, show_progress=False, cache_dir=str(tmp_path / "llm"))
    answerer = KAPINGAnswerer(
        backend,
        encoder=SentenceEncoder(tiny_encoder_dir, show_progress=False),
        cache_dir=str(tmp_path / "cache"),
        top_triples=3,
        max_answers=1,
        generation=GenerationParams(max_new_tokens=12),
        show_progress=False,
    )
    sampler = AnswerSampler(answerer, samples=2)
    model, data = _run(
        tmp_path, bench_dir, tiny_encoder_dir, alpha=0.4, sweep_alphas=[0.3, 0.5], sampler=sampler,
        clm=CLM(grid_size=3),
    )  # fmt: skip
    out = tmp_path / "out" / "test"  # the predicted split's folder
    rows = [json.loads(line) for line in (out / "predictions.jsonl").open()]
    assert len(rows) == len(data.split_records("test"))
    assert sampler.counts["questions"] == 60 + len(rows) and sampler.counts["samples"] == 2 * (60 + len(rows))
    for row, full in zip(rows, model.rows):
        assert len(row["sampled_answers"]) == 2
        for m in ("split_cp_llm", "top_k_llm", "clm", "lofree_cp"):
            pred = row["sampling_baselines"][m]["prediction"]
            assert set(pred) <= set(row["sampled_answers"]) - {""}
            assert full["sweep"]["0.4"][m] == [bool(set(pred) & set(row["a_entity"])), len(pred)]
    ltt = json.loads((out / "ltt.json").read_text())
    assert set(ltt["sampling_baselines"]["0.3"]) == {"split_cp_llm", "top_k_llm", "clm", "lofree_cp"}
    sweep = json.loads((out / "sweep.json").read_text())
    for entry in sweep["results"]:
        for m in ("split_cp_llm", "top_k_llm", "clm", "lofree_cp"):
            pairs = [r["sweep"][str(entry["alpha"])][m] for r in model.rows]
            assert entry[m]["ecr"] == pytest.approx(sum(c for c, _ in pairs) / len(rows))
    assert "CLM ECR" in (out / "sweep.md").read_text() and "LoFreeCP APSS" in (out / "sweep.md").read_text()
    assert json.loads((out / "metrics.json").read_text())["sampler"]["samples"] == sampler.counts["samples"]
