"""Ground an LLM's answer strings to KG entities by embedding similarity, with a faiss index (CPU or GPU).

Exact-name grounding (:func:`~kglightning.llm.grounding.ground_answers`) leaves answers whose wording differs from
every node name (``"Barack H. Obama"`` vs ``"Barack Obama"``, a typo, a missing accent) unmatched. :class:`FaissGrounder`
takes those: node names and answers are embedded with the sentence encoder (cached on disk), each answer is looked up
in an exact inner-product index (``IndexFlatIP`` over unit vectors, so cosine similarity), and grounded to its nearest
name when the similarity reaches ``min_similarity``; below the floor it stays unmatched. The same code runs on
faiss-cpu and faiss-gpu: with ``device="auto"`` the index moves to the GPU when faiss was built with GPU support and a
GPU is visible. Indexes are kept for the last ``cache_size`` distinct name lists (one per question graph, or one for a
whole KG).

Example:
    >>> from kglightning.llm.grounding import ground_answers
    >>> grounder = FaissGrounder(min_similarity=0.8, show_progress=False)  # doctest: +SKIP
    >>> grounder.ground(ground_answers({"Barak Obama": 0.9}, ["Barack Obama", "Paris"]), ["Barack Obama", "Paris"])  # doctest: +SKIP
    GroundedAnswers(entities={'Barack Obama': 0.9}, unmatched={}, issues=['unmatched_answer'])
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from kglightning.data.devices import local_gpu
from kglightning.data.embeddings import SentenceEncoder, UsesEmbeddings

if TYPE_CHECKING:  # the grounder fills what llm.grounding returns; retrieval and llm share a floor
    from kglightning.llm.grounding import GroundedAnswers

__all__ = ["FaissGrounder", "faiss_gpu_available"]

log = logging.getLogger(__name__)


def faiss_gpu_available() -> bool:
    """Whether the installed faiss has GPU support and sees a GPU."""
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class FaissGrounder(UsesEmbeddings):
    """Nearest-name grounding of answers that exact matching left unmatched.

    Args:
        encoder: the sentence encoder (default: the bundled all-MiniLM-L6-v2).
        cache_dir: where text embeddings are cached (default ``$KGLIGHTNING_CACHE/embeddings``).
        min_similarity: cosine similarity an answer needs with its nearest name to be grounded to it.
        device: ``"auto"`` (GPU when faiss-gpu sees one), ``"cpu"`` or ``"cuda"``; on a GPU the index goes to this
            process's GPU (:func:`~kglightning.data.devices.local_gpu`: the rank's under DDP).
        cache_size: how many indexes (distinct name lists) are kept.
        show_progress: progress bars while embedding.

    :attr:`matched` and :attr:`unmatched` count the answers grounded and left over by :meth:`ground`.
    """

    def __init__(
        self,
        encoder: SentenceEncoder | None = None,
        cache_dir: str | None = None,
        min_similarity: float = 0.85,
        device: Literal["auto", "cpu", "cuda"] = "auto",
        cache_size: int = 64,
        show_progress: bool = False,
    ) -> None:
        if not -1.0 <= min_similarity <= 1.0:
            raise ValueError(f"min_similarity must be in [-1, 1], got {min_similarity}")
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
        if device == "cuda" and not faiss_gpu_available():
            raise RuntimeError("device 'cuda' needs faiss with GPU support and a visible GPU (install faiss-gpu)")
        self.encoder = encoder or SentenceEncoder(show_progress=show_progress)
        self.cache_dir = cache_dir
        self.min_similarity = min_similarity
        self.device = device
        self.cache_size = cache_size
        self.matched = 0
        self.unmatched = 0
        self._indexes: OrderedDict[tuple[str, ...], Any] = OrderedDict()

    @property
    def cache_key(self) -> str:
        """What decides the grounding (the encoder and the floor, not the device): part of derived caches' keys."""
        return f"faiss{self.min_similarity:g}-{self.encoder.cache_key}"

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda" or (self.device == "auto" and faiss_gpu_available())

    def _vectors(self, texts: Sequence[str]) -> np.ndarray:
        emb = self.embeddings.embed(list(texts)).float()
        emb = emb / emb.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return np.ascontiguousarray(emb.cpu().numpy(), dtype=np.float32)

    def index(self, names: Sequence[str]) -> Any:
        """The exact inner-product index over ``names`` (built once per distinct list, kept in an LRU)."""
        import faiss

        key = tuple(names)
        if key in self._indexes:
            self._indexes.move_to_end(key)
            return self._indexes[key]
        vectors = self._vectors(key)
        index = faiss.IndexFlatIP(vectors.shape[1])
        if self.on_gpu:
            self._gpu = getattr(self, "_gpu", None) or faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(self._gpu, local_gpu(), index)  # this DDP process's GPU, not GPU 0
        index.add(vectors)
        self._indexes[key] = index
        while len(self._indexes) > self.cache_size:
            self._indexes.popitem(last=False)
        return index

    def nearest(self, queries: Sequence[str], names: Sequence[str]) -> list[tuple[str | None, float]]:
        """For each query, its most similar name and the cosine similarity (``None`` below ``min_similarity``)."""
        if not queries:
            return []
        if not names:
            return [(None, float("-inf")) for _ in queries]
        sims, ids = self.index(names).search(self._vectors(queries), 1)
        out = []
        for sim, i in zip(sims[:, 0].tolist(), ids[:, 0].tolist()):
            out.append((names[i] if i >= 0 and sim >= self.min_similarity else None, float(sim)))
        return out

    def ground(self, grounded: GroundedAnswers, entity_names: Iterable[str] | Mapping[str, str]) -> GroundedAnswers:
        """Ground ``grounded.unmatched`` answers to their nearest entity name; what stays below the floor stays.

        Args:
            grounded: the exact-match result (:func:`~kglightning.llm.grounding.ground_answers`).
            entity_names: the same entities: names, or entity id -> name.
        """
        if not grounded.unmatched:
            return grounded
        items = list(entity_names.items()) if isinstance(entity_names, Mapping) else [(n, n) for n in entity_names]
        names = sorted({str(name) for _, name in items})
        by_name: dict[str, list[str]] = {}
        for entity, name in items:
            by_name.setdefault(str(name), []).append(entity)
        answers = list(grounded.unmatched)
        still: dict[str, float | None] = {}
        for answer, (name, _) in zip(answers, self.nearest(answers, names)):
            conf = grounded.unmatched[answer]
            if name is None:
                still[answer] = conf
                self.unmatched += 1
                continue
            self.matched += 1
            for entity in by_name[name]:
                old = grounded.entities.get(entity)
                grounded.entities[entity] = conf if old is None else old if conf is None else max(old, conf)
        grounded.unmatched = still
        return grounded
