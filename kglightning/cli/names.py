"""The names the CLI is made of: the program, its subcommands with their one-line help, its description and version
(imported by :mod:`.entry`, :mod:`.trainer` and :mod:`.commands`; imports nothing heavy)."""

from __future__ import annotations

import kglightning

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
    "serve": "serve a trained KG-Guard detector over HTTP: answers in, each answer's hallucination probability and "
    "flag out (LitServe, dynamic batching, API key)",
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

#: LightningCLI's subcommands, with the one-line help its own parser gives them
TRAINER_SUBCOMMANDS = {
    "fit": "train a model (and validate it) on a data module, both named by class_path in --config",
    "validate": "one evaluation epoch over the validation split",
    "test": "one evaluation epoch over the test split",
    "predict": "run the model over the predict split (prediction writers, reports)",
}


def version_string() -> str:
    """``kglightning <version>`` (the installed distribution's version, else the package's ``__version__``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{PROG} {version(PROG)}"
    except PackageNotFoundError:
        return f"{PROG} {kglightning.__version__}"
