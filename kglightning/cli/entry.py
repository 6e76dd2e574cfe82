"""``kglightning`` / ``python -m kglightning``: what runs before any subcommand, importing neither Lightning nor
torch.

``fit`` / ``validate`` / ``test`` / ``predict`` go to LightningCLI (:mod:`kglightning.cli.trainer`, imported then).
The extra subcommands (:data:`EXTRA_SUBCOMMANDS`) are dispatched before LightningCLI is imported, each importing
what it computes with when it runs: ``kglightning select --help`` or ``kglightning cache du`` start in a fraction of
the seconds that importing Lightning takes. The top-level ``--help`` and ``--version`` are answered here.
:func:`main` returns the process exit status: 0 on success, 2 when the input data is bad (the one-line
``file:line: field ...`` message is printed instead of a traceback; set ``KGLIGHTNING_TRACEBACK=1`` to see the
traceback too).
"""

from __future__ import annotations

import argparse
import os
import sys

from kglightning.cli.names import DESCRIPTION, EXTRA_SUBCOMMANDS, PROG, TRAINER_SUBCOMMANDS, version_string
from kglightning.data.records import RecordError
from kglightning.fileio import OutputOverInputError
from kglightning.threads import sleep_when_idle

#: errors that mean "the input is wrong", reported as one line with exit status 2
USER_INPUT_ERRORS: tuple[type[BaseException], ...] = (
    RecordError,
    OutputOverInputError,
    # a path the user gave names nothing, something that may not be replaced, a folder where a file is read or
    # written, a path through a file, no permission; and what the system refuses (a full disk, a read-only folder)
    OSError,
)


def top_level_parser() -> argparse.ArgumentParser:
    """The top-level parser, for ``--help``, ``--version`` and a missing subcommand; what follows a subcommand is
    parsed by that subcommand (LightningCLI for the trainer's)."""
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    p.add_argument("--version", action="version", version=version_string())
    p.add_argument("-c", "--config", metavar="CONFIG", help="(fit/validate/test/predict) a json or yaml configuration "
                   "file; it may also follow the subcommand, as in `fit --config configs/detector.yaml`")  # fmt: skip
    p.add_argument("--print_config", metavar="FLAGS", nargs="?", help="(fit/validate/test/predict) print the "
                   "configuration after applying all other arguments and exit")  # fmt: skip
    subcommands = p.add_subparsers(title="subcommands", metavar="SUBCOMMAND",
                                   description=f"Run `{PROG} SUBCOMMAND --help` for the options of one.")  # fmt: skip
    for name, help_text in {**TRAINER_SUBCOMMANDS, **EXTRA_SUBCOMMANDS}.items():
        subcommands.add_parser(name, help=help_text, add_help=False)
    return p


def _dispatch(argv: list[str], from_command_line: bool) -> int:
    command = argv[0] if argv else None
    if command is None:
        top_level_parser().error(f"choose a subcommand ({PROG} --help lists them)")  # exits with status 2
    if command in ("-h", "--help", "--version"):
        top_level_parser().parse_args([command])  # exits after the help or the version
    if command == "evaluate":
        from kglightning.evaluate import main as evaluate_main

        return int(evaluate_main(argv[1:]) or 0)
    if command in ("build-benchmark", "compare-proxies", "seeds"):
        from kglightning.cli import commands

        return {"build-benchmark": commands.build_benchmark, "compare-proxies": commands.compare_proxies,
                "seeds": commands.seeds}[command](argv[1:])  # fmt: skip
    if command == "build-subgraphs":
        from kglightning.retrieval.build_subgraphs_cli import main as build_subgraphs_main

        return build_subgraphs_main(argv[1:], prog=f"{PROG} build-subgraphs")
    if command == "import-predictions":
        from kglightning.data.sources.predictions_import import main as import_main

        return import_main(argv[1:], prog=f"{PROG} import-predictions")
    if command == "conformalize":
        from kglightning.conformal.conformalize_cli import main as conformalize_main

        return conformalize_main(argv[1:], prog=f"{PROG} conformalize")
    if command == "cache":
        from kglightning.data.store.cache_admin import main as cache_main

        return cache_main(argv[1:], prog=f"{PROG} cache")
    if command == "serve":
        from kglightning.cli.serve import main as serve_main

        return serve_main(argv[1:])
    if command == "select":
        from kglightning.conformal.select_cli import main as select_main

        return select_main(argv[1:], prog=f"{PROG} select")
    from kglightning.cli.trainer import run_lightning

    run_lightning(argv, from_command_line)
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
    sleep_when_idle()  # before torch is imported (kglightning.threads)
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
