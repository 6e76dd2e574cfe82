"""G-Retriever's prize-collecting Steiner tree cut, with its prize and cost set-up in array operations.

:func:`pcst_cut` selects what PyG's :func:`torch_geometric.llm.utils.backend_utils.retrieval_via_pcst` selects, the
same edges in the same order and the same nodes (``tests/retrieval/test_pcst_prizes.py`` checks it on random graphs
with tied scores), without its per-edge Python loop (a 0-d tensor per edge) and its ``sum`` over a boolean tensor for
each of the ``topk_e`` prize levels, which took most of a question's time on graphs of thousands of triples. It also
skips the CSV text and the pandas tables PyG builds for G-Retriever's prompt, which the toolkit does not read.

The set-up, as G-Retriever defines it: the ``topk`` nodes most similar to the question get prizes ``topk, ..., 1``;
the ``topk_e`` best distinct edge similarities share prizes ``topk_e, ..., 1`` among their edges (each level capped
just under the one above), every other edge gets 0; an edge costs ``cost_e`` (lowered so at least one edge pays), and
an edge whose prize exceeds its cost becomes a virtual node between its ends holding the difference.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["pcst_cut"]

_C = 0.01  # G-Retriever's margin between prize levels


def _node_prizes(q_emb: Tensor, x: Tensor, topk: int) -> Tensor:
    if topk <= 0:
        return torch.zeros(x.shape[0], device="cpu")
    sims = torch.nn.CosineSimilarity(dim=-1)(q_emb, x)
    k = min(topk, x.shape[0])
    _, best = torch.topk(sims, k, largest=True)
    prizes = torch.zeros_like(sims)
    prizes[best] = torch.arange(k, 0, -1, device=sims.device, dtype=sims.dtype)
    return prizes


def _edge_prizes(q_emb: Tensor, edge_attr: Tensor, topk_e: int, cost_e: float) -> tuple[Tensor, float]:
    if topk_e <= 0:
        return torch.zeros(edge_attr.shape[0], device="cpu"), cost_e
    prizes = torch.nn.CosineSimilarity(dim=-1)(q_emb, edge_attr)
    distinct = prizes.unique()
    k_e = min(topk_e, distinct.size(0))
    levels, _ = torch.topk(distinct, k_e, largest=True)
    prizes[prizes < levels[-1]] = 0.0
    last = k_e
    for k in range(k_e):  # the same float32 arithmetic as G-Retriever's loop, one comparison per level
        at = prizes == levels[k]
        value = min((k_e - k) / at.sum(), last - _C)
        prizes[at] = value
        last = value * (1 - _C)
    return prizes, min(cost_e, prizes.max().item() * (1 - _C / 2))


def pcst_cut(
    edge_index: np.ndarray,
    x: Tensor,
    edge_attr: Tensor,
    q_emb: Tensor,
    topk: int = 3,
    topk_e: int = 5,
    cost_e: float = 0.5,
    num_clusters: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """The PCST selection over one graph: ``(edge ids, node ids)``, in ``retrieval_via_pcst``'s order.

    Args:
        edge_index: ``(2, E)`` integer array of edge ends (node ids in ``[0, N)``).
        x: ``(N, d)`` node embeddings.
        edge_attr: ``(E, d)`` edge embeddings.
        q_emb: ``(1, d)`` question embedding.
        topk, topk_e, cost_e, num_clusters: as G-Retriever (see the module docstring).

    Returns:
        The selected edges (ids into ``edge_index``'s columns: tree edges in ``pcst_fast``'s order, then the edges
        that became virtual nodes) and the sorted selected nodes (the tree's nodes and both ends of every selected
        edge). A graph with no node or no edge selects everything.
    """
    from pcst_fast import pcst_fast

    n, num_e = x.shape[0], int(edge_index.shape[1])
    if num_e == 0 or n == 0 or edge_attr.numel() == 0:
        return np.arange(num_e, dtype=np.int64), np.arange(n, dtype=np.int64)
    n_prizes = _node_prizes(q_emb, x, topk)
    e_prizes, cost = _edge_prizes(q_emb, edge_attr, topk_e, cost_e)
    real = (e_prizes <= cost).numpy()
    real_ids, virt_ids = np.flatnonzero(real), np.flatnonzero(~real)
    ends = np.asarray(edge_index, dtype=np.int64)
    edges = ends[:, real_ids].T
    costs = (cost - e_prizes[torch.from_numpy(real_ids)]).numpy().astype(np.float64)
    prizes = n_prizes.numpy().astype(np.float64)
    if virt_ids.size:
        virtual = n + np.arange(virt_ids.size, dtype=np.int64)
        pairs = np.stack([ends[0, virt_ids], virtual, virtual, ends[1, virt_ids]], axis=1).reshape(-1, 2)
        edges = np.concatenate([edges, pairs])
        costs = np.concatenate([costs, np.zeros(2 * virt_ids.size)])
        extra = (e_prizes[torch.from_numpy(virt_ids)] - cost).numpy().astype(np.float64)
        prizes = np.concatenate([prizes, extra])
    vertices, chosen = pcst_fast(edges, prizes, costs, -1, num_clusters, "gw", 0)
    vertices, chosen = np.asarray(vertices, dtype=np.int64), np.asarray(chosen, dtype=np.int64)
    selected = real_ids[chosen[chosen < real_ids.size]]
    selected = np.concatenate([selected, virt_ids[vertices[vertices >= n] - n]])
    nodes = np.unique(np.concatenate([vertices[vertices < n], ends[0, selected], ends[1, selected]]))
    return selected, nodes
