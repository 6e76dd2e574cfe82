"""The part of a graph that a few message-passing layers need to compute the states of some target nodes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LayerBlock:
    """What one message-passing layer computes when only some nodes' outputs are needed.

    Attributes:
        nodes: ``(S,)`` global ids of the layer's input nodes; the first ``num_out`` of them are its output nodes
            (so an output node's own input state is row ``i`` of both, as residuals and self-loops expect).
        num_out: how many output nodes the layer has.
        edge_mask: ``(E,)`` bool, the edges into the output nodes (all that the layer reads).
        edge_ids: ``(E',)`` the indices of those edges.
        edge_index: ``(2, E')`` those edges renumbered: sources index ``nodes``, targets index its first
            ``num_out`` rows.
    """

    nodes: Tensor
    num_out: int
    edge_mask: Tensor
    edge_ids: Tensor
    edge_index: Tensor


def receptive_blocks(edge_index: Tensor, targets: Tensor, num_layers: int, num_nodes: int) -> list[LayerBlock]:
    """The blocks of ``num_layers`` stacked layers that compute the final states of ``targets`` (first layer first).

    Working back from the last layer: a layer's output nodes are the next layer's input nodes (the last layer's are
    ``targets``), and its input nodes are its output nodes plus the sources of every edge into them. Running the
    layers on these blocks gives exactly the targets' states of a run on the whole graph, with every node-wise
    operation applied to the rows that matter only.

    Args:
        edge_index: ``(2, E)`` source/target node ids.
        targets: ``(K,)`` distinct node ids whose final states are wanted.
        num_layers: number of message-passing layers.
        num_nodes: number of nodes ``N``.

    Example:
        >>> ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])  # a path 0 -> 1 -> 2 -> 3 -> 4
        >>> blocks = receptive_blocks(ei, torch.tensor([4]), num_layers=2, num_nodes=5)
        >>> [(b.nodes.tolist(), b.num_out, b.edge_index.tolist()) for b in blocks]
        [([4, 3, 2], 2, [[2, 1], [1, 0]]), ([4, 3], 1, [[1], [0]])]
    """
    if targets.unique().numel() != targets.numel():
        raise ValueError("targets must be distinct node ids")
    local = torch.full((num_nodes,), -1, dtype=torch.long, device=edge_index.device)
    is_out = torch.zeros(num_nodes, dtype=torch.bool, device=edge_index.device)
    out_nodes = targets
    blocks: list[LayerBlock] = []
    for _ in range(num_layers):
        is_out.zero_()
        is_out[out_nodes] = True
        edge_mask = is_out[edge_index[1]]
        sources = edge_index[0, edge_mask]
        extra = sources[~is_out[sources]].unique()
        nodes = torch.cat([out_nodes, extra])
        local[nodes] = torch.arange(nodes.numel(), device=edge_index.device)
        edge_ids = edge_mask.nonzero().squeeze(1)
        blocks.append(LayerBlock(nodes, out_nodes.numel(), edge_mask, edge_ids, local[edge_index[:, edge_ids]]))
        out_nodes = nodes
    return blocks[::-1]
