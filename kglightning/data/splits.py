"""Find the train / validation / test files of a dataset folder, or build the embedded benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

SPLITS = ("train", "validation", "test")
_ALIASES = {"train": ("train",), "validation": ("validation", "val", "valid", "dev"), "test": ("test",)}
_SUFFIXES = (".jsonl", ".json", ".parquet")


def split_file_names() -> set[str]:
    """Every file name :func:`locate_splits` takes for a split in a folder of split files (``train.jsonl``,
    ``val.parquet``, ...): a file written under one of them into a data folder would be read as that split."""
    return {f"{n}{suf}" for names in _ALIASES.values() for n in names for suf in _SUFFIXES}


def locate_splits(
    data_dir: str | None,
    benchmark_seed: int = 0,
    cache_dir: str | None = None,
    required: Sequence[str] = SPLITS,
) -> dict[str, tuple[str, str | None]]:
    """Map each split to ``(path, split_name)``, the arguments of :func:`read_records`.

    Args:
        data_dir: ``None`` for the embedded benchmark (built on first use); a folder with ``train``, ``validation``
            (or ``val``/``valid``/``dev``) and ``test`` files in ``.jsonl``/``.json``/``.parquet``; a folder saved
            by ``datasets``' ``save_to_disk``; a local copy of a hub dataset (``data/train-*.parquet``); or
            ``hf:owner/name`` to load from the hub (needs network).
        benchmark_seed: the embedded benchmark's seed.
        cache_dir: root of the embedded benchmark cache (default ``$KGLIGHTNING_CACHE``).
        required: the splits whose files must exist in a folder of split files (the others are mapped when found);
            e.g. only the pooled splits of a cross-validation (:class:`~kglightning.data.folds.KFold`).
    """
    if data_dir is None:
        from kglightning.data.sources.embedded import ensure_embedded_benchmark

        root = ensure_embedded_benchmark(cache_dir, seed=benchmark_seed)
        return {s: (str(root / f"{s}.jsonl"), None) for s in SPLITS}
    if data_dir.startswith("hf:"):
        return {s: (data_dir, s) for s in SPLITS}
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"data_dir {data_dir!r} is not a folder (use null for the embedded benchmark)")
    if (root / "dataset_dict.json").exists() or (root / "data").is_dir():
        return {s: (str(root), s) for s in SPLITS}
    out: dict[str, tuple[str, str | None]] = {}
    for split, names in _ALIASES.items():
        found = [root / f"{n}{suf}" for n in names for suf in _SUFFIXES if (root / f"{n}{suf}").exists()]
        found += [root / n for n in names if (root / n / "dataset_info.json").exists()]
        if found:
            out[split] = (str(found[0]), None)
    missing = [s for s in required if s not in out]
    if missing:
        raise FileNotFoundError(
            f"no file for split(s) {missing} in {data_dir!r}: expected e.g. train.jsonl, validation.jsonl, "
            f"test.jsonl (.json and .parquet work too)"
        )
    return out
