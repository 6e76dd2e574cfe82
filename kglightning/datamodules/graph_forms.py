"""The forms of a detection graph: :class:`GraphParts` (numpy, as built), a ``Data`` (what the detector reads) and
its compact form (what a split keeps between epochs and what :mod:`~kglightning.datamodules.graph_rows` stores).

:func:`~kglightning.datamodules.detection_graphs.graph_parts` builds the parts; :meth:`GraphParts.to_data` makes
them a graph with its reverse edges; :func:`compact_graph` drops the reverse edges again and narrows the ids, and
:func:`expand_graph` restores them. :func:`collate_graphs` batches graphs of any form with their texts' embeddings.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Batch, Data

from kglightning.evidence.answer_signals import SIGNALS
from kglightning.nn.kgguard import EDGE_FORWARD, EDGE_REVERSE, EDGE_VIRTUAL, edge_types

__all__ = ["GraphParts", "collate_graphs", "compact_graph", "expand_graph"]


@dataclass
class GraphParts:
    """One question's detection graph before it is a ``Data``
    (:func:`~kglightning.datamodules.detection_graphs.graph_parts`): nodes are the
    subgraph's entities, then the virtual question node; ``src``/``dst``/``rel`` are the triples' forward edges (the
    reverse edges, with ``reverse``, are their mirror) and ``topics`` the topic entities the virtual node links to.
    Texts are rows of the table the builder was given; answers come grounded (``answer_nodes``) then ungrounded."""

    qid: str
    node_text: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    rel: np.ndarray
    reverse: bool
    topics: list[int]
    answer_nodes: list[int]
    ungrounded_text: list[int]
    grounding: list[int]
    answer_rank: list[float]
    labels: list[float]
    labelled: bool
    confidences: list[float]
    answer_signals: list[list[float]]
    answer_names: list[str]
    answer_entries: list[list[int]]

    @property
    def num_nodes(self) -> int:
        return len(self.node_text)

    @property
    def compact_reverse(self) -> int:
        """How many forward edges :func:`compact_graph` finds mirrored (``-1``: none; see :meth:`edges`)."""
        return len(self.src) if self.reverse and len(self.src) else -1

    def edges(self, mirror: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(src, dst, rel, kind)`` (``int64``): the forward edges, their mirror (with ``mirror`` and
        :attr:`reverse`), then the virtual node's edges to the topic entities."""
        virtual, k = self.num_nodes - 1, len(self.topics)
        fwd = np.full(len(self.src), EDGE_FORWARD, dtype=np.int64)
        both = mirror and self.reverse
        src = [self.src, self.dst] if both else [self.src]
        dst = [self.dst, self.src] if both else [self.dst]
        rel = [self.rel, self.rel] if both else [self.rel]
        kind = [fwd, np.full(len(self.src), EDGE_REVERSE, dtype=np.int64)] if both else [fwd]
        src.append(np.full(k, virtual, dtype=np.int64))
        dst.append(np.asarray(self.topics, dtype=np.int64))
        rel.append(np.zeros(k, dtype=np.int64))
        kind.append(np.full(k, EDGE_VIRTUAL, dtype=np.int64))
        out = tuple(np.concatenate(parts).astype(np.int64) for parts in (src, dst, rel, kind))
        return out  # type: ignore[return-value]

    def to_data(self) -> Data:
        """The graph as the detector reads it (reverse edges included)."""
        n, virtual, answers = self.num_nodes, self.num_nodes - 1, len(self.answer_names)
        src, dst, rel, kind = self.edges(mirror=True)
        topic_mask = torch.zeros(n, dtype=torch.bool)
        topic_mask[self.topics] = True
        answer_mask = torch.zeros(n, dtype=torch.bool)
        answer_mask[self.answer_nodes] = True
        return Data(
            num_nodes=n,
            node_text=torch.from_numpy(self.node_text),
            topic_mask=topic_mask,
            answer_mask=answer_mask,
            edge_index=torch.from_numpy(np.stack([src, dst])),
            edge_text=torch.from_numpy(rel),
            edge_kind=torch.from_numpy(kind),
            answer_index=torch.tensor(self.answer_nodes, dtype=torch.long),
            ungrounded_text=torch.tensor(self.ungrounded_text, dtype=torch.long),
            ungrounded_question_index=torch.full((len(self.ungrounded_text),), virtual, dtype=torch.long),
            answer_grounding=torch.tensor(self.grounding, dtype=torch.long),
            answer_rank=torch.tensor(self.answer_rank),
            num_answer_items=torch.tensor([answers]),
            y=torch.tensor(self.labels),
            labelled=torch.tensor([self.labelled]),
            proposer_confidence=torch.tensor(self.confidences, dtype=torch.float),
            answer_signals=torch.tensor(self.answer_signals, dtype=torch.float).view(answers, len(SIGNALS)),
            question_index=torch.tensor([virtual]),
            qid=self.qid,
            answer_names=self.answer_names,
            answer_entries=self.answer_entries,
        )


