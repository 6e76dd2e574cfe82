"""A directed multigraph index over one question's triples, with explicit reverse hops.

Entities and relations get integer ids in sorted name order; edges sit in CSR arrays (numpy) for out-edges,
in-edges and (built lazily, once) the combined "both ways" adjacency. Two different relations between the same
pair of entities are two edges; an exact duplicate triple is stored once. A hop walked against a triple's
direction is written with :data:`REVERSE_PREFIX` on the relation: ``~location.country.capital`` goes from the
capital to the country.

Every query is deterministic (results follow the sorted id order) and returns plain ``str`` names. An entity
that is not in the graph is not an error: neighbourhood queries return an empty list and path queries an empty
result, so a retriever can abstain on a question whose topic entity is missing.

The path search (:meth:`KGIndex.relation_paths`, :meth:`KGIndex.shortest_paths`,
:meth:`KGIndex.shortest_relation_paths`) lives in :mod:`kglightning.data.kg_paths`; the methods delegate to it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any, Literal

import numpy as np

from kglightning.data import kg_paths
from kglightning.data.kg_csr import Hop, csr_positions
from kglightning.data.triple_array import TripleArray

REVERSE_PREFIX = "~"

Direction = Literal["out", "in", "both"]


def reverse(relation: str) -> str:
    """The relation walked the other way: ``r`` -> ``~r`` and ``~r`` -> ``r``.

    Example:
        >>> reverse("capital"), reverse("~capital")
        ('~capital', 'capital')
    """
    return relation[len(REVERSE_PREFIX) :] if is_reverse(relation) else REVERSE_PREFIX + relation


def is_reverse(relation: str) -> bool:
    """Whether ``relation`` is written as a reverse hop (``~r``).

    Example:
        >>> is_reverse("~capital"), is_reverse("capital")
        (True, False)
    """
    return relation.startswith(REVERSE_PREFIX)


def _order(a: np.ndarray, b: np.ndarray, c: np.ndarray, n: int, nb: int) -> np.ndarray:
    """Permutation sorting by (a, b, c) where a, c < n and b < nb: one int64 key when it fits, else lexsort."""
    if a.size and (n * nb * n) < 2**62:
        return np.argsort((a * nb + b) * n + c, kind="stable")
    return np.lexsort((c, b, a))


def _csr(src: np.ndarray, n: int) -> np.ndarray:
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr


class KGIndex:
    """Index of a directed multigraph given as ``(head, relation, tail)`` triples.

    Args:
        triples: the triples; exact duplicates are stored once, parallel relations are kept.
        entities: extra entity names to include even without an edge (isolated nodes).

    Raises:
        ValueError: a triple is not three strings, or a relation starts with :data:`REVERSE_PREFIX`.

    Example:
        >>> kg = KGIndex.from_triples([("France", "capital", "Paris"), ("Paris", "in", "France"),
        ...                            ("France", "capital", "Paris")])
        >>> kg.num_entities, kg.num_edges
        (2, 2)
        >>> kg.edges("Paris")
        [('in', 'France'), ('~capital', 'France')]
        >>> kg.follow("Paris", ["~capital"])
        {'France'}
    """

    def __init__(self, triples: Iterable[Sequence[str]] = (), *, entities: Iterable[str] = ()):
        if isinstance(triples, TripleArray):  # ids over a shared vocabulary: strings are looked up once each
            self._from_ids(triples, entities)
            return
        triples = triples if isinstance(triples, list) else list(triples)
        try:  # C-level checks (map/set) keep a 10^6-triple build fast; find the culprit only on failure
            ok = set(map(len, triples)) <= {3} and str not in set(map(type, triples))
            flat = list(chain.from_iterable(triples)) if ok else []  # one C pass; 7x faster than zip(*triples)
            heads, rels, tails = flat[0::3], flat[1::3], flat[2::3]
            ok = ok and set(map(type, flat)) <= {str}
        except TypeError:
            ok = False
        if not ok:
            bad = next(
                t
                for t in triples
                if isinstance(t, str)
                or not (hasattr(t, "__len__") and len(t) == 3 and all(isinstance(x, str) for x in t))
            )
            raise ValueError(f"triple {bad!r} is not three strings (head, relation, tail)")
        names, rel_names = sorted(set(heads).union(tails, entities)), sorted(set(rels))
        bad = [r for r in rel_names if is_reverse(r)]
        if bad:
            raise ValueError(f"relation {bad[0]!r} starts with {REVERSE_PREFIX!r}, which marks reverse hops")
        self._set_names(names, rel_names)
        m, eid, rid = len(triples), self._eid.__getitem__, self._rid.__getitem__
        h = np.fromiter(map(eid, heads), dtype=np.int64, count=m)
        r = np.fromiter(map(rid, rels), dtype=np.int64, count=m)
        self._build(h, r, np.fromiter(map(eid, tails), dtype=np.int64, count=m))

    def _from_ids(self, triples: TripleArray, entities: Iterable[str]) -> None:
        ids, vocab, extra = triples.ids, triples.vocab, list(entities)
        ent_v = np.unique(np.concatenate([ids[:, 0], ids[:, 2]]))  # vocabulary ids, ascending
        rel_v = np.unique(ids[:, 1])
        rank = triples.vocab.sort_rank() if len(ids) and not extra else None
        if rank is not None and int(ids.max()) < len(rank):  # name order from the vocabulary's sort: no string compared
            ent_order, rel_order = np.argsort(rank[ent_v]), np.argsort(rank[rel_v])
            names = vocab.take(ent_v[ent_order])
            rel_names = vocab.take(rel_v[rel_order])
            ent_pos, rel_pos = np.empty_like(ent_order), np.empty_like(rel_order)
            ent_pos[ent_order], rel_pos[rel_order] = np.arange(len(ent_v)), np.arange(len(rel_v))
        else:  # strings the sort does not cover yet, or extra entities: sort the names themselves
            names = sorted(set(vocab.take(ent_v)).union(extra))
            rel_names = sorted(vocab.take(rel_v))
            ent_pos, rel_pos = None, None
        bad = [r for r in rel_names if is_reverse(r)]
        if bad:
            raise ValueError(f"relation {bad[0]!r} starts with {REVERSE_PREFIX!r}, which marks reverse hops")
        self._set_names(names, rel_names)
        if ent_pos is None or rel_pos is None:
            look = self._eid.__getitem__
            ent_pos = np.fromiter(map(look, vocab.take(ent_v)), dtype=np.int64, count=len(ent_v))
            rel_pos = np.fromiter(map(self._rid.__getitem__, vocab.take(rel_v)), dtype=np.int64, count=len(rel_v))
        self._build(
            ent_pos[np.searchsorted(ent_v, ids[:, 0])],
            rel_pos[np.searchsorted(rel_v, ids[:, 1])],
            ent_pos[np.searchsorted(ent_v, ids[:, 2])],
        )

    @classmethod
    def from_triples(cls, triples: Iterable[Sequence[str]], *, entities: Iterable[str] = ()) -> KGIndex:
        """Build the index from ``(head, relation, tail)`` triples (see :class:`KGIndex`)."""
        return cls(triples, entities=entities)

    @classmethod
    def from_ids(
        cls, entities: Sequence[str], relations: Sequence[str], head: np.ndarray, relation: np.ndarray, tail: np.ndarray
    ) -> KGIndex:
        """Build the index from names and id triples (``head``/``tail`` index ``entities``, ``relation`` indexes
        ``relations``): what :meth:`entities`, :meth:`relations` and :meth:`edge_ids` give back. The names must be
        sorted and distinct, as the index keeps its ids in name order (its digest and queries depend on it).

        Raises:
            ValueError: names not sorted or repeated, ids out of range, arrays of different lengths, or a reverse-hop
                relation.

        Example:
            >>> kg = KGIndex.from_triples([("France", "capital", "Paris")])
            >>> KGIndex.from_ids(kg.entities, kg.relations, *kg.edge_ids()).triples()
            [('France', 'capital', 'Paris')]
        """
        names, rel_names = list(entities), list(relations)
        h, r, t = (np.asarray(a).astype(np.int64, copy=True).reshape(-1) for a in (head, relation, tail))
        if not h.size == r.size == t.size:
            raise ValueError(f"head, relation and tail hold {h.size}, {r.size} and {t.size} ids")
        for what, ids, n in (("entity", h, len(names)), ("relation", r, len(rel_names)), ("entity", t, len(names))):
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
                raise ValueError(f"{what} ids run from {int(ids.min())} to {int(ids.max())}, beyond the {n} names")
        bad = [x for x in rel_names if not isinstance(x, str) or is_reverse(x)]
        if bad or not all(isinstance(x, str) for x in names):
            raise ValueError(f"relation {bad[0]!r} is not a relation name" if bad else "an entity name is not a string")
        for what, seq in (("entity", names), ("relation", rel_names)):
            if any(a >= b for a, b in zip(seq, seq[1:])):
                raise ValueError(f"the {what} names are not sorted and distinct")
        kg = object.__new__(cls)
        kg._set_names(names, rel_names)
        kg._build(h, r, t)
        return kg

    @classmethod
    def from_record(cls, record: Any) -> KGIndex:
        """Build the index from a record's ``graph`` (a :class:`~kglightning.data.records.KGQARecord`).

        Topic entities that do not occur in the graph are *not* added: ``record.q_entity[0] in kg`` tells whether
        there is any evidence to retrieve.
        """
        return cls(record.graph)

    def _set_names(self, names: list[str], rel_names: list[str]) -> None:
        self._entities, self._relations = names, rel_names
        self._eid = {n: i for i, n in enumerate(names)}
        self._rid = {n: i for i, n in enumerate(rel_names)}
        self._labels = rel_names + [REVERSE_PREFIX + x for x in rel_names]

    def _build(self, h: np.ndarray, r: np.ndarray, t: np.ndarray) -> None:
        n = len(self._entities)
        order = _order(h, r, t, n, len(self._relations))
        h, r, t = h[order], r[order], t[order]
        if h.size:  # drop exact duplicates (adjacent after sorting)
            keep = np.ones(h.size, dtype=bool)
            keep[1:] = (h[1:] != h[:-1]) | (r[1:] != r[:-1]) | (t[1:] != t[:-1])
            h, r, t = h[keep], r[keep], t[keep]
        self._h, self._r, self._t = h, r, t  # sorted by (head, relation, tail): the out-CSR
        self._out_ptr = _csr(h, n)
        order = _order(t, r, h, n, len(self._relations))
        self._in_rel, self._in_head = r[order], h[order]
        self._in_ptr = _csr(t[order], n)
        self._both: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def _both_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Combined adjacency: out-edges ``(r, tail)`` and reverse in-edges ``(~r, head)``; label ``~r`` = r + R."""
        if self._both is None:
            nrel = len(self._relations)
            src = np.concatenate([self._h, self._t])
            lab = np.concatenate([self._r, self._r + nrel])
            dst = np.concatenate([self._t, self._h])
            order = _order(src, lab, dst, self.num_entities, 2 * nrel)
            self._both = (_csr(src[order], self.num_entities), lab[order], dst[order])
        return self._both

    @property
    def entities(self) -> list[str]:
        """Entity names in id order (sorted)."""
        return list(self._entities)

    @property
    def relations(self) -> list[str]:
        """Relation names (forward only) in id order (sorted)."""
        return list(self._relations)

    @property
    def num_entities(self) -> int:
        return len(self._entities)

    @property
    def num_relations(self) -> int:
        return len(self._relations)

    @property
    def num_edges(self) -> int:
        """Number of distinct triples."""
        return int(self._h.size)

    def __contains__(self, entity: object) -> bool:
        return entity in self._eid

    def __repr__(self) -> str:
        return f"KGIndex(entities={self.num_entities}, relations={self.num_relations}, edges={self.num_edges})"

    def entity_id(self, name: str) -> int | None:
        """The integer id of ``name``, or ``None`` when it is not in the graph."""
        return self._eid.get(name)

    def _ids(self, entities: str | Iterable[str]) -> np.ndarray:
        if isinstance(entities, str):
            entities = [entities]
        ids = {self._eid[e] for e in entities if e in self._eid}
        return np.array(sorted(ids), dtype=np.int64)

    def edge_ids(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The distinct triples as ``(heads, relations, tails)`` id arrays, in :meth:`triples` order (entity ids
        index :attr:`entities`, relation ids :attr:`relations`); read-only views, not copies."""
        views = tuple(a.view() for a in (self._h, self._r, self._t))
        for v in views:
            v.flags.writeable = False
        return views  # type: ignore[return-value]

    def digest(self) -> str:
        """A hex digest of the graph's content (its names and distinct triples; the order the triples came in does
        not count), computed once per index: what a cached preparation stage (e.g. the PCST cuts) keys on."""
        if getattr(self, "_digest", None) is None:
            h = hashlib.sha256()
            for names in (self._entities, self._relations):
                h.update(len(names).to_bytes(8, "little"))
                for lo in range(0, len(names), 1 << 16):  # a bounded joined string at a time
                    h.update("\0".join(names[lo : lo + (1 << 16)]).encode("utf-8", "surrogatepass") + b"\0")
            for a in (self._h, self._r, self._t):
                h.update(np.ascontiguousarray(a, dtype="<i8").tobytes())
            self._digest = h.hexdigest()[:32]
        return self._digest

    def triples(self) -> list[tuple[str, str, str]]:
        """All distinct triples, sorted by (head, relation, tail)."""
        e, rel = self._entities, self._relations
        return [(e[a], rel[b], e[c]) for a, b, c in zip(self._h.tolist(), self._r.tolist(), self._t.tolist())]

    def _pairs(self, entity: str, ptr: np.ndarray, rel: np.ndarray, nbr: np.ndarray, prefix: str = "") -> list:
        i = self._eid.get(entity)
        if i is None:
            return []
        a, b = ptr[i], ptr[i + 1]
        e, names = self._entities, self._relations
        return [(prefix + names[x], e[y]) for x, y in zip(rel[a:b].tolist(), nbr[a:b].tolist())]

    def out_edges(self, entity: str) -> list[tuple[str, str]]:
        """``(relation, tail)`` for each triple leaving ``entity``; empty for an unknown entity."""
        return self._pairs(entity, self._out_ptr, self._r, self._t)

    def in_edges(self, entity: str) -> list[tuple[str, str]]:
        """``(relation, head)`` for each triple entering ``entity`` (relation *not* prefixed); empty if unknown."""
        return self._pairs(entity, self._in_ptr, self._in_rel, self._in_head)

    def edges(self, entity: str, direction: Direction = "both") -> list[tuple[str, str]]:
        """Hops from ``entity``: out-edges as ``(r, tail)``, in-edges as ``(~r, head)``; empty if unknown.

        Args:
            entity: the entity name.
            direction: ``"out"``, ``"in"`` or ``"both"`` (out-edges first, then in-edges).
        """
        if direction not in ("out", "in", "both"):
            raise ValueError(f"direction must be 'out', 'in' or 'both', got {direction!r}")
        out = self.out_edges(entity) if direction != "in" else []
        if direction != "out":
            out += self._pairs(entity, self._in_ptr, self._in_rel, self._in_head, REVERSE_PREFIX)
        return out

    def neighbors(self, entity: str, direction: Direction = "both") -> list[str]:
        """Distinct neighbour names (of :meth:`edges`) in id order; empty for an unknown entity."""
        return sorted({n for _, n in self.edges(entity, direction)}, key=self._eid.__getitem__)

    def follow(self, start: str | Iterable[str], relation_path: Sequence[str]) -> set[str]:
        """Entities reached from ``start`` by following ``relation_path`` hop by hop (``~r`` goes tail -> head).

        Args:
            start: one entity name or several; unknown names are ignored.
            relation_path: relations, each forward (``r``) or reverse (``~r``); an empty path returns ``start``.

        Returns:
            The set of reached names; empty when a relation is unknown or the walk dead-ends.

        Example:
            >>> kg = KGIndex.from_triples([("a", "r", "b"), ("c", "r", "b"), ("b", "s", "d")])
            >>> sorted(kg.follow("a", ["r", "~r"])), kg.follow(["a", "c"], ["r", "s"])
            (['a', 'c'], {'d'})
        """
        ids = self._ids(start)
        for relation in relation_path:
            if not ids.size:
                break
            rev = is_reverse(relation)
            rid = self._rid.get(reverse(relation) if rev else relation)
            if rid is None:
                return set()
            csr = (self._in_ptr, self._in_rel, self._in_head) if rev else (self._out_ptr, self._r, self._t)
            ptr, rel_arr, nbr = csr
            pos = csr_positions(ptr, ids)
            ids = np.unique(nbr[pos[rel_arr[pos] == rid]])
        return {self._entities[i] for i in ids.tolist()}

    def relation_paths(
        self, start: str | Iterable[str], max_hops: int, max_paths: int | None = None
    ) -> dict[tuple[str, ...], set[str]]:
        """Every relation sequence of 1..``max_hops`` hops from ``start`` with its end entities.

        See :func:`kglightning.data.kg_paths.relation_paths`.
        """
        return kg_paths.relation_paths(self, start, max_hops, max_paths)

    def shortest_paths(self, source: str, target: str, max_hops: int = 4, max_paths: int = 1000) -> list[list[Hop]]:
        """All shortest ``source``-``target`` paths as hop lists, walking triples both ways.

        See :func:`kglightning.data.kg_paths.shortest_paths`.
        """
        return kg_paths.shortest_paths(self, source, target, max_hops, max_paths)

    def shortest_relation_paths(
        self, source: str, target: str, max_hops: int = 4, max_paths: int = 1000
    ) -> list[tuple[str, ...]]:
        """Distinct relation sequences of the shortest ``source``-``target`` paths.

        See :func:`kglightning.data.kg_paths.shortest_relation_paths`.
        """
        return kg_paths.shortest_relation_paths(self, source, target, max_hops, max_paths)

    def neighborhood(
        self, entities: str | Iterable[str], hops: int, *, max_degree: int | None = None, max_nodes: int | None = None
    ) -> KGIndex:
        """The induced subgraph on the entities within ``hops`` steps of ``entities`` (both edge directions).

        Args:
            entities: seed names (unknown names are ignored).
            hops: breadth-first steps.
            max_degree: nodes with more edges than this are kept but not expanded (hubs).
            max_nodes: stop the walk at this many nodes (see :func:`~kglightning.data.kg_paths.khop_ids`).

        Example:
            >>> kg = KGIndex.from_triples([("a", "r", "b"), ("c", "s", "b"), ("c", "t", "d")])
            >>> kg.neighborhood("a", 2).triples()
            [('a', 'r', 'b'), ('c', 's', 'b')]
        """
        ids, _ = kg_paths.khop_ids(self, entities, hops, max_degree, max_nodes)
        return self.subgraph(self._entities[i] for i in ids.tolist())

    def subgraph(self, entities: Iterable[str]) -> KGIndex:
        """The induced subgraph on ``entities`` (unknown names ignored; known isolated ones kept as nodes).

        Example:
            >>> kg = KGIndex.from_triples([("a", "r", "b"), ("b", "s", "c")])
            >>> kg.subgraph(["a", "b"]).triples()
            [('a', 'r', 'b')]
        """
        ids = self._ids(entities)
        keep = np.zeros(self.num_entities, dtype=bool)
        keep[ids] = True
        new_id = np.cumsum(keep) - 1
        mask = keep[self._h] & keep[self._t]
        rel_used, r = np.unique(self._r[mask], return_inverse=True)
        sub = object.__new__(type(self))
        sub._set_names([self._entities[i] for i in ids.tolist()], [self._relations[i] for i in rel_used.tolist()])
        sub._build(new_id[self._h[mask]], r.astype(np.int64).reshape(-1), new_id[self._t[mask]])
        return sub
