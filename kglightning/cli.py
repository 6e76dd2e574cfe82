"""``python -m kglightning``: LightningCLI (fit / validate / test / predict) plus extra subcommands.

Any LightningModule and LightningDataModule can be named by ``class_path`` (subclass mode). Sizes that the data
decides and the model needs are linked with ``link_arguments`` at instantiation; a link is applied only where both
the chosen data class and the chosen model class have the argument, so one CLI serves every module.

Extra subcommands, handled before LightningCLI:
  ``evaluate``         RoG-compatible answer metrics (+ ECE) of a predictions jsonl (see :mod:`kglightning.evaluate`)
  ``build-benchmark``  build the embedded geography/elements benchmark into a folder
  ``conformalize``     split-conformal answer sets for any predictions jsonl with confidences
                       (see :mod:`kglightning.conformal.offline`)
"""

from __future__ import annotations

import sys
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

EXTRA_SUBCOMMANDS = ("evaluate", "build-benchmark", "conformalize")


class KGLightningCLI(LightningCLI):
    """LightningCLI with kglightning's links between data and model."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.text_dim", "model.init_args.text_dim", apply_on="instantiate")
        # the data is tokenized with the model's tokenizer (e.g. ProxySFT -> ProxySFTDataModule)
        parser.link_arguments("model.init_args.model", "data.init_args.tokenizer")


def _build_benchmark(argv: list[str]) -> int:
    import argparse

    from kglightning.data.sources.embedded import build_embedded_benchmark

    p = argparse.ArgumentParser(
        prog="python -m kglightning build-benchmark",
        description="Build the embedded geography/elements KGQA benchmark (RoG format).",
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for split, path in build_embedded_benchmark(args.out, seed=args.seed).items():
        print(f"{split}: {path}")
    return 0


def main(argv: list[str] | None = None) -> Any:
    """Entry point of ``python -m kglightning`` and of the ``kglightning`` console script."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "evaluate":
        from kglightning.evaluate import main as evaluate_main

        return evaluate_main(argv[1:])
    if argv and argv[0] == "build-benchmark":
        return _build_benchmark(argv[1:])
    if argv and argv[0] == "conformalize":
        from kglightning.conformal.offline import main as conformalize_main

        return conformalize_main(argv[1:])
    return KGLightningCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        args=None if from_command_line else argv,  # None: LightningCLI reads sys.argv (and does not warn)
        parser_kwargs={"description": __doc__},
    )
