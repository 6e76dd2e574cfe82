"""The proxy's evidence on disk, so that a resumed DoublyCal run does not generate it again.

One :class:`~kglightning.llm.backends.cache.ResponseCache` file (appends under a file lock, torn lines skipped)
holds, per question, the proxy's K generated texts. A question's key covers everything that decides them: the
proxy's identity (base model files, GGUF file, dtype, a digest of its adapter weights as loaded), its decoding
settings and prompt format, the KG-Trie settings, and the question with its topic entities, plus its graph when a
trie constrains the decoding (the trie is built from the graph).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kglightning.data.records import KGQARecord
from kglightning.data.store.cache import files_stamp
from kglightning.llm.backends.base import Generation
from kglightning.llm.backends.cache import ResponseCache
from kglightning.llm.backends.local_hf import resolve_model
from kglightning.llm.trie import TrieConfig

__all__ = ["ProxyEvidenceCache", "proxy_identity"]

FORMAT = 1


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


def weights_digest(module: torch.nn.Module, trainable_only: bool = True) -> str:
    """SHA-256 of a module's parameters (names, dtypes, shapes and bytes); only the trainable ones by default.

    >>> a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    >>> weights_digest(a) == weights_digest(a), weights_digest(a) == weights_digest(b)
    (True, False)
    """
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        if trainable_only and not p.requires_grad:
            continue
        t = p.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def model_files_key(folder: str) -> str:
    """:func:`~kglightning.data.store.cache.files_stamp` of a local folder; for a hub id, the cached snapshot's commit
    (``""`` when it is not in the local hub cache)."""
    if Path(folder).expanduser().exists():
        return files_stamp(Path(folder).expanduser())
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(folder, "config.json")
    except Exception:  # not a valid repo id, no hub library: nothing to pin
        return ""
    return f"hub:{Path(found).parent.name}" if isinstance(found, str) else ""


def proxy_identity(proxy: Any, trie: TrieConfig | None) -> str:
    """What, besides the question, decides a proxy's evidence texts (a hex digest)."""
    hp = dict(getattr(proxy, "hparams", {}) or {})
    model, gguf = hp.get("model"), hp.get("gguf_file")
    try:
        folder, gguf = resolve_model(str(model), gguf) if model is not None else (None, gguf)
    except (OSError, ValueError):
        folder = model
    parts = {
        "format": FORMAT,
        "class": f"{type(proxy).__module__}.{type(proxy).__qualname__}",
        "model": model,
        "model_files": model_files_key(str(folder)) if folder else "",
        "gguf_file": gguf,
        "dtype": hp.get("dtype"),
        "adapter": weights_digest(proxy.model) if hasattr(proxy, "model") else "",
        "generation": _plain(getattr(proxy, "generation", None)),
        "prompt_format": _plain(getattr(proxy, "prompt_format", None)),
        "trie": _plain(trie),
    }
    blob = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


class ProxyEvidenceCache:
    """Per question, the proxy's generated evidence texts, read back on a rerun.

    Args:
        path: a folder (the file is ``<folder>/responses.jsonl``) or a ``.jsonl`` file.
        proxy_key: :func:`proxy_identity` of the proxy and trie in use.
        uses_graph: whether the texts depend on the question's graph (a KG-Trie constrains decoding).
    """

    def __init__(self, path: str, proxy_key: str, uses_graph: bool) -> None:
        self.cache = ResponseCache(path, store_requests=False)
        self.proxy_key = proxy_key
        self.uses_graph = uses_graph
        self.hits = 0

    def key(self, record: KGQARecord) -> str:
        """The question's key (see the module docstring)."""
        h = hashlib.sha256(self.proxy_key.encode())
        h.update(json.dumps([record.question, list(record.q_entity)], ensure_ascii=False).encode("utf-8", "replace"))
        if self.uses_graph:
            h.update(json.dumps([list(t) for t in record.graph], ensure_ascii=False).encode("utf-8", "replace"))
        return h.hexdigest()

    def get(self, record: KGQARecord) -> list[str] | None:
        """The cached texts of ``record``, or ``None``."""
        gen = self.cache.get(self.key(record))
        if gen is None:
            return None
        try:
            texts = json.loads(gen.text)
        except ValueError:
            return None
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return None
        self.hits += 1
        return texts

    def put(self, record: KGQARecord, texts: Sequence[str]) -> None:
        """Store the texts generated for ``record``."""
        self.cache.put(self.key(record), Generation(text=json.dumps(list(texts), ensure_ascii=False)))
