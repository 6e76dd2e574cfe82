"""A cheap learned baseline for hallucination detection: logistic regression on structural counts per answer.

Per proposed answer: its rank in the answer list (over the list's length), the list's length, whether it names a
node of the graph, that node's degree, its hop distance from the topic entities (undirected), and the graph's size.
Fitted on the training split, it says how much of the detection task such counts already solve: a learned detector
that does not beat it is not earning its cost.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict, deque
from collections.abc import Callable, Sequence

import torch

from kglightning.data.proposer import AnswerNodeScorer
from kglightning.data.records import KGQARecord
from kglightning.evidence.answer_signals import LLM_SIGNALS, AnswerSignals, LLMSignal
from kglightning.metrics.functional.qa import answer_key, is_abstention, node_matcher

__all__ = ["FEATURES", "StructuralBaseline", "structural_features"]

FEATURES = ("rank", "num_answers", "grounded", "log_degree", "hops", "log_graph_size")


def _hops(graph: Sequence[tuple[str, str, str]], sources: Sequence[str], limit: int) -> dict[str, int]:
    adjacent: dict[str, set[str]] = defaultdict(set)
    for h, _, t in graph:
        adjacent[h].add(t)
        adjacent[t].add(h)
    dist = {s: 0 for s in sources if s in adjacent}
    queue = deque(dist)
    while queue:
        node = queue.popleft()
        if dist[node] >= limit:
            continue
        for nxt in adjacent[node]:
            if nxt not in dist:
                dist[nxt] = dist[node] + 1
                queue.append(nxt)
    return dist


def structural_features(
    record: KGQARecord, max_hops: int = 4, signals: Sequence[LLMSignal] = ()
) -> dict[str, list[float]]:
    """Per distinct non-abstaining answer of ``record.prediction``: the :data:`FEATURES` in order, then ``signals``
    (:mod:`~kglightning.evidence.answer_signals`: the LLM's votes for the answer, the paths it cited, ...).

    Answers are distinct as the detector's graphs make them: two entries that name the same node (or, naming no node,
    the same text after RoG normalisation) are one answer, keyed by its first entry's text; its signals count all its
    entries.

    Example:
        >>> r = KGQARecord("q", "capital of France?", ["Paris"], ["France"], ["Paris"],
        ...     [("France", "capital", "Paris"), ("Paris", "in", "Europe")], prediction=["Paris", "Mars", "paris"])
        >>> f = structural_features(r, max_hops=2, signals=["votes"])
        >>> f["Paris"], f["Mars"]
        ([0.0, 3.0, 1.0, 1.0986..., 1.0, 1.0986..., 0.666...], [0.333..., 3.0, 0.0, 0.0, 3.0, 1.0986..., 0.333...])
    """
    return _features(record, list(record.graph), max_hops, signals)[0]


def _features(
    record: KGQARecord, graph: list[tuple[str, str, str]], max_hops: int, signals: Sequence[LLMSignal]
) -> tuple[dict[str, list[float]], Callable[[str], str | None]]:
    """:func:`structural_features` of ``record`` whose triples are ``graph`` (read once), and the record's node
    matcher."""
    preds = record.prediction or []
    match = node_matcher(n for h, _, t in graph for n in (h, t))
    degree: dict[str, int] = defaultdict(int)
    for h, _, t in graph:
        degree[h] += 1
        degree[t] += 1
    dist = _hops(graph, record.q_entity, max_hops)
    groups: dict[tuple[str, str], tuple[str, str | None, list[int]]] = {}  # key -> (first text, node, entries)
    for k, answer in enumerate(preds):
        node = match(answer) if answer_key(answer) else None
        if node is None and is_abstention(answer):  # as the detector: an answer naming a node is no abstention
            continue
        key = ("node", node) if node is not None else ("text", answer_key(answer))
        groups.setdefault(key, (answer, node, []))[2].append(k)
    llm = AnswerSignals(record) if signals else None
    out: dict[str, list[float]] = {}
    for answer, node, entries in groups.values():
        hops = dist.get(node, max_hops + 1) if node is not None else max_hops + 1
        out[answer] = [
            entries[0] / len(preds),
            float(len(preds)),
            float(node is not None),
            math.log1p(degree[node]) if node is not None else 0.0,
            float(hops),
            math.log1p(len(graph)),
            *(llm.values(entries, None, signals) if llm is not None else ()),
        ]
    return out, match


class StructuralBaseline(AnswerNodeScorer):
    """Logistic regression on :func:`structural_features`, fitted on the training split (L-BFGS, L2-regularised,
    standardised features); name it in ``data.init_args.baselines`` (its column: ``test/structural/*``).

    Args:
        l2: weight of the L2 penalty on the coefficients.
        max_hops: hop distances are capped at ``max_hops + 1`` (unreachable or ungrounded).
        name: column prefix in the test table.
        signals: what the LLM's output says of each answer, added to the counts
            (:mod:`~kglightning.evidence.answer_signals`: ``votes``, ``first_rank``, ``log_answers``,
            ``cited_paths``, ``cited_in_graph``); give it the signals the detector reads, so that the two are
            compared on the same information.
    """

    def __init__(
        self, l2: float = 1e-2, max_hops: int = 4, name: str = "structural", signals: list[LLMSignal] | None = None
    ) -> None:
        if l2 < 0 or max_hops < 1:
            raise ValueError("need l2 >= 0 and max_hops >= 1")
        self.signals = list(signals or [])
        unknown = [x for x in self.signals if x not in LLM_SIGNALS]
        if unknown or len(set(self.signals)) < len(self.signals):
            raise ValueError(f"signals must be distinct names of {', '.join(LLM_SIGNALS)}; got {self.signals}")
        self.l2 = l2
        self.max_hops = max_hops
        self.name = name
        self.weights: torch.Tensor | None = None
        self.mean: torch.Tensor | None = None
        self.std: torch.Tensor | None = None
        self._fitted_on = ""

    @property
    def cache_key(self) -> str:
        signals = f"-s{'+'.join(self.signals)}" if self.signals else ""
        return f"structural-l2{self.l2}-h{self.max_hops}{signals}-{self._fitted_on}"

    def _matrix(self, records: Sequence[KGQARecord]) -> tuple[torch.Tensor, torch.Tensor]:
        rows, labels = [], []
        for r in records:
            gold = {key for a in [*r.answer, *r.a_entity] if (key := answer_key(a))}
            if not gold:  # no gold answer: nothing to label its answers against (the detector leaves them out too)
                continue
            features, match = _features(r, list(r.graph), self.max_hops, self.signals)
            for answer, feats in features.items():
                rows.append(feats)
                node = match(answer)  # as the detector labels it: right when its text or its node's name is gold
                labels.append(float(answer_key(answer) not in gold and (node is None or answer_key(node) not in gold)))
        x = torch.tensor(rows, dtype=torch.float64).view(-1, len(FEATURES) + len(self.signals))
        return x, torch.tensor(labels, dtype=torch.float64)

    def fit(self, records: Sequence[KGQARecord]) -> StructuralBaseline:
        """Fit on ``records`` (their predictions and gold answers); returns ``self``."""
        x, y = self._matrix(records)
        if len(y) == 0:
            raise ValueError("StructuralBaseline.fit: the records have no proposed answer to learn from")
        self.mean, self.std = x.mean(0), x.std(0, unbiased=False).clamp_min(1e-6)
        z = torch.cat([(x - self.mean) / self.std, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
        w = torch.zeros(z.shape[1], dtype=x.dtype, requires_grad=True)
        opt = torch.optim.LBFGS([w], lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(z @ w, y) + self.l2 * w[:-1].pow(2).sum()
            loss.backward()
            return loss

        opt.step(closure)
        self.weights = w.detach()
        digest = hashlib.sha1(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()[:12]
        self._fitted_on = f"{len(y)}-{digest}"
        return self

    def score(self, records: Sequence[KGQARecord]) -> list[dict[str, float]]:
        if self.weights is None or self.mean is None or self.std is None:
            raise RuntimeError("StructuralBaseline.score before fit: fit it on the training split first")
        out = []
        for r in records:
            feats = structural_features(r, self.max_hops, self.signals)
            if not feats:
                out.append({})
                continue
            x = (torch.tensor(list(feats.values()), dtype=torch.float64) - self.mean) / self.std
            p = torch.sigmoid(x @ self.weights[:-1] + self.weights[-1])
            out.append(dict(zip(feats, p.tolist())))
        return out
