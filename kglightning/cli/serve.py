"""``kglightning serve``: the trained detector behind an HTTP endpoint (:mod:`kglightning.serve`).

The server is built from the config the detector was trained with (its ``model`` and ``data`` sections, as
``predict`` reads them, with the same ``--model.*`` / ``--data.*`` overrides) and the checkpoint's weights; the
serve config (``configs/serve.yaml``) says where it listens and what it accepts. Options given on the command line
override the serve config's.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import multiprocessing
import os
import signal
import sys
import zipfile
from pathlib import Path
from typing import Any

from kglightning.cli.names import PROG
from kglightning.cli.serve_stop import SigtermStop, stop_workers
from kglightning.help_format import DefaultsHelpFormatter

__all__ = ["build_scorer", "main"]

log = logging.getLogger(__name__)

DETECTOR_COMMAND = f"{PROG} fit --config configs/detector.yaml"


def build_scorer(
    configs: list[str], overrides: list[str], checkpoint: str, kg: str | None = None,
    kg_retrieval: dict[str, Any] | None = None,
) -> Any:  # fmt: skip
    """The :class:`~kglightning.serve.guard.GuardScorer` of a training config and a checkpoint (run in each server
    worker; the model and the data module as ``predict --ckpt_path`` would build them), with the KG ``kg`` names
    (:func:`~kglightning.serve.kg.load_served_kg`) when given."""
    import torch

    from kglightning.cli import trainer
    from kglightning.fileio import file_digest
    from kglightning.serve.guard import GuardScorer

    args = [x for c in configs for x in ("--config", c)]
    quiet = ["--trainer.logger", "false", "--trainer.callbacks", "[]", "--trainer.enable_progress_bar", "false"]
    cli = trainer.configured("serve", save_config_callback=None, args=[*args, *overrides, *quiet])
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)  # a Lightning checkpoint the user trained
    if not isinstance(state, dict) or not isinstance(state.get("state_dict"), dict):
        raise ValueError(f"{checkpoint}: not a Lightning checkpoint (it has no state_dict)")
    try:
        cli.model.load_state_dict(state["state_dict"])
    except RuntimeError as err:  # another model's weights: name the file and the config it does not fit
        raise ValueError(f"{checkpoint}: its weights do not fit the detector of {', '.join(configs)} (train it with "
                         f"that config, or give the config it was trained with: --detector_config): {err}") from None  # fmt: skip
    served = None
    if kg is not None:
        from kglightning.serve.kg import ServedKG, load_served_kg

        served = ServedKG(load_served_kg(kg), kg_retrieval, source=kg)
    return GuardScorer(cli.model, cli.datamodule, file_digest(checkpoint), served)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        formatter_class=DefaultsHelpFormatter,
        prog=f"{PROG} serve",
        description="Serve a trained KG-Guard detector over HTTP (LitServe): POST /v1/guard takes a question, the "
        "LLM's answers and the question's subgraph, and returns each answer's hallucination probability, its flag at "
        "the checkpoint's tuned threshold and whether it names a graph node. Options not listed here (--model.*, "
        "--data.*) go to the detector's config, as for predict. The API key, when the environment variable "
        "--api_key_env names is set, is required in X-API-Key.",
    )
    p.add_argument("--config", help="a serve config (YAML) whose keys are the options below, e.g. configs/serve.yaml")
    p.add_argument("--detector_config", action="append", default=None, dest="detector_config_cli",
                   help="the config the detector was trained with; repeat it to add fragments (default: "
                   "configs/detector.yaml)")  # fmt: skip
    p.add_argument("--checkpoint", default="outputs/detector/graph_transformer/checkpoints/best.ckpt",
                   help="the detector checkpoint served")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="the address it listens on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="the port it listens on")
    p.add_argument("--accelerator", default="auto", choices=["auto", "cpu", "cuda", "mps"], help="the worker's device")
    p.add_argument("--max_batch_size", type=int, default=16, help="requests scored in one forward pass")
    p.add_argument("--workers", type=int, default=1,
                   help="processes that score requests, each with its own copy of the detector and its data module "
                   "(memory grows with each); on CPU, more than one uses more cores")  # fmt: skip
    p.add_argument("--num_api_servers", type=int, default=1,
                   help="HTTP server processes that parse and validate requests (the detector runs in the --workers processes)")  # fmt: skip
    p.add_argument("--batch_timeout", type=float, default=0.005, help="seconds a batch waits for more requests")
    p.add_argument(
        "--timeout", type=float, default=30.0, help="seconds from a request's arrival to its response; then a 504"
    )
    p.add_argument("--max_triples", type=int, default=2000,
                   help="triples a request's graph may hold (a request's time grows with the texts the cache has not "
                   "seen: keep one request well under --timeout)")  # fmt: skip
    p.add_argument("--max_answers", type=int, default=100,
                   help="answers a request may hold (also topic entities, and paths cited for one answer)")  # fmt: skip
    p.add_argument("--max_text_chars", type=int, default=2000, help="characters of a question, answer or node name")
    p.add_argument("--max_body_bytes", type=int, default=8_000_000, help="bytes a request body may hold (413 over)")
    p.add_argument("--selection_calibration", default=None,
                   help="a labelled scored predictions jsonl of a calibration split (what predict writes for the "
                   "validation split): each request's answers are then kept by the question rule calibrated on it "
                   "(P(a question keeps a hallucinated answer) <= --selection_alpha), and POST /v1/guard/batch "
                   "serves the batch rules (top, fdr, kept_rate); unset: kept = not flagged, and no batch endpoint")  # fmt: skip
    p.add_argument("--selection_alpha", type=float, default=0.1, help="the selection rules' alpha")
    p.add_argument("--selection_delta", type=float, default=0.1,
                   help="the kept_rate rule's delta (POST /v1/guard/batch): the probability that the calibration "
                   "breaks its bound")  # fmt: skip
    p.add_argument("--selection_group_by", default="none", choices=["grounding", "none"],
                   help="none: one cut, and the promise holds per question; grounding: a cut per grounding kind "
                   "(exact, near_miss, ungrounded), and the promise holds per kind (a question with answers of k "
                   "kinds may keep a hallucinated one with probability up to k * alpha)")  # fmt: skip
    p.add_argument("--kg", default=None,
                   help="a KG (a triples file as build-subgraphs --kg reads it, or 'embedded'): a request may then "
                   "leave its graph out and send topic_entities, and the server cuts the subgraph around them as "
                   "build-subgraphs does")  # fmt: skip
    p.add_argument("--kg_retrieval", type=_mapping, default=None,
                   help="the cut's settings, as a YAML or JSON mapping of build-subgraphs' options hops, topk, topk_e, "
                   "cost_e, max_degree, max_nodes, encoder (default: build-subgraphs' defaults), e.g. '{hops: 1}'")  # fmt: skip
    p.add_argument("--api_key_env", default="KGLIGHTNING_API_KEY",
                   help="the environment variable that holds the API key (unset: no key asked)")  # fmt: skip
    return p


def _mapping(text: str) -> dict[str, Any]:
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise argparse.ArgumentTypeError(f"not YAML or JSON ({err})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a mapping such as '{{hops: 2}}', got {text!r}")
    return value


def _config_defaults(p: argparse.ArgumentParser, path: str) -> None:
    import yaml

    try:
        values = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        p.error(f"--config {path}: not YAML ({err})")
    if not isinstance(values, dict):
        p.error(f"--config {path}: expected a mapping of options, got {type(values).__name__}")
    known = {a.dest for a in p._actions} - {"help", "config", "detector_config_cli"} | {"detector_config"}
    unknown = sorted(set(values) - known)
    if unknown:
        p.error(f"--config {path}: unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    if isinstance(values.get("detector_config"), str):
        values["detector_config"] = [values["detector_config"]]
    p.set_defaults(**values)


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse checks of options given on the command line, also for those a serve config gave."""
    for action in p._actions:
        value = getattr(args, action.dest, None)
        if action.choices is not None and value is not None and value not in action.choices:
            p.error(f"--{action.dest}: {value!r} is not one of {', '.join(map(str, action.choices))}")
        if action.type in (int, float) and value is not None and not isinstance(value, (int, float)):
            p.error(f"--{action.dest}: expected a number, got {value!r}")
        if isinstance(value, float) and math.isnan(value):
            p.error(f"--{action.dest}: expected a number, got NaN")
    positive = (
        "port",
        "max_batch_size",
        "workers",
        "num_api_servers",
        "timeout",
        "max_triples",
        "max_answers",
        "max_text_chars",
        "max_body_bytes",
    )
    for name in positive:
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be positive, got {getattr(args, name)}")
    if args.kg_retrieval is not None and not isinstance(args.kg_retrieval, dict):
        p.error(f"--kg_retrieval: expected a mapping such as {{hops: 2}}, got {args.kg_retrieval!r}")
    if args.batch_timeout < 0:
        p.error(f"--batch_timeout must be >= 0, got {args.batch_timeout}")
    for name in ("selection_alpha", "selection_delta"):
        if not 0 < getattr(args, name) < 1:
            p.error(f"--{name} must lie in (0, 1), got {getattr(args, name)}")


