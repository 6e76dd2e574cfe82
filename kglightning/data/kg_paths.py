"""Path search over a :class:`~kglightning.data.kg.KGIndex`: relation sequences and shortest paths.

Every function takes the index as its first argument and walks triples both ways (a hop against a triple's
direction is written ``~r``, see :data:`~kglightning.data.kg.REVERSE_PREFIX`). :class:`~kglightning.data.kg.KGIndex`
exposes each public function as a method of the same name and signature, so ``kg.shortest_paths(s, t)`` and
``shortest_paths(kg, s, t)`` are the same call. Results are deterministic (sorted id order) and an unknown entity
gives an empty result rather than an error.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

import numpy as np

from kglightning.data.kg import Hop, KGIndex, _gather


def _expand(kg: KGIndex, ids: np.ndarray, allowed: np.ndarray | None, banned: np.ndarray | None):
    """Group the both-ways hops out of ``ids`` by label: yields ``(label_id, sorted dst ids)`` in label order."""
    ptr, lab, dst = kg._both_csr()
    pos = _gather(ptr, ids)
    if banned is not None:
        pos = pos[~banned[dst[pos]]]
    if allowed is not None:
        pos = pos[np.isin(dst[pos], allowed)]
    if not pos.size:
        return
    n = max(kg.num_entities, 1)
    key = np.unique(lab[pos] * n + dst[pos])
    ls, ds = key // n, key % n
    bounds = np.flatnonzero(ls[1:] != ls[:-1]) + 1
    for chunk_l, chunk_d in zip(np.split(ls, bounds), np.split(ds, bounds)):
        yield int(chunk_l[0]), chunk_d


def relation_paths(
    kg: KGIndex, start: str | Iterable[str], max_hops: int, max_paths: int | None = None
) -> dict[tuple[str, ...], set[str]]:
    """Every relation sequence of 1..``max_hops`` hops walkable from ``start``, with its end entities.

    Hops go both ways (reverse written ``~r``). Path rule: the walk never re-enters a start entity; other
    entities may repeat (``r, ~r`` reaches the siblings of an entity). So each value equals
    :meth:`KGIndex.follow` restricted to walks that avoid the start entities. Sequences come shortest first, then
    in relation-id order (forward relations sorted, then reverse ones), so the result is deterministic.

    Args:
        kg: the graph index.
        start: one entity name or several; unknown names are ignored (an empty dict if none is known).
        max_hops: the longest sequence.
        max_paths: stop after this many sequences (the number can grow exponentially with ``max_hops``);
            ``None`` for no cap.

    Example:
        >>> kg = KGIndex.from_triples([("a", "r", "b"), ("c", "r", "b"), ("b", "s", "d")])
        >>> {k: sorted(v) for k, v in relation_paths(kg, "a", 2).items()}
        {('r',): ['b'], ('r', 's'): ['d'], ('r', '~r'): ['c']}
    """
    start_ids = kg._ids(start)
    if not start_ids.size:
        return {}
    banned = np.zeros(kg.num_entities, dtype=bool)
    banned[start_ids] = True
    walks = islice(_walk(kg, start_ids, max_hops, banned), max_paths)
    return {p: {kg._entities[i] for i in ids.tolist()} for p, ids in walks}


def _walk(kg: KGIndex, ids: np.ndarray, max_hops: int, banned: np.ndarray | None, on: list | None = None):
    """Breadth-first over relation sequences: yields ``(sequence, end ids)``, shortest first, in label order.

    With ``on`` (per-level allowed ids, from :func:`_shortest_levels`) the walk stays on shortest paths.
    """
    level: list[tuple[tuple[str, ...], np.ndarray]] = [((), ids)]
    for k in range(1, max_hops + 1):
        nxt = []
        for path, ids in level:
            for label, dst in _expand(kg, ids, None if on is None else on[k], banned):
                nxt.append((path + (kg._labels[label],), dst))
                yield nxt[-1]
        level = nxt


def _shortest_levels(kg: KGIndex, source: str, target: str, max_hops: int) -> list[np.ndarray] | None:
    """Per BFS level, the ids lying on some shortest source-target path; ``None`` if unreachable."""
    s, t = kg._eid.get(source), kg._eid.get(target)
    if s is None or t is None:
        return None
    if s == t:
        return [np.array([s], dtype=np.int64)]
    ptr, _, dst = kg._both_csr()
    seen = np.zeros(kg.num_entities, dtype=bool)
    seen[s] = True
    levels = [np.array([s], dtype=np.int64)]
    while not seen[t]:
        if len(levels) > max_hops:
            return None
        nb = np.unique(dst[_gather(ptr, levels[-1])])
        nb = nb[~seen[nb]]
        if not nb.size:
            return None
        seen[nb] = True
        levels.append(nb)
    on = [np.array([t], dtype=np.int64)]  # prune backwards: the both-ways adjacency is symmetric
    for k in range(len(levels) - 2, -1, -1):
        nb = np.unique(dst[_gather(ptr, on[0])])
        on.insert(0, np.intersect1d(nb, levels[k], assume_unique=True))
    return on


def shortest_paths(kg: KGIndex, source: str, target: str, max_hops: int = 4, max_paths: int = 1000) -> list[list[Hop]]:
    """All shortest paths from ``source`` to ``target``, walking triples both ways.

    Each path is a list of hops ``(from_entity, relation, to_entity)`` where a hop against a triple's direction
    has relation ``~r``. Parallel relations give distinct paths. Paths come in lexicographic order of
    (relation id, entity id) per hop.

    Args:
        kg: the graph index.
        source: start entity.
        target: end entity.
        max_hops: longest path considered.
        max_paths: stop after this many paths (hub and CVT nodes can make the number explode).

    Returns:
        The paths; ``[]`` when either entity is unknown or ``target`` is farther than ``max_hops``;
        ``[[]]`` (one empty path) when ``source == target``.

    Example:
        >>> kg = KGIndex.from_triples([("a", "r", "b"), ("a", "q", "b"), ("c", "s", "b")])
        >>> shortest_paths(kg, "a", "c")
        [[('a', 'q', 'b'), ('b', '~s', 'c')], [('a', 'r', 'b'), ('b', '~s', 'c')]]
    """
    on = _shortest_levels(kg, source, target, max_hops)
    if on is None or max_paths <= 0:
        return []
    ptr, lab, dst = kg._both_csr()
    e, labels, depth = kg._entities, kg._labels, len(on) - 1
    paths: list[list[Hop]] = []
    acc: list[Hop] = []

    def dfs(u: int, k: int) -> bool:  # True when the cap is hit
        if k == depth:
            paths.append(list(acc))
            return len(paths) >= max_paths
        a, b = ptr[u], ptr[u + 1]
        hit = np.flatnonzero(np.isin(dst[a:b], on[k + 1]))
        for j in (hit + a).tolist():
            v = int(dst[j])
            acc.append((e[u], labels[lab[j]], e[v]))
            stop = dfs(v, k + 1)
            acc.pop()
            if stop:
                return True
        return False

    dfs(int(on[0][0]), 0)
    return paths


def shortest_relation_paths(
    kg: KGIndex, source: str, target: str, max_hops: int = 4, max_paths: int = 1000
) -> list[tuple[str, ...]]:
    """Distinct relation sequences of the shortest ``source``-``target`` paths, in lexicographic id order.

    Computed on relation sequences directly (entity sets per sequence), so many parallel paths through CVT
    nodes with the same relations cost one state, not one path each. Same conventions as
    :func:`shortest_paths`; ``max_paths`` caps the number of sequences.

    Example:
        >>> kg = KGIndex.from_triples([("a", "r", "m1"), ("a", "r", "m2"), ("m1", "s", "b"), ("m2", "s", "b")])
        >>> shortest_relation_paths(kg, "a", "b")
        [('r', 's')]
    """
    on = _shortest_levels(kg, source, target, max_hops)
    if on is None or max_paths <= 0:
        return []
    depth = len(on) - 1
    walks = _walk(kg, on[0], depth, None, on)
    return list(islice((p for p, _ in walks if len(p) == depth), max_paths)) if depth else [()]
