"""``kglightning`` / ``python -m kglightning``: LightningCLI (fit / validate / test / predict) plus extra subcommands.

Any LightningModule and LightningDataModule can be named by ``class_path`` (subclass mode). Sizes that the data
decides and the model needs are linked with ``link_arguments`` at instantiation; a link is applied only where both
the chosen data class and the chosen model class have the argument, so one CLI serves every module.

The extra subcommands (:data:`EXTRA_SUBCOMMANDS`) are dispatched before LightningCLI parses anything; they are
listed in the top-level ``--help`` all the same. :func:`main` returns the process exit status: 0 on success, 2 when
the input data is bad (the one-line ``file:line: field ...`` message is printed instead of a traceback; set
``KGLIGHTNING_TRACEBACK=1`` to see the traceback too).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

import kglightning
from kglightning.data.records import RecordError
from kglightning.fileio import OutputOverInputError

PROG = "kglightning"

#: subcommands handled by kglightning itself, with their one-line help
EXTRA_SUBCOMMANDS = {
    "evaluate": "RoG-compatible answer metrics (Hit, F1, EM, ECE, ...) of a predictions jsonl",
    "build-benchmark": "build the embedded geography/elements KGQA benchmark into a folder",
    "build-subgraphs": "RoG records with G-Retriever PCST subgraphs from your own KG (triples) and questions",
    "conformalize": "split-conformal answer sets for any predictions jsonl with confidences",
    "select": "keep the answers of a scored predictions jsonl so that at most alpha of the kept are hallucinated "
    "(FDR, Learn-Then-Test or per question, per group), or check such a rule over random splits",
    "import-predictions": "RoG records with a KGQA system's answers: RoG / GNN-RAG prompts, GCR beams, or any "
    "predictions jsonl joined onto RoG records by id",
    "compare-proxies": "score DoublyCal evidence proxies (e.g. SFT vs GRPO adapters) on the same held-out questions",
    "cache": "list the cache's entries, their sizes (du), or clean what killed runs left and what is old or over a "
    "size",
    "seeds": "fit and test a config once per seed (--folds K: per fold and seed) and report each test metric's mean "
    "and standard deviation",
}

DESCRIPTION = (
    "kglightning: trustworthy question answering over knowledge graphs with LLMs. fit / validate / test / predict "
    "run a LightningModule and a LightningDataModule named by class_path in a YAML config (--config); evaluate, "
    "build-benchmark, build-subgraphs, conformalize, select and import-predictions work on files; compare-proxies scores DoublyCal evidence proxies; "
    "seeds repeats a fit over seeds (and folds). Run any "
    "subcommand with --help for its options."
)

#: errors that mean "the input is wrong", reported as one line with exit status 2
USER_INPUT_ERRORS: tuple[type[BaseException], ...] = (
    RecordError,
    OutputOverInputError,
    FileNotFoundError,  # a path the user gave names nothing,
    FileExistsError,  # ... something that may not be replaced,
    IsADirectoryError,  # ... a folder where a file is read or written,
    NotADirectoryError,  # ... or passes through a file,
    PermissionError,  # ... or may not be read or written
)


def version_string() -> str:
    """``kglightning <version>`` (the installed distribution's version, else the package's ``__version__``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{PROG} {version(PROG)}"
    except PackageNotFoundError:
        return f"{PROG} {kglightning.__version__}"


def default_t_max(config: Any) -> None:
    """An epoch-wise scheduler with a ``T_max`` left unset (:class:`kglightning.modules.schedules.CosineAnnealingLR`)
    spans the run: ``T_max`` defaults to ``trainer.max_epochs``. A ``T_max`` the user set is kept (a note is printed
    when it differs from ``max_epochs``). torch's own ``CosineAnnealingLR`` requires ``T_max`` at parse time.

    Raises:
        ValueError: ``T_max`` is unset and so is ``trainer.max_epochs``: nothing says how long the schedule is.
    """
    model = config.get("model")
    init = model.get("init_args") if model is not None and hasattr(model, "get") else None
    scheduler = init.get("scheduler") if init is not None and hasattr(init, "get") else None
    if scheduler is None or not hasattr(scheduler, "get") or scheduler.get("class_path") is None:
        return
    args = scheduler.get("init_args")
    if args is None or "T_max" not in args:  # a scheduler without T_max
        return
    max_epochs = config.get("trainer", {}).get("max_epochs")
    name = str(scheduler["class_path"]).rsplit(".", 1)[-1]
    if args["T_max"] is None:
        if max_epochs is None or max_epochs < 0:
            raise ValueError(
                f"{name} needs T_max (model.init_args.scheduler.init_args.T_max) or trainer.max_epochs: neither is set"
            )
        args["T_max"] = max_epochs
    elif max_epochs is not None and args["T_max"] != max_epochs:
        print(f"note: {name} T_max={args['T_max']} (set) differs from trainer.max_epochs={max_epochs}; kept",
              file=sys.stderr)  # fmt: skip


class KGLightningCLI(LightningCLI):
    """LightningCLI with kglightning's links between data and model, ``--version`` and the extra subcommands in
    the top-level help."""

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """As LightningCLI parses, less its warning for ``args`` given while ``sys.argv`` has arguments: ``seeds``,
        ``compare-proxies`` and in-process calls pass ``args`` on purpose, and that warning prints every argument,
        an API key given as a value among them."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            super().parse_arguments(parser, args)

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        self.parser.add_argument("--version", action="version", version=version_string())
        if add_subcommands:
            # listed for --help only: main() dispatches these before LightningCLI parses the command line
            subcommands = self.parser._subcommands_action
            for name, help_text in EXTRA_SUBCOMMANDS.items():
                sub = LightningArgumentParser(description=help_text, prog=f"{PROG} {name}")
                subcommands.add_subcommand(name, sub, help=help_text)

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.text_dim", "model.init_args.text_dim", apply_on="instantiate")
        parser.link_arguments("data.num_answer_features", "model.init_args.answer_features", apply_on="instantiate")
        # the data is tokenized with the model's tokenizer (e.g. ProxySFT -> ProxySFTDataModule)
        parser.link_arguments("model.init_args.model", "data.init_args.tokenizer")
        # ... and rendered as the model will see them at predict time (ProxySFT.prompt_format -> ProxySFTDataModule)
        parser.link_arguments("model.init_args.prompt_format", "data.init_args.prompt_format")
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="fit only: test the best checkpoint (or the last weights, without a checkpoint) in the same process "
            "once training ends, so the data and the model are loaded once",
        )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        default_t_max(config)

    def after_fit(self) -> None:
        if not self.config[self.subcommand].get("test_after_fit"):
            return
        best = getattr(self.trainer.checkpoint_callback, "best_model_path", "")
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best" if best else None)


def _build_benchmark(argv: list[str]) -> int:
    import argparse

    from kglightning.data.sources.embedded import build_embedded_benchmark

    p = argparse.ArgumentParser(
        prog=f"{PROG} build-benchmark",
        description="Build the embedded geography/elements KGQA benchmark (RoG format).",
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        paths = build_embedded_benchmark(args.out, seed=args.seed)
    except (FileExistsError, NotADirectoryError, PermissionError) as e:  # a folder it may not replace: one line
        p.error(str(e))
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0


def _configured(command: str, **kwargs: Any) -> KGLightningCLI:
    """A :class:`KGLightningCLI` that only instantiates (``run=False``), for subcommands that drive the trainer."""
    return KGLightningCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        run=False,
        parser_kwargs={"prog": f"{PROG} {command}"},
        **kwargs,
    )


def _compare_proxies(argv: list[str]) -> int:
    import argparse

    from kglightning.datamodules import ProxyGRPODataModule
    from kglightning.pipelines._ddp import gather_unique_rows
    from kglightning.pipelines.proxy_comparison import comparison_table, score_proxy, write_proxy_comparison

    p = argparse.ArgumentParser(
        prog=f"{PROG} compare-proxies",
        description="Score evidence proxies on the same held-out questions: each writes one greedy evidence per "
        "question, which is grounded and scored (reward, validity, match, Hit/F1, ECE of the stated confidence "
        "against the evidence's Bayesian confidence, rank correlation). Options not listed here (e.g. "
        "--model.init_args.model, --trainer.accelerator) go to the config, as for `fit`.",
    )
    p.add_argument("--config", default="configs/proxy_grpo.yaml", help="a proxy config (ProxyGRPO or ProxySFT)")
    p.add_argument("--proxy", action="append", required=True, metavar="NAME=ADAPTER[@sft|@rl]",
                   help="a PEFT adapter folder and the instruction it was trained with (default sft); repeat")  # fmt: skip
    p.add_argument("--split", default="test", choices=["train", "validation", "test"])
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--confidence", default="stated", choices=["stated", "expected", "both"],
                   help="score the confidence digits the proxy wrote, their expected value under the proxy's "
                   "distribution (ConfidenceReadout), or both (one row each)")  # fmt: skip
    p.add_argument("--output_dir", default="outputs/proxy_comparison")
    args, overrides = p.parse_known_args(argv)
    proxies: dict[str, tuple[str, str]] = {}
    for spec in args.proxy:
        name, sep, rest = spec.partition("=")
        adapter, _, instruction = rest.partition("@")
        if not sep or not name or not adapter or instruction not in ("", "sft", "rl"):
            p.error(f"--proxy {spec!r}: expected NAME=ADAPTER, NAME=ADAPTER@sft or NAME=ADAPTER@rl")
        proxies[name] = (adapter, instruction or "sft")
    readouts = ["stated", "expected"] if args.confidence == "both" else [args.confidence]
    runs = [(f"{name}-expected" if r == "expected" and len(readouts) > 1 else name, spec, r)
            for name, spec in proxies.items() for r in readouts]  # fmt: skip
    results, details, main_process = {}, {}, True
    for name, (adapter, instruction), readout in runs:
        generation = json.dumps(
            {"num_evidence": 1, "decoding": "greedy", "max_new_tokens": args.max_new_tokens, "confidence": readout}
        )
        cli = _configured(
            "compare-proxies",
            save_config_callback=None,  # nothing is trained; the table says what was compared
            args=[
                "--config",
                args.config,
                *overrides,
                "--model.init_args.adapter_path",
                adapter,
                "--model.init_args.prompt_format.instruction",
                instruction,
                "--model.init_args.generation",
                generation,
                "--data.init_args.predict_split",
                args.split,
                "--trainer.logger",
                "false",
                "--trainer.callbacks",
                "[]",
            ],  # fmt: skip
        )
        dm = cli.datamodule
        if not isinstance(dm, ProxyGRPODataModule):
            raise TypeError(f"compare-proxies needs a ProxyGRPODataModule in {args.config}, got {type(dm).__name__}")
        predictions = cli.trainer.predict(cli.model, datamodule=dm)
        if predictions is None:  # a spawning strategy returns nothing to the launching process
            raise ValueError(
                f"compare-proxies got no predictions back from trainer.predict under strategy "
                f"{type(cli.trainer.strategy).__name__}: use --trainer.strategy ddp (not ddp_spawn) for several devices"
            )
        local = [row for batch in predictions for row in batch]
        records = {r.id: r for r in dm.read_split(args.split)}
        order = {qid: i for i, qid in enumerate(records)}
        # under DDP each process predicts its shard: every question once, in the split's order
        rows = sorted(gather_unique_rows(local), key=lambda row: order.get(row["id"], len(order)))
        results[name], details[name] = score_proxy(rows, records, dm.gold_evidence(args.split), dm.builder)
        main_process = cli.trainer.is_global_zero
    if main_process:
        files = write_proxy_comparison(results, details, args.output_dir)
        print(comparison_table(results))
        print(f"wrote {files['table']}, {files['json']} and {files['plot']}")
    return 0


def _seeds(argv: list[str]) -> int:
    import argparse
    import shutil

    from kglightning.metrics.cv_runs import RunLog, config_arguments
    from kglightning.metrics.cv_table import progress_line

    p = argparse.ArgumentParser(
        prog=f"{PROG} seeds",
        description="Fit a config once per seed (with --folds K: once per fold and seed, K-fold cross-validation by "
        "question), test the best checkpoint of each run, and report every test metric's mean and standard deviation "
        "(over folds with --folds), with the validation score the checkpoint was chosen by (best/<monitor>), and a "
        "table of the detector beside each baseline. Options not listed here go to the config, as for fit.",
    )
    p.add_argument("--config", required=True, action="append",
                   help="a fit config (e.g. configs/detector.yaml); repeat it to add fragments on top, as for fit")  # fmt: skip
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--folds", type=int, default=None, metavar="K",
                   help="K-fold cross-validation by question: run every fold 0..K-1 with every seed, setting the data "
                   "module's folds (data.init_args.folds, kglightning.data.folds.KFold)")  # fmt: skip
    p.add_argument("--fold-seed", type=int, default=None, help="with --folds: the seed of the fold assignment "
                   "(default: the config's folds.seed, else 0)")  # fmt: skip
    p.add_argument("--fold-pool", nargs="+", default=None, choices=["train", "validation", "test"],
                   help="with --folds: the published splits pooled before folding, e.g. train validation to keep the "
                   "test split untouched (default: the config's folds.pool, else all three)")  # fmt: skip
    p.add_argument("--validation-fraction", type=float, default=None, help="with --folds: the share of each "
                   "fold's non-test questions that validates (default: the config's, else 0.2)")  # fmt: skip
    p.add_argument(
        "--output",
        default=None,
        help="a .json file of every run's metrics and the summary (written after every run), a .md beside it with "
        "the tables, and a .png with F1 and AUC-PR per method (mean, std), when the test metrics have them",
    )
    p.add_argument("--resume", action="store_true",
                   help="skip the runs the --output json already holds (written with the same config and options)")  # fmt: skip
    args, overrides = p.parse_known_args(argv)
    fold_options = {"seed": args.fold_seed, "pool": args.fold_pool, "validation_fraction": args.validation_fraction}
    if args.folds is None and any(v is not None for v in fold_options.values()):
        p.error("--fold-seed, --fold-pool and --validation-fraction need --folds")
    if args.folds is not None and args.folds < 2:
        p.error(f"--folds must be at least 2, got {args.folds}")
    if args.resume and not args.output:
        p.error("--resume needs --output: the json file of the runs done so far")
    arguments = config_arguments(args.config, overrides, folds=args.folds, seeds=args.seeds,
                                 **{f"fold_{k}": v for k, v in fold_options.items()})  # fmt: skip
    try:
        log = RunLog.resume(args.output, arguments) if args.resume else RunLog(arguments, args.output)
    except ValueError as err:  # written with other arguments: say so, as for any bad option
        p.error(str(err))
    fold_args = [x for k, v in fold_options.items() if v is not None
                 for x in (f"--data.init_args.folds.{k}", json.dumps(v))]  # fmt: skip
    pairs, configs = log.pairs(), [x for c in args.config for x in ("--config", c)]
    for n, (fold, seed) in enumerate(pairs, start=1):
        label = f"[{n}/{len(pairs)}] " + (f"fold {fold}/{args.folds}, " if fold is not None else "") + f"seed {seed}"
        if log.has(fold, seed):
            print(progress_line(f"{label} (done before, kept)", log.run(fold, seed)), flush=True)
            continue
        folding = [] if fold is None else ["--data.init_args.folds.k", str(args.folds),
                                           "--data.init_args.folds.fold", str(fold), *fold_args]  # fmt: skip
        cli = _configured(
            "seeds",
            save_config_kwargs={"overwrite": True},
            args=[*configs, *overrides, *folding, "--seed_everything", str(seed)],
        )
        folds = getattr(cli.datamodule, "folds", None)
        if fold is not None and (folds is None or (folds.k, folds.fold) != (args.folds, fold)):
            name = type(cli.datamodule).__name__
            raise ValueError(f"--folds needs a data module with folds (a KGQADataModule); {name} serves {folds!r}")
        if folds is not None:  # what the folds are, from the config and the options (the fold itself per run)
            log.fold_settings = {k: v for k, v in vars(folds).items() if k != "fold" or fold is None}
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        best_path = getattr(cli.trainer.checkpoint_callback, "best_model_path", "")
        best = "best" if best_path else None
        (metrics,) = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path=best, verbose=False)
        if best_path and cli.trainer.is_global_zero:  # the next run overwrites best.ckpt: keep this one beside it
            tag = f"fold{fold}-seed{seed}" if fold is not None else f"seed{seed}"
            shutil.copyfile(best_path, Path(best_path).with_name(f"{Path(best_path).stem}-{tag}.ckpt"))
        result = {k: float(v) for k, v in metrics.items()}
        monitor = getattr(cli.trainer.checkpoint_callback, "monitor", None)
        if best_path and monitor and cli.trainer.checkpoint_callback.best_model_score is not None:
            # what the checkpoint was chosen by: compare configs on it, not on the test metrics
            result[f"best/{monitor}"] = float(cli.trainer.checkpoint_callback.best_model_score)
        log.add(fold, seed, result)  # written now: a later run that fails loses nothing done
        print(progress_line(label, result), flush=True)
    print(log.tables())
    if args.output:
        files = log.write_outputs(title=" + ".join(Path(c).stem for c in args.config))
        print("wrote " + ", ".join(map(str, files)))
    return 0


def _dispatch(argv: list[str], from_command_line: bool) -> int:
    if argv and argv[0] == "evaluate":
        from kglightning.evaluate import main as evaluate_main

        return int(evaluate_main(argv[1:]) or 0)
    if argv and argv[0] == "build-benchmark":
        return _build_benchmark(argv[1:])
    if argv and argv[0] == "compare-proxies":
        return _compare_proxies(argv[1:])
    if argv and argv[0] == "seeds":
        return _seeds(argv[1:])
    if argv and argv[0] == "build-subgraphs":
        from kglightning.retrieval.build_subgraphs import main as build_subgraphs_main

        return build_subgraphs_main(argv[1:], prog=f"{PROG} build-subgraphs")
    if argv and argv[0] == "import-predictions":
        from kglightning.data.sources.predictions_import import main as import_main

        return import_main(argv[1:], prog=f"{PROG} import-predictions")
    if argv and argv[0] == "conformalize":
        from kglightning.conformal.offline import main as conformalize_main

        return int(conformalize_main(argv[1:]) or 0)
    if argv and argv[0] == "cache":
        from kglightning.data.store.cache_admin import main as cache_main

        return cache_main(argv[1:], prog=f"{PROG} cache")
    if argv and argv[0] == "select":
        from kglightning.conformal.select_cli import main as select_main

        return select_main(argv[1:], prog=f"{PROG} select")
    KGLightningCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        args=None if from_command_line else argv,  # None: LightningCLI reads sys.argv (and does not warn)
        parser_kwargs={"description": DESCRIPTION, "prog": PROG},
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m kglightning`` and of the ``kglightning`` console script.

    Returns:
        The exit status: 0 on success, 2 on bad input data (a :data:`USER_INPUT_ERRORS` error, printed as one
        line to stderr). Other errors propagate with their traceback. ``--help``, ``--version`` and argument
        errors exit through ``SystemExit`` as argparse does.

    Example:
        What ``python -m kglightning evaluate --predictions ...`` does on the command line: the command's output, then
        its exit status (2, with one line on stderr, for input it cannot read):

        >>> import json, tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> with open(f"{tmp.name}/predictions.jsonl", "w") as f:
        ...     print(json.dumps({"id": "q1", "prediction": ["Paris", "Lyon"], "ground_truth": ["Paris"]}), file=f)
        >>> main(["evaluate", "--predictions", f"{tmp.name}/predictions.jsonl"])
        Accuracy: 100.0 Hit: 100.0 Hit1: 100.0 F1: 66.66666666666666 Precision: 50.0 Recall: 100.0
        Strict-F1: 66.66666666666666 Strict-Precision: 50.0 Strict-Recall: 100.0 EM: 0.0
        0
        >>> main(["evaluate", "--predictions", f"{tmp.name}/missing.jsonl"])
        2
        >>> tmp.cleanup()

        ``main(["fit", "--config", "configs/detector.yaml"])`` runs the main job the same way.
    """
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(argv, from_command_line)
    except USER_INPUT_ERRORS as e:
        if os.environ.get("KGLIGHTNING_TRACEBACK", "") not in ("", "0"):
            raise
        print(f"error: {e}", file=sys.stderr)
        print("(set KGLIGHTNING_TRACEBACK=1 to see where it was raised)", file=sys.stderr)
        return 2
