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
from typing import TYPE_CHECKING

import numpy as np

from kglightning.data.kg_csr import Hop, csr_positions

if TYPE_CHECKING:  # annotations only: kg.py imports this module
    from kglightning.data.kg import KGIndex


def _expand(kg: KGIndex, ids: np.ndarray, allowed: np.ndarray | None, banned: np.ndarray | None):
    """Group the both-ways hops out of ``ids`` by label: yields ``(label_id, sorted dst ids)`` in label order."""
    ptr, lab, dst = kg._both_csr()
    pos = csr_positions(ptr, ids)
    if banned is not None:
        pos = pos[~banned[dst[pos]]]
    if allowed is not None:
        pos = pos[np.isin(dst[pos], allowed)]
    if not pos.size:
        return
    n = max(kg.num_entities, 1)
    key = np.unique(lab[pos] * n + dst[pos])
    ls, ds = key // n, key % n
    starts = np.flatnonzero(np.concatenate(([True], ls[1:] != ls[:-1])))
    ends = [*starts[1:].tolist(), ls.size]
    for label, a, b in zip(ls[starts].tolist(), starts.tolist(), ends):  # slices: np.split costs more per group
        yield label, ds[a:b]


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
        >>> from kglightning.data.kg import KGIndex
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
    name = kg._entities.__getitem__
    return {p: set(map(name, ids.tolist())) for p, ids in walks}


def topic_relation_paths(
    kg: KGIndex,
    topics: Iterable[str],
    max_hops: int,
    max_paths_per_entity: int | None = None,
    max_fanout: int | None = None,
) -> dict[tuple[str, ...], set[str]]:
    """Relation paths from each topic entity on its own, merged: the candidate answer paths of a question.

    Unlike :func:`relation_paths` from all topics at once, each topic walks alone (and may pass through another
    topic). Topic entities are removed from the ends, and a path left with no end, or with more than
    ``max_fanout`` ends (it answers nothing specific), is dropped. Topics absent from the graph are ignored.

    Example:
        >>> from kglightning.data.kg import KGIndex
        >>> kg = KGIndex.from_triples([("a", "r", "b"), ("a", "r", "c"), ("a", "s", "d"), ("b", "t", "e")])
        >>> {k: sorted(v) for k, v in topic_relation_paths(kg, ["a", "b"], 1).items()}
        {('r',): ['c'], ('s',): ['d'], ('t',): ['e']}
        >>> {k: sorted(v) for k, v in topic_relation_paths(kg, ["a"], 1, max_fanout=1).items()}
        {('s',): ['d']}
    """
    topics = list(dict.fromkeys(topics))
    out: dict[tuple[str, ...], set[str]] = {}
    for topic in topics:
        if topic not in kg:
            continue
        for path, ends in relation_paths(kg, topic, max_hops, max_paths_per_entity).items():
            ends = ends - set(topics)
            if ends and (max_fanout is None or len(ends) <= max_fanout):
                out.setdefault(path, set()).update(ends)
    return out


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
        nb = np.unique(dst[csr_positions(ptr, levels[-1])])
        nb = nb[~seen[nb]]
        if not nb.size:
            return None
        seen[nb] = True
        levels.append(nb)
    on = [np.array([t], dtype=np.int64)]  # prune backwards: the both-ways adjacency is symmetric
    for k in range(len(levels) - 2, -1, -1):
        nb = np.unique(dst[csr_positions(ptr, on[0])])
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
        >>> from kglightning.data.kg import KGIndex
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
        >>> from kglightning.data.kg import KGIndex
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