def main(argv: list[str]) -> int:
    p = _parser()
    first, _ = p.parse_known_args(argv)
    if first.config:
        _config_defaults(p, first.config)
    args, overrides = p.parse_known_args(argv)
    stray = [
        a for a in overrides if a.startswith("-") and not a.startswith(("--model.", "--data.", "--seed_everything"))
    ]
    if stray:
        p.error(f"unrecognized arguments: {' '.join(stray)} (only --model.* and --data.* go to the detector's config)")
    _check(p, args)
    # given on the command line, the detector's configs replace the serve config's (they are not added to them)
    configs = args.detector_config_cli or getattr(args, "detector_config", None) or ["configs/detector.yaml"]
    for path in [*configs, args.checkpoint, *([args.kg] if args.kg not in (None, "embedded") else [])]:
        if not Path(path).is_file():
            hint = f"; train the detector first: `{DETECTOR_COMMAND}`" if path == args.checkpoint else ""
            raise FileNotFoundError(f"{path}: no such file{hint}")
    if not zipfile.is_zipfile(args.checkpoint):  # what torch.save writes; anything else fails in every worker
        p.error(f"--checkpoint {args.checkpoint}: not a checkpoint (torch.save writes a zip archive); train one with "
                f"`{DETECTOR_COMMAND}`")  # fmt: skip
    from kglightning.serve.api import guard_server
    from kglightning.serve.schema import LIMITS
    from kglightning.serve.selection import ServedSelection

    selection = None
    if args.selection_calibration:
        selection = ServedSelection(args.selection_calibration, args.selection_alpha, args.selection_group_by,
                                    delta=args.selection_delta)  # fmt: skip
        print(f"selection: the question rule at alpha {args.selection_alpha:g}, cuts {selection.describe()['cuts']}",
              file=sys.stderr)  # fmt: skip

    if args.kg is not None:  # the API servers check that a request's topic entities are in it (workers cut)
        from kglightning.serve.kg import check_retrieval, load_served_kg

        try:
            check_retrieval(args.kg_retrieval or {})  # before the KG is read and the workers start
        except ValueError as err:
            p.error(f"--{err}")  # its message starts with the option's name
        kg = load_served_kg(args.kg)
        LIMITS.kg_nodes = kg
        print(f"KG {args.kg}: {kg}; requests without a graph get one cut around their topic entities", file=sys.stderr)
    LIMITS.max_triples, LIMITS.max_answers = args.max_triples, args.max_answers
    LIMITS.max_text_chars, LIMITS.max_body_bytes = args.max_text_chars, args.max_body_bytes
    build = functools.partial(build_scorer, list(configs), list(overrides), args.checkpoint, args.kg,
                              args.kg_retrieval)  # fmt: skip
    closing = multiprocessing.get_context("fork").Event()  # set on SIGTERM; the API servers (forked) see it
    server = guard_server(build, accelerator=args.accelerator, max_batch_size=args.max_batch_size,
                          batch_timeout=args.batch_timeout, timeout=args.timeout, max_body_bytes=args.max_body_bytes,
                          api_key_env=args.api_key_env, selection=selection,
                          workers=args.workers, closing=closing)  # fmt: skip
    # SIGTERM (docker stop, kill, a test's terminate): new requests get a 503, the requests in flight are answered,
    # then LitServe shuts down as on Ctrl-C and stops its workers (Python's default would leave the workers running,
    # and LitServe's own shutdown closes the workers' way back before the HTTP servers have answered)
    stop = SigtermStop(server, closing, args.timeout, os.getpid())
    stop.install()
    print(f"serving {args.checkpoint} on http://{args.host}:{args.port}/v1/guard (OpenAPI: /docs)", file=sys.stderr)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not os.environ.get(args.api_key_env):
        print(f"warning: listening on {args.host} with no API key: anyone who reaches this port can call it (set "
              f"{args.api_key_env} before starting to require X-API-Key)", file=sys.stderr)  # fmt: skip
    try:
        server.run(host=args.host, port=args.port, generate_client_file=False, num_api_servers=args.num_api_servers)
        # LitServe's own shutdown ends the API servers it has listed: one forked just before a SIGTERM (LitServe
        # catches the interrupt while it starts them) is not listed yet, and would keep the port, and this
        # process at its exit, for good
        stop.done()
        stop_workers(server)
    except KeyboardInterrupt:  # SIGTERM or Ctrl-C while the workers were loading (LitServe stops them once serving)
        stop.done()
        stop_workers(server)
        print("serve: stopped before the detector was ready", file=sys.stderr)
    except RuntimeError as err:
        stop.done()
        if "workers failed to start" not in str(err):
            raise
        stop_workers(server)
        print("serve: no worker could load the detector (the worker's error is above); nothing was served",
              file=sys.stderr)  # fmt: skip
        return 1
    finally:
        stop.done()
        if stop.signalled.is_set():  # stopping on a SIGTERM: another one, during the teardown, is not a new order
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return 0
