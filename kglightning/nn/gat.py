"""GAT encoder: stacked PyG ``GATConv`` layers whose attention also sees the edge features.

KG-Guard's detector with this encoder is ``configs/detector_gat.yaml``:
``python -m kglightning fit --config configs/detector_gat.yaml`` trains it on the embedded benchmark (see the
KG-Guard method page for its results beside the GraphTransformer's).
"""

from __future__ import annotations

from kglightning.nn.base import _StackedAttentionEncoder
from kglightning.nn.conv import TypedGATConv


class GATEncoder(_StackedAttentionEncoder):
    """Graph attention network (Veličković et al., 2018) with relation embeddings in the attention scores.

    Each layer is ``GATConv(hidden, hidden // heads, heads, edge_dim=edge_dim)`` (as
    :class:`~kglightning.nn.conv.TypedGATConv`, so edge features may come per edge type) with concatenated heads and self
    loops, wrapped as described in :class:`~kglightning.nn.base._StackedAttentionEncoder`, whose arguments it
    takes: ``in_channels, edge_dim, hidden_channels=256, num_layers=2, heads=8, dropout=0.1``.

    Example:
        >>> import torch
        >>> enc = GATEncoder(8, 4, hidden_channels=16, num_layers=2, heads=4)
        >>> enc(torch.randn(3, 8), torch.tensor([[0, 1], [1, 2]]), torch.randn(2, 4)).shape
        torch.Size([3, 16])
    """

    def make_conv(self, channels: int, heads: int, dropout: float, edge_dim: int) -> TypedGATConv:
        return TypedGATConv(
            channels,
            channels // heads,
            heads=heads,
            concat=True,
            dropout=dropout,
            edge_dim=edge_dim,
            add_self_loops=True,
        )