def shortest_relation_paths_many(
    kg: KGIndex, source: str, targets: Iterable[str], max_hops: int = 4, max_paths: int = 1000
) -> dict[str, list[tuple[str, ...]]]:
    """:func:`shortest_relation_paths` from one ``source`` to many ``targets``, in one shared search.

    One BFS from ``source`` gives every target's distance; the levels are pruned backwards to the entities on a
    shortest path to *some* target, and a single relation-sequence walk over them serves all targets: a sequence
    of length ``d`` whose end set holds a target at distance ``d`` is a shortest path to it. Each value equals
    ``shortest_relation_paths(kg, source, target, max_hops, max_paths)`` (same order, same cap per target).

    Args:
        kg: the graph index.
        source: start entity.
        targets: end entities; unknown or unreachable ones map to ``[]``, ``source`` itself to ``[()]``.
        max_hops: longest path considered.
        max_paths: cap on the sequences kept per target.

    Example:
        >>> from kglightning.data.kg import KGIndex
        >>> kg = KGIndex.from_triples([("a", "r", "m"), ("m", "s", "b"), ("m", "t", "c"), ("c", "u", "a")])
        >>> shortest_relation_paths_many(kg, "a", ["b", "c", "z"])
        {'b': [('r', 's')], 'c': [('~u',)], 'z': []}
    """
    names = list(dict.fromkeys(targets))
    out: dict[str, list[tuple[str, ...]]] = {t: [] for t in names}
    s = kg._eid.get(source)
    if s is None or max_paths <= 0:
        return out
    if source in out:
        out[source].append(())
    ptr, lab, dst = kg._both_csr()
    n, nrel = kg.num_entities, kg.num_relations
    src = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))  # whole-graph masks beat per-node gathers here
    want = np.array(sorted({kg._eid[t] for t in names if t in kg._eid and t != source}), dtype=np.int64)
    dist = np.full(n, -1, dtype=np.int64)
    dist[s] = 0
    front = np.zeros(n, dtype=bool)
    front[s] = True
    k = 0
    while k < max_hops and want.size and (dist[want] < 0).any():
        nb = dst[front[src]]
        nb = nb[dist[nb] < 0]
        if not nb.size:
            break
        k += 1
        dist[nb] = k
        front[:] = False
        front[nb] = True
    want = want[dist[want] > 0]
    if not want.size:
        return out
    depth = int(dist[want].max())
    # prune backwards to the entities on a shortest path to *some* target, collecting the DAG of shortest-path
    # hops u -> v (dist[v] = dist[u] + 1) on the way: the both-ways adjacency is symmetric, so the hop v -> u
    # with label l is the hop u -> v with the reverse label
    is_target = np.zeros(n, dtype=bool)
    is_target[want] = True
    on, dist_dst, children = is_target & (dist == depth), dist[dst], {}
    for k in range(depth - 1, -1, -1):
        e = np.flatnonzero(on[src] & (dist_dst == k))
        u, v, rev = dst[e], src[e], (lab[e] + nrel) % (2 * nrel)
        for a, b, c in zip(u.tolist(), rev.tolist(), v.tolist()):
            children.setdefault(a, {}).setdefault(b, []).append(c)
        on = is_target & (dist == k)
        on[u] = True
    return _collect(kg, s, depth, children, dist, want, max_paths, out)


def _collect(
    kg: KGIndex, s: int, depth: int, children: dict, dist: np.ndarray, want: np.ndarray, max_paths: int, out: dict
) -> dict:
    """Walk relation sequences over the shortest-path DAG (label order, so lexicographic) and file them per target."""
    at_depth = [set() for _ in range(depth + 1)]
    for t, d in zip(want.tolist(), dist[want].tolist()):
        at_depth[d].add(t)
    left = dict.fromkeys(want.tolist(), max_paths)
    busy, labels, names = len(left), kg._labels, kg._entities
    level: list[tuple[tuple[str, ...], set[int]]] = [((), {s})]
    for k in range(1, depth + 1):
        nxt = []
        for path, nodes in level:
            groups: dict[int, set[int]] = {}
            for u in nodes:
                for label, vs in children.get(u, {}).items():
                    groups.setdefault(label, set()).update(vs)
            for label in sorted(groups):
                ends, seq = groups[label], path + (labels[label],)
                for t in at_depth[k].intersection(ends):
                    if left[t] > 0:
                        left[t] -= 1
                        out[names[t]].append(seq)
                        busy -= left[t] == 0
                if not busy:
                    return out
                nxt.append((seq, ends))
        level = nxt
    return out


def khop_ids(
    kg: KGIndex, entities: str | Iterable[str], hops: int, max_degree: int | None = None, max_nodes: int | None = None
) -> tuple[np.ndarray, bool]:
    """Ids of the entities within ``hops`` steps of ``entities`` over both edge directions (breadth-first).

    A node with more than ``max_degree`` edges (a hub) is kept but not expanded. With ``max_nodes`` the walk stops
    once that many nodes are reached; the nodes of the last level are then taken in id order up to the bound.

    Returns:
        ``(ids, truncated)``: the sorted ids, and whether ``max_nodes`` cut the walk short.
    """
    ptr, _, dst = kg._both_csr()
    seen = np.zeros(kg.num_entities, dtype=bool)
    frontier = np.unique(kg._ids(entities))
    seen[frontier] = True
    count, truncated = int(frontier.size), False
    for _ in range(hops):
        if max_degree is not None:
            frontier = frontier[(ptr[frontier + 1] - ptr[frontier]) <= max_degree]
        nxt = np.unique(dst[csr_positions(ptr, frontier)])
        nxt = nxt[~seen[nxt]]
        if max_nodes is not None and count + nxt.size > max_nodes:
            nxt, truncated = nxt[: max(max_nodes - count, 0)], True
        seen[nxt] = True
        count += int(nxt.size)
        frontier = nxt
        if truncated or not frontier.size:
            break
    return np.flatnonzero(seen), truncated