def compact_graph(g: Data) -> Data:
    """``g`` in about a quarter of the memory, for keeping a split's graphs between epochs: the reverse edges that
    :func:`~kglightning.datamodules.detection_graphs.build_detection_graph` adds (the forward edges mirrored, right
    after them) are dropped, and the id tensors
    are stored as ``int32`` (``edge_kind`` as ``int8``). :func:`expand_graph` gives back exactly ``g``."""
    if "compact_reverse" in g:
        return g
    kind = g.edge_kind
    m = int((kind == EDGE_FORWARD).sum())
    mirrored = (
        m > 0
        and kind.numel() >= 2 * m
        and bool((kind[:m] == EDGE_FORWARD).all() and (kind[m : 2 * m] == EDGE_REVERSE).all())
        and not bool((kind[2 * m :] != EDGE_VIRTUAL).any())
        and torch.equal(g.edge_index[:, m : 2 * m], g.edge_index[:, :m].flip(0))
        and torch.equal(g.edge_text[m : 2 * m], g.edge_text[:m])
    )
    out = copy.copy(g)  # shallow: the tensors replaced below are new, the others shared
    if mirrored:
        keep = torch.cat([torch.arange(m), torch.arange(2 * m, kind.numel())])
        out.edge_index, out.edge_text, kind = g.edge_index[:, keep], g.edge_text[keep], kind[keep]
    out.edge_index, out.edge_text, out.node_text = (_narrow(t) for t in (out.edge_index, out.edge_text, g.node_text))
    out.edge_kind = kind.to(torch.int8)
    out.compact_reverse = torch.tensor(m if mirrored else -1)  # forward edges whose mirror was dropped
    return out


def _narrow(t: Tensor) -> Tensor:
    """``t`` as ``int32`` when every value fits (a table of 2**31 rows or more keeps ``int64``)."""
    fits = not t.numel() or (int(t.max()) < 2**31 and int(t.min()) >= -(2**31))
    return t.to(torch.int32) if fits else t


def expand_graph(g: Data) -> Data:
    """The graph :func:`compact_graph` was given (a graph that is not compact is returned as it is)."""
    if "compact_reverse" not in g:
        return g
    m = int(g.compact_reverse)
    out = copy.copy(g)
    del out.compact_reverse
    ei, text, kind = g.edge_index.long(), g.edge_text.long(), g.edge_kind.long()
    if m >= 0:
        ei = torch.cat([ei[:, :m], ei[:, :m].flip(0), ei[:, m:]], dim=1)
        text = torch.cat([text[:m], text[:m], text[m:]])
        kind = torch.cat([kind[:m], torch.full((m,), EDGE_REVERSE, dtype=torch.long), kind[m:]])
    out.edge_index, out.edge_text, out.edge_kind, out.node_text = ei, text, kind, g.node_text.long()
    return out


def collate_graphs(items: list[Data], rows: Callable[[Tensor], Tensor]) -> Batch:
    """Batch graphs (full or compact) and look their texts up with ``rows`` (table rows ``(...)`` to embeddings
    ``(..., text_dim)``, e.g. ``EmbeddingCache.rows``): what the detector reads.

    Edge features are given per edge type (:func:`~kglightning.nn.kgguard.edge_types`): ``type_text_emb (T,
    text_dim)`` and ``type_kind (T,)`` for the batch's distinct (relation, kind) pairs, and ``edge_type (E,)``;
    ``question`` is each answer's question embedding.
    """
    if all("compact_reverse" in g for g in items):  # as a split keeps them: expanded once, for the whole batch
        batch = _expand_batch(Batch.from_data_list(items))
    else:
        batch = Batch.from_data_list([expand_graph(g) for g in items])
    batch.x_text = rows(batch.node_text)
    batch.ungrounded_x = rows(batch.ungrounded_text)
    type_text, batch.type_kind, batch.edge_type = edge_types(batch.edge_text, batch.edge_kind)
    batch.type_text_emb = rows(type_text)
    batch.question = batch.x_text[batch.question_index][batch.batch[batch.answer_index]]
    return batch


def _expand_batch(batch: Batch) -> Batch:
    """A batch of compact graphs made what ``Batch.from_data_list`` of their :func:`expand_graph` forms gives: each
    graph's mirrored forward edges put back right after them, in the same order, and the ids made ``int64``. One
    gather for the whole batch instead of one expansion per graph (the batch's edge slices are updated to match)."""
    slices = batch._slice_dict["edge_index"]
    count = (slices[1:] - slices[:-1]).numpy()  # each graph's compact edges
    mirrored = np.maximum(batch.compact_reverse.numpy().astype(np.int64), 0)  # -1: nothing was dropped
    length = count + mirrored
    graph = np.repeat(np.arange(len(count)), length)
    at = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)  # position in its graph
    m = mirrored[graph]
    mirror = (at >= m) & (at < 2 * m)
    index = torch.from_numpy(slices[:-1].numpy()[graph] + np.where(at < m, at, at - m))
    mirror_t = torch.from_numpy(mirror)
    ei = batch.edge_index.long().index_select(1, index)
    batch.edge_index = torch.where(mirror_t, ei.flip(0), ei)
    batch.edge_text = batch.edge_text.long().index_select(0, index)
    kind = batch.edge_kind.long().index_select(0, index)
    batch.edge_kind = torch.where(mirror_t, torch.full_like(kind, EDGE_REVERSE), kind)
    batch.node_text = batch.node_text.long()
    new_slices = torch.from_numpy(np.concatenate([[0], np.cumsum(length)]))
    for key in ("edge_index", "edge_text", "edge_kind"):
        batch._slice_dict[key] = new_slices
    del batch.compact_reverse
    del batch._slice_dict["compact_reverse"], batch._inc_dict["compact_reverse"]
    return batch
