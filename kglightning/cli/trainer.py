"""The trainer side of the CLI: :class:`KGLightningCLI` for ``fit`` / ``validate`` / ``test`` / ``predict``, and
:func:`configured` for the commands that drive a trainer (``seeds``, ``compare-proxies``). Imported only by those:
the file commands never load Lightning (:mod:`kglightning.cli.entry`).

Any LightningModule and LightningDataModule can be named by ``class_path`` (subclass mode). Sizes that the data
decides and the model needs are linked with ``link_arguments`` at instantiation; a link is applied only where both
the chosen data class and the chosen model class have the argument, so one CLI serves every module.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from kglightning.cli.names import DESCRIPTION, EXTRA_SUBCOMMANDS, PROG, version_string
from kglightning.help_format import ListsHelpFormatter
from kglightning.threads import apply_threads


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


class TrainerHelpFormatter(ListsHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help (types and defaults shown), with the bullet lists of Lightning's docstrings kept as lists
    (``--ckpt_path``'s special values)."""


class KGLightningCLI(LightningCLI):
    """LightningCLI with kglightning's links between data and model, ``--version``, the extra subcommands in
    the top-level help, and help that keeps bullet lists (:class:`TrainerHelpFormatter`)."""

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        kwargs.setdefault("formatter_class", TrainerHelpFormatter)
        return super().init_parser(**kwargs)

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
        rank_zero_info(apply_threads())  # once, before the data and the model are built

    def after_fit(self) -> None:
        if not self.config[self.subcommand].get("test_after_fit"):
            return
        best = getattr(self.trainer.checkpoint_callback, "best_model_path", "")
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best" if best else None)


def configured(command: str, **kwargs: Any) -> KGLightningCLI:
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


def run_lightning(argv: list[str], from_command_line: bool) -> None:
    """``fit`` / ``validate`` / ``test`` / ``predict`` (and LightningCLI's top-level options) through
    :class:`KGLightningCLI`."""
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
