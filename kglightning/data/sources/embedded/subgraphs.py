"""Per-question subgraphs, cut from the full KG the way retrieval would: gold evidence plus sampled neighbourhood.

A subgraph holds (1) the *gold* triples (every triple on a path from the topic to a gold answer, and for constraint
questions the path to every candidate plus each candidate's constraint-relation triples, so that the filter can be
checked in the graph), and (2) distractors from a breadth-first walk over both directions around the question's
entities and the gold path nodes, up to ``max(hops + 1, 4)`` steps. Each node contributes at most
``caps[depth]`` incident triples, spread over its relations (hubs such as "English" or "Africa" are thereby
pruned), and the walk stops at a per-question budget drawn log-uniformly. A seeded share of questions then loses
some gold answers, as real retrieval does.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .kg import KnowledgeGraph
from .questions import Question


@dataclass(frozen=True)
class SubgraphConfig:
    """How subgraphs are cut.

    Args:
        min_budget: smallest triple budget of the walk.
        max_budget: largest triple budget (the budget is log-uniform in between; gold triples count towards it).
        caps: incident triples sampled per node at BFS depth 0, 1, 2, ... (the last value repeats).
        min_depth: the walk goes at least this many steps (``max(hops + 1, min_depth)``), so that questions about
            leaf entities (a symbol, a year) still get a neighbourhood.
        missing_rate: probability that a question loses some gold answers from its subgraph.
    """

    min_budget: int = 50
    max_budget: int = 1000
    caps: tuple[int, ...] = (60, 25, 10, 5, 3)
    min_depth: int = 4
    missing_rate: float = 0.13


def gold_evidence(kg: KnowledgeGraph, q: Question) -> tuple[list[int], list[set[int]]]:
    """Gold triple ids and the gold nodes per path layer (layer 0 holds the question's entities)."""
    frontier = {q.topic}
    steps: list[list[tuple[int, int, int]]] = []
    for step in q.template.path:
        edges = [(tid, u, v) for u in sorted(frontier) for tid, v in kg.step_edges(u, step)]
        steps.append(edges)
        frontier = {v for _, _, v in edges}
    keep = set(q.answers) if q.template.constraint is None else frontier
    triples: list[int] = []
    layers: list[set[int]] = [set(keep)]
    for edges in reversed(steps):
        used = [e for e in edges if e[2] in keep]
        triples.extend(tid for tid, _, _ in used)
        keep = {u for _, u, _ in used}
        layers.append(set(keep))
    layers.reverse()
    layers[0] = set(q.q_entities)
    if q.template.constraint is not None:
        for node in sorted(frontier):
            triples.extend(tid for tid, _ in kg.step_edges(node, q.template.constraint))
    return sorted(set(triples)), layers


def sample_incident(kg: KnowledgeGraph, node: int, cap: int, rng: random.Random) -> list[int]:
    """Up to ``cap`` incident triples of ``node``, spread evenly over its (relation, direction) groups."""
    groups = kg.incident[node]
    if kg.degree[node] <= cap:
        return [tid for g in groups for tid in g]
    order = rng.sample(range(len(groups)), len(groups))
    sizes = [len(groups[i]) for i in order]
    alloc = [0] * len(order)
    remaining = cap
    while remaining:  # water-filling: equal shares, small groups give their surplus to the others
        active = [j for j, size in enumerate(sizes) if alloc[j] < size]
        share = max(1, remaining // len(active))
        for j in active:
            take = min(share, sizes[j] - alloc[j], remaining)
            alloc[j] += take
            remaining -= take
            if not remaining:
                break
    out: list[int] = []
    for j, gi in enumerate(order):
        k, group = alloc[j], groups[gi]
        if k >= len(group):
            out.extend(group)
        elif k == 1:
            out.append(group[rng.randrange(len(group))])
        elif k:
            out.extend(rng.sample(group, k))
    return out


def cut_subgraph(
    kg: KnowledgeGraph, q: Question, rng: random.Random, cfg: SubgraphConfig, hidden: frozenset[int] = frozenset()
) -> list[int]:
    """Triple ids of the subgraph of ``q``: gold evidence first, then distractors.

    Args:
        hidden: nodes the retrieval "missed": no triple touching them enters the subgraph (gold ones included).
    """
    gold, layers = gold_evidence(kg, q)
    gold = [t for t in gold if kg.heads[t] not in hidden and kg.tails[t] not in hidden]
    budget = round(math.exp(rng.uniform(math.log(cfg.min_budget), math.log(cfg.max_budget))))
    budget = min(max(budget, len(gold) + cfg.min_budget), max(cfg.max_budget, len(gold)))
    selected = dict.fromkeys(gold)
    visited: set[int] = set(hidden)
    frontier: list[int] = []
    max_depth = max(q.template.hops + 1, cfg.min_depth)
    for depth in range(max_depth + 1):
        extra = layers[depth] if depth < len(layers) else set()
        frontier = sorted((set(frontier) | extra) - visited)
        visited.update(frontier)
        if depth == max_depth or len(selected) >= budget:
            break
        rng.shuffle(frontier)
        cap = cfg.caps[min(depth, len(cfg.caps) - 1)]
        reached: list[int] = []
        for node in frontier:
            for tid in sample_incident(kg, node, cap, rng):
                if len(selected) >= budget:
                    break
                other = kg.tails[tid] if kg.heads[tid] == node else kg.heads[tid]
                if tid not in selected and other not in hidden:
                    selected[tid] = None
                    if other not in visited:
                        reached.append(other)
            if len(selected) >= budget:
                break
        frontier = reached
    return list(selected)


def choose_hidden(q: Question, rng: random.Random) -> frozenset[int]:
    """A random non-empty subset of the gold answers to leave out of the subgraph (never a question entity)."""
    entities = set(q.q_entities)
    pool = [a for a in q.answers if a not in entities]
    if not pool:
        return frozenset()
    return frozenset(rng.sample(pool, rng.randint(1, len(pool))))


def make_subgraph(kg: KnowledgeGraph, q: Question, rng: random.Random, cfg: SubgraphConfig) -> list[int]:
    """The subgraph of ``q``; with probability ``cfg.missing_rate`` some gold answers are missing from it.

    Answers are not hidden when that would also leave a question entity out of the graph (e.g. the symbol "Fe"
    is only linked to Iron, so "which element has the symbol Fe?" cannot lose Iron and keep "Fe").
    """
    hidden = choose_hidden(q, rng) if rng.random() < cfg.missing_rate else frozenset()
    triples = cut_subgraph(kg, q, rng, cfg, hidden)
    if hidden:
        present = {n for t in triples for n in (kg.heads[t], kg.tails[t])}
        if not set(q.q_entities) <= present:
            triples = cut_subgraph(kg, q, rng, cfg)
    return triples
