"""The CLI: every config parses, --print_config output runs unchanged, subcommands dispatch."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from kglightning.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {
    "detector.yaml": "fit",
    "detector_gat.yaml": "fit",
    "detector_paper.yaml": "fit",
    "detector_kaping.yaml": "fit",
    "detector_real.yaml": "fit",
    "baseline_predict.yaml": "predict",
    "proxy_sft.yaml": "fit",
    "proxy_grpo.yaml": "fit",
    "doublycal.yaml": "predict",
    "refinement.yaml": "predict",
    "relation_scorer.yaml": "fit",
    "uag.yaml": "predict",
    "sgic.yaml": "predict",
    "sgic_finetune.yaml": "fit",
    "trust.yaml": "predict",
}


def _print_config(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        main([*args, "--print_config"])
    assert exc.value.code in (0, None)
    return out.getvalue()


def test_every_config_is_covered():
    runnable = {p.name for p in (ROOT / "configs").glob("*.yaml")} - {"serve.yaml"}  # tests/serve reads that one
    assert runnable == set(CONFIGS), "add new configs to CONFIGS so --print_config is tested"


@pytest.mark.heavy
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_print_config_roundtrip(name, tmp_path):
    sub = CONFIGS[name]
    printed = _print_config(sub, "--config", str(ROOT / "configs" / name))
    cfg = yaml.safe_load(printed)
    assert cfg["model"]["class_path"].startswith("kglightning.")
    saved = tmp_path / "printed.yaml"
    saved.write_text(printed)
    assert _print_config(sub, "--config", str(saved)) == printed


def test_class_path_swaps_the_encoder():
    printed = _print_config(
        "fit", "--config", str(ROOT / "configs/detector.yaml"), "--model.init_args.encoder", "kglightning.nn.GATEncoder"
    )
    assert yaml.safe_load(printed)["model"]["init_args"]["encoder"]["class_path"] == "kglightning.nn.GATEncoder"


def _uag_with(*fragments: str) -> dict:
    args = ["predict", "--config", str(ROOT / "configs/uag.yaml")]
    for f in fragments:
        args += ["--config", str(ROOT / "configs/uag" / f)]
    return yaml.safe_load(_print_config(*args))["model"]["init_args"]


def test_uag_fragments_parse_on_top_of_uag():
    assert {p.name for p in (ROOT / "configs/uag").glob("*.yaml")} == {
        "sampling.yaml",
        "llm_evaluator.yaml",
        "paper_grid.yaml",
    }, "test new configs/uag fragments here"
    model = _uag_with("sampling.yaml")
    assert model["sampler"]["class_path"] == "kglightning.conformal.answer_sampling.AnswerSampler"
    assert model["sampler"]["init_args"]["answerer"]["class_path"] == "kglightning.llm.kaping.KAPINGAnswerer"
    assert model["clm"]["init_args"]["delta"] == model["controller"]["init_args"]["delta"]
    model = _uag_with("llm_evaluator.yaml", "paper_grid.yaml")
    assert model["llm"]["class_path"] == "kglightning.conformal.uag.evaluator.LLMEvaluator"
    assert model["llm"]["init_args"]["constrained"] is True
    ctl = model["controller"]["init_args"]
    assert ctl["grid"] == "paper" and ctl["grid_step"] == [0.3, 0.3, 0.1] and ctl["delta"] == 0.05


@pytest.mark.parametrize("name", ["doublycal.yaml", "uag.yaml", "refinement.yaml", "detector.yaml", "proxy_sft.yaml"])
def test_pcst_fragment_parses_on_top_of_every_method(name):
    assert {p.name for p in (ROOT / "configs/data").glob("*.yaml")} == {"pcst.yaml"}, "test new fragments here"
    printed = _print_config(CONFIGS[name], "--config", str(ROOT / "configs" / name), "--config",
                            str(ROOT / "configs/data/pcst.yaml"))  # fmt: skip
    sub = yaml.safe_load(printed)["data"]["init_args"]["subgraphs"]
    assert sub["class_path"] == "kglightning.retrieval.PCSTSubgraphs" and sub["init_args"]["kg"] == "embedded"
    assert sub["init_args"]["retriever"]["init_args"]["topk_e"] == 5


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["detector.yaml", "detector_kaping.yaml"])
def test_paper_budget_fragment_parses_on_top_of_detectors(name):
    assert {p.name for p in (ROOT / "configs/detector").glob("*.yaml")} == {"paper_budget.yaml", "endpoint.yaml"}, (
        "test new fragments here"
    )
    printed = _print_config("fit", "--config", str(ROOT / "configs" / name), "--config",
                            str(ROOT / "configs/detector/paper_budget.yaml"))  # fmt: skip
    cfg = yaml.safe_load(printed)
    assert cfg["trainer"]["max_epochs"] == 300
    (stop,) = [c for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("EarlyStopping")]
    assert stop["init_args"]["patience"] == 50


@pytest.mark.heavy
def test_trust_fragment_adds_the_selection_to_a_detector_config():
    assert {p.name for p in (ROOT / "configs/trust").glob("*.yaml")} == {"select.yaml"}, "test new fragments here"
    printed = _print_config("predict", "--config", str(ROOT / "configs/detector_real.yaml"), "--config",
                            str(ROOT / "configs/trust/select.yaml"))  # fmt: skip
    cfg = yaml.safe_load(printed)
    (cb,) = cfg["trainer"]["callbacks"]
    assert cb["class_path"] == "kglightning.callbacks.SelectionCallback"
    assert cb["init_args"]["selector"]["init_args"]["rule"] == "top" and cfg["trainer"]["logger"] is False
    trust = yaml.safe_load(_print_config("predict", "--config", str(ROOT / "configs/trust.yaml")))
    main_job = yaml.safe_load(_print_config("fit", "--config", str(ROOT / "configs/detector.yaml")))
    drop = {"optimizer", "scheduler"}  # training only; the architecture must be the checkpoint's
    assert {k: v for k, v in trust["model"]["init_args"].items() if k not in drop} == {
        k: v for k, v in main_job["model"]["init_args"].items() if k not in drop
    }
    assert trust["data"]["init_args"]["proposer"] == main_job["data"]["init_args"]["proposer"]
    # an LLM behind an endpoint answers first, the detector scores, the selection keeps: one predict run
    chained = yaml.safe_load(_print_config("predict", "--config", str(ROOT / "configs/detector_kaping.yaml"), "--config",
                             str(ROOT / "configs/detector/endpoint.yaml"), "--config", str(ROOT / "configs/trust/select.yaml")))  # fmt: skip
    assert chained["data"]["init_args"]["proposer"]["init_args"]["backend"]["class_path"].endswith("OpenAIChatBackend")
    assert [c["class_path"] for c in chained["trainer"]["callbacks"]] == ["kglightning.callbacks.SelectionCallback"]
    assert trust["ckpt_path"].endswith("best.ckpt")


@pytest.mark.heavy
def test_endpoint_fragment_sends_every_llm_to_the_endpoint():
    printed = _print_config("fit", "--config", str(ROOT / "configs/detector_kaping.yaml"), "--config",
                            str(ROOT / "configs/detector/endpoint.yaml"))  # fmt: skip
    data = yaml.safe_load(printed)["data"]["init_args"]
    answerer = data["proposer"]["init_args"]
    backends = [answerer["backend"]] + [
        b["init_args"].get("backend") or b["init_args"]["answerer"]["init_args"]["backend"] for b in data["baselines"]
    ]
    assert len(backends) == 5 and {b["class_path"] for b in backends} == {"kglightning.llm.OpenAIChatBackend"}
    assert all(b["init_args"]["model"] is None for b in backends)  # $OPENAI_MODEL or the server's first model
    assert answerer["backend"]["init_args"]["structured_outputs"] == "vllm"
    assert answerer["reasoning"] is True and answerer["constrained"] is True  # kept from detector_kaping.yaml
    assert [b["init_args"].get("context") for b in data["baselines"]] == ["G", "G+RS", "G+RS+RT", None]
    # an endpoint without structured outputs: its lines grounded to node names, near misses through faiss
    printed = _print_config("fit", "--config", str(ROOT / "configs/detector_kaping.yaml"), "--config",
                            str(ROOT / "configs/detector/endpoint.yaml"), "--data.init_args.proposer.init_args.constrained",
                            "false", "--data.init_args.proposer.init_args.grounder", "kglightning.retrieval.FaissGrounder")  # fmt: skip
    answerer = yaml.safe_load(printed)["data"]["init_args"]["proposer"]["init_args"]
    assert answerer["constrained"] is False and answerer["grounder"]["init_args"]["min_similarity"] == 0.85


@pytest.mark.heavy
def test_wandb_fragment_and_sweep_parameters_parse():
    base = ["fit", "--config", str(ROOT / "configs/detector.yaml")]
    printed = _print_config(*base, "--config", str(ROOT / "configs/logger/wandb.yaml"))
    assert yaml.safe_load(printed)["trainer"]["logger"]["class_path"].endswith("WandbLogger")
    sweep = yaml.safe_load((ROOT / "configs/sweeps/detector.yaml").read_text())
    overrides = []
    for key, spec in sweep["parameters"].items():
        value = spec["values"][0] if "values" in spec else spec["min"]
        overrides.append(f"--{key}={value}")
    cfg = yaml.safe_load(_print_config(*base, *overrides))
    assert (
        cfg["model"]["init_args"]["optimizer"]["init_args"]["lr"]
        == sweep["parameters"]["model.init_args.optimizer.init_args.lr"]["min"]
    )
    for item in sweep["command"]:
        if item.startswith("configs/"):
            assert (ROOT / item).exists(), item


def test_bad_config_value_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / "configs/detector.yaml"), "--data.init_args.on_bad_record", "ignore"])
    assert exc.value.code != 0
    assert "on_bad_record" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("t_max", "max_epochs", "expected"),
    [(None, 7, 7), (3, 7, 3), (3, None, 3), (None, None, "needs T_max")],
)
def test_t_max_defaults_to_max_epochs_and_a_set_value_is_kept(t_max, max_epochs, expected, capsys):
    from jsonargparse import Namespace

    from kglightning.cli import default_t_max

    scheduler = Namespace(
        class_path="kglightning.modules.schedules.CosineAnnealingLR", init_args=Namespace(T_max=t_max)
    )
    config = Namespace(
        trainer=Namespace(max_epochs=max_epochs), model=Namespace(init_args=Namespace(scheduler=scheduler))
    )
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            default_t_max(config)
        return
    default_t_max(config)
    assert config.model.init_args.scheduler.init_args.T_max == expected
    assert ("differs" in capsys.readouterr().err) == (t_max is not None and max_epochs is not None)


@pytest.mark.heavy
def test_a_config_s_t_max_reaches_the_scheduler(tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    from kglightning.cli import KGLightningCLI

    args = ["--config", str(ROOT / "configs/detector.yaml"), "--trainer.max_epochs", "7",
            "--model.init_args.scheduler.init_args.T_max", "3", "--trainer.logger", "false"]  # fmt: skip
    cli = KGLightningCLI(args=args, run=False)
    scheduler = cli.model.scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    assert scheduler.T_max == 3 and cli.trainer.max_epochs == 7
    default = KGLightningCLI(args=["--config", str(ROOT / "configs/detector.yaml"), "--trainer.max_epochs", "7",
                                   "--trainer.logger", "false"], run=False)  # fmt: skip
    assert default.model.scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)).T_max == 7


def test_detector_real_builds_an_ungrounded_scorer_that_reads_the_answer_features(tmp_path, tiny_encoder_dir):
    """The scorer named by class_path in configs/detector_real.yaml reads the data module's answer features: a build
    rule that let the partial's default answer_features=0 stand once built it blind to them, without a word."""
    from lightning.pytorch import LightningDataModule, LightningModule

    from kglightning.cli import KGLightningCLI

    cli = KGLightningCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                         run=False, args=["--config", str(ROOT / "configs/detector_real.yaml"), "--data.init_args.data_dir",
                                          str(tmp_path), "--data.init_args.encoder", "kglightning.data.SentenceEncoder",
                                          "--data.init_args.encoder.init_args.model", tiny_encoder_dir])  # fmt: skip
    features = len(cli.datamodule.answer_features)
    assert features == 5 and cli.model.net.answer_features == features
    assert cli.model.ungrounded.answer_features == features
    assert cli.model.ungrounded.mlp[0].in_features == 2 + features  # text: false, as the config says
