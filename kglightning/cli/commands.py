"""The extra subcommands that the CLI module itself runs: ``build-benchmark`` (no trainer), ``compare-proxies`` and
``seeds`` (both drive a trainer through :func:`kglightning.cli.trainer.configured`, imported when they run)."""

from __future__ import annotations

import json
from pathlib import Path

from kglightning.cli.names import PROG
from kglightning.help_format import DefaultsHelpFormatter


def build_benchmark(argv: list[str]) -> int:
    import argparse

    from kglightning.data.sources.embedded import build_embedded_benchmark

    p = argparse.ArgumentParser(
        formatter_class=DefaultsHelpFormatter,
        prog=f"{PROG} build-benchmark",
        description="Build the embedded geography/elements KGQA benchmark (RoG format).",
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the split, the subgraph sampling and the missing answers"
    )
    args = p.parse_args(argv)
    try:
        paths = build_embedded_benchmark(args.out, seed=args.seed)
    except (FileExistsError, NotADirectoryError, PermissionError) as e:  # a folder it may not replace: one line
        p.error(str(e))
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0


def compare_proxies(argv: list[str]) -> int:
    import argparse

    from kglightning.cli import trainer
    from kglightning.datamodules import ProxyGRPODataModule
    from kglightning.pipelines._ddp import gather_unique_rows
    from kglightning.pipelines.proxy_comparison import comparison_table, score_proxy, write_proxy_comparison

    p = argparse.ArgumentParser(
        formatter_class=DefaultsHelpFormatter,
        prog=f"{PROG} compare-proxies",
        description="Score evidence proxies on the same held-out questions: each writes one greedy evidence per "
        "question, which is grounded and scored (reward, validity, match, Hit/F1, ECE of the stated confidence "
        "against the evidence's Bayesian confidence, rank correlation). Options not listed here (e.g. "
        "--model.init_args.model, --trainer.accelerator) go to the config, as for `fit`.",
    )
    p.add_argument("--config", default="configs/proxy_grpo.yaml", help="a proxy config (ProxyGRPO or ProxySFT)")
    p.add_argument("--proxy", action="append", required=True, metavar="NAME=ADAPTER[@sft|@rl]",
                   help="a PEFT adapter folder and the instruction it was trained with (default sft); repeat")  # fmt: skip
    p.add_argument("--split", default="test", choices=["train", "validation", "test"], help="the split compared on")
    p.add_argument("--max_new_tokens", type=int, default=64, help="most tokens each proxy generates")
    p.add_argument("--confidence", default="stated", choices=["stated", "expected", "both"],
                   help="score the confidence digits the proxy wrote, their expected value under the proxy's "
                   "distribution (ConfidenceReadout), or both (one row each)")  # fmt: skip
    p.add_argument("--output_dir", default="outputs/proxy_comparison", help="where the comparison is written")
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
        cli = trainer.configured(
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


def seeds(argv: list[str]) -> int:
    import argparse
    import shutil

    from kglightning.cli import trainer
    from kglightning.metrics.cv_runs import RunLog, config_arguments
    from kglightning.metrics.cv_table import progress_line

    p = argparse.ArgumentParser(
        formatter_class=DefaultsHelpFormatter,
        prog=f"{PROG} seeds",
        description="Fit a config once per seed (with --folds K: once per fold and seed, K-fold cross-validation by "
        "question), test the best checkpoint of each run, and report every test metric's mean and standard deviation "
        "(over folds with --folds), with the validation score the checkpoint was chosen by (best/<monitor>), and a "
        "table of the detector beside each baseline. Options not listed here go to the config, as for fit.",
    )
    p.add_argument("--config", required=True, action="append",
                   help="a fit config (e.g. configs/detector.yaml); repeat it to add fragments on top, as for fit")  # fmt: skip
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the seeds each config runs with")
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
        cli = trainer.configured(
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
