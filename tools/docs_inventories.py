"""Write the object inventories that link the API pages' types into the docs of torch, Lightning, PyG, torchmetrics,
numpy, pyarrow, transformers and PEFT, without the network.

mkdocstrings links a type in a signature (``torch.Tensor``, ``lightning.LightningModule``) to another site through
that site's Sphinx inventory (``objects.inv``), which it downloads at build time. The docs build here and in CI has
no network, so the inventories are written from :data:`PAGES`: each external name that kglightning's signatures use,
as griffe resolves it, and its page on its project's site. ``docs/inventories/<project>.inv`` (Sphinx inventory
format 2) is read by ``mkdocs.yml`` through a relative ``file:`` URL, with the site's address as ``base_url``.

    python tools/docs_inventories.py            # write docs/inventories/*.inv from PAGES
    python tools/docs_inventories.py --check    # exit 1 when a file is not what it would write
    python tools/docs_inventories.py --missing  # external names the API uses that neither PAGES nor UNMAPPED holds

``tests/tools/test_docs_inventories.py`` checks that the files are current and that every name in :data:`PAGES`
exists in the installed library.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "inventories"

#: per project: its site (the inventory's base URL), and each name as kglightning's signatures spell it -> its page
#: and anchor on that site
_TORCH_DATA = "tensors.html#data-types"
_LIGHTNING = {
    "lightning.LightningModule": "lightning.pytorch.core.LightningModule",
    "lightning.pytorch.LightningModule": "lightning.pytorch.core.LightningModule",
    "lightning.LightningDataModule": "lightning.pytorch.core.LightningDataModule",
    "lightning.pytorch.LightningDataModule": "lightning.pytorch.core.LightningDataModule",
    "lightning.Trainer": "lightning.pytorch.trainer.trainer.Trainer",
    "lightning.pytorch.Trainer": "lightning.pytorch.trainer.trainer.Trainer",
    **{f"lightning.pytorch.callbacks.{c}": f"lightning.pytorch.callbacks.{c}"
       for c in ("Callback", "BasePredictionWriter", "ModelCheckpoint")},
    **{f"lightning.pytorch.cli.{c}": f"lightning.pytorch.cli.{c}" for c in ("LightningCLI", "LightningArgumentParser")},
}  # fmt: skip
_METRICS = {"BinaryAUROC": "auroc", "BinaryAccuracy": "accuracy", "BinaryAveragePrecision": "average_precision",
            "BinaryF1Score": "f1_score", "BinaryPrecision": "precision", "BinaryRecall": "recall"}  # fmt: skip
PAGES: dict[str, tuple[str, dict[str, str]]] = {
    "torch": (
        "https://docs.pytorch.org/docs/stable/",
        {
            "torch.Tensor": "tensors.html#torch.Tensor",
            "torch.BoolTensor": _TORCH_DATA,
            "torch.FloatTensor": _TORCH_DATA,
            "torch.LongTensor": _TORCH_DATA,
            "torch.Generator": "generated/torch.Generator.html#torch.Generator",
            "torch.device": "tensor_attributes.html#torch.device",
            "torch.dtype": "tensor_attributes.html#torch.dtype",
            "torch.nn.Module": "generated/torch.nn.Module.html#torch.nn.Module",
            "torch.optim.Optimizer": "optim.html#torch.optim.Optimizer",
            "torch.optim.lr_scheduler.CosineAnnealingLR": "generated/torch.optim.lr_scheduler.CosineAnnealingLR.html"
            "#torch.optim.lr_scheduler.CosineAnnealingLR",
            "torch.autograd.Function": "autograd.html#torch.autograd.Function",
            "torch.utils.data.DataLoader": "data.html#torch.utils.data.DataLoader",
            "torch.utils.data.Sampler": "data.html#torch.utils.data.Sampler",
        },
    ),
    "lightning": (
        "https://lightning.ai/docs/pytorch/stable/",
        {name: f"api/{target}.html#{target}" for name, target in _LIGHTNING.items()},
    ),
    "torch_geometric": (
        "https://pytorch-geometric.readthedocs.io/en/latest/",
        {
            "torch_geometric.data.Data": "generated/torch_geometric.data.Data.html#torch_geometric.data.Data",
            "torch_geometric.data.Batch": "generated/torch_geometric.data.Batch.html#torch_geometric.data.Batch",
            **{
                f"torch_geometric.nn.{c}": f"generated/torch_geometric.nn.conv.{c}.html#torch_geometric.nn.conv.{c}"
                for c in ("GATConv", "TransformerConv")
            },
        },  # fmt: skip
    ),
    "torchmetrics": (
        "https://lightning.ai/docs/torchmetrics/stable/",
        {
            "torchmetrics.Metric": "references/metric.html#torchmetrics.Metric",
            **{
                f"torchmetrics.classification.{c}": f"classification/{page}.html#torchmetrics.classification.{c}"
                for c, page in _METRICS.items()
            },
        },  # fmt: skip
    ),
    "numpy": (
        "https://numpy.org/doc/stable/",
        {f"numpy.{c}": f"reference/generated/numpy.{c}.html#numpy.{c}" for c in ("ndarray", "memmap")},
    ),
    "pyarrow": (
        "https://arrow.apache.org/docs/",
        {
            f"pyarrow.{c}": f"python/generated/pyarrow.{c}.html#pyarrow.{c}"
            for c in ("Array", "ChunkedArray", "ListArray", "RecordBatch", "Schema", "Table")
        },
    ),  # fmt: skip
    "transformers": (
        "https://huggingface.co/docs/transformers/main/en/",
        {
            "transformers.PreTrainedTokenizerBase": "main_classes/tokenizer#transformers.PreTrainedTokenizerBase",
            "transformers.PreTrainedTokenizerFast": "main_classes/tokenizer#transformers.PreTrainedTokenizerFast",
            "transformers.LlamaForCausalLM": "model_doc/llama#transformers.LlamaForCausalLM",
            "transformers.LogitsProcessor": "internal/generation_utils#transformers.LogitsProcessor",
        },
    ),
    "peft": (
        "https://huggingface.co/docs/peft/main/en/",
        {"peft.LoraConfig": "package_reference/lora#peft.LoraConfig"},
    ),
}
#: external names the API uses that no page is given for, and why
UNMAPPED = {
    "lightning.pytorch.cli.LRSchedulerCallable": "a type alias, with no page of its own",
    "lightning.pytorch.cli.OptimizerCallable": "a type alias, with no page of its own",
    "torch.overrides.TorchFunctionMode": "not in torch's API reference",
    "torchmetrics.MetricCollection": "its anchor on torchmetrics' site is not known here",
}
#: external roots whose names ``--missing`` reports
ROOTS = ("torch", "lightning", "torch_geometric", "torchmetrics", "numpy", "pyarrow", "transformers", "peft", "trl")


def inventory(project: str, pages: dict[str, str]) -> bytes:
    """``pages`` as a Sphinx inventory (format 2) of ``py:class`` entries: a plain header, then zlib-compressed
    lines ``name domain:role priority uri display`` (``uri`` relative to the inventory's base URL)."""
    header = f"# Sphinx inventory version 2\n# Project: {project}\n# Version: stable\n"
    header += "# The remainder of this file is compressed using zlib.\n"
    body = "".join(f"{name} py:class 1 {uri} -\n" for name, uri in sorted(pages.items()))
    return header.encode() + zlib.compress(body.encode(), 9)


def used_names() -> set[str]:
    """The external names (under :data:`ROOTS`) in the annotations and bases of kglightning's objects, as griffe
    resolves them for the API pages."""
    import griffe

    pkg = griffe.load("kglightning", search_paths=[str(ROOT)], resolve_aliases=False)
    out: set[str] = set()

    def names(expr) -> None:
        for e in expr.iterate(flat=True) if isinstance(expr, griffe.Expr) else ():
            if isinstance(e, griffe.ExprName) and e.canonical_path.split(".")[0] in ROOTS:
                out.add(e.canonical_path)

    def walk(obj) -> None:
        for m in obj.members.values():
            if m.is_alias:
                continue
            if m.is_function:
                for p in m.parameters:
                    names(p.annotation)
                names(m.returns)
            elif m.is_attribute:
                names(m.annotation)
            elif m.is_class:
                for b in m.bases:
                    names(b)
            if m.is_module or m.is_class:
                walk(m)

    walk(pkg)
    return {name for name in out if not _is_module(name)}


def _is_module(name: str) -> bool:
    import importlib

    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def missing() -> list[str]:
    """The external names the API uses that neither :data:`PAGES` nor :data:`UNMAPPED` holds."""
    mapped = {name for _, pages in PAGES.values() for name in pages} | set(UNMAPPED)
    return sorted(used_names() - mapped)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file differs")
    p.add_argument("--missing", action="store_true", help="list the external names the API uses that are not mapped")
    args = p.parse_args(argv)
    if args.missing:
        print("\n".join(missing()))
        return 0
    stale = []
    for project, (_, pages) in PAGES.items():
        path = OUT / f"{project}.inv"
        data = inventory(project, pages)
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                stale.append(str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path))
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    if stale:
        print(f"not what tools/docs_inventories.py writes: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
