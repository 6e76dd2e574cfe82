"""Small seeded random multigraphs and a pure-Python brute force for the evidence tests (imported by them)."""

from __future__ import annotations

import random
from collections import defaultdict


def random_triples(seed: int, n_nodes: int = 9, n_edges: int = 22, n_rels: int = 3) -> list[tuple[str, str, str]]:
    """Seeded random triples with parallel relations, self-loops and a CVT-like node ``m.0``."""
    rng = random.Random(seed)
    nodes = [f"n{i}" for i in range(n_nodes - 1)] + ["m.0"]
    rels = [f"r{i}" for i in range(n_rels)]
    return [(rng.choice(nodes), rng.choice(rels), rng.choice(nodes)) for _ in range(n_edges)]


def adjacency(triples) -> dict[str, set[tuple[str, str]]]:
    """Both-ways hops per node: ``(r, tail)`` for out-edges and ``(~r, head)`` for in-edges."""
    adj: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for h, r, t in triples:
        adj[h].add((r, t))
        adj[t].add(("~" + r, h))
    return adj


def brute_follow(adj, starts, relations) -> set[str]:
    cur = set(starts)
    for rel in relations:
        cur = {y for x in cur for r, y in adj.get(x, ()) if r == rel}
    return cur


def brute_shortest_relation_paths(adj, source, target, max_hops) -> set[tuple[str, ...]]:
    """Relation sequences of the shortest walks: enumerate every walk of length 1, 2, ... and stop at the first hit."""
    if source not in adj or target not in adj:
        return set()
    walks = [((), source)]
    for _ in range(max_hops):
        walks = [(p + (r,), y) for p, x in walks for r, y in adj[x]]
        hits = {p for p, y in walks if y == target}
        if hits:
            return hits
    return set()


def seeded_graphs(n: int = 40) -> list[tuple[int, list[tuple[str, str, str]]]]:
    """``[(seed, triples)]`` for seeds ``0..n-1``."""
    return [(seed, random_triples(seed)) for seed in range(n)]
