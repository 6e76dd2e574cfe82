"""GraphTransformer encoder: stacked PyG ``TransformerConv`` layers with edge features."""

from __future__ import annotations

from kglightning.nn.base import _StackedAttentionEncoder
from kglightning.nn.conv import TypedTransformerConv


class GraphTransformerEncoder(_StackedAttentionEncoder):
    """Multi-head dot-product graph attention (Shi et al., 2021) with relation embeddings as edge features.

    Each layer is ``TransformerConv(hidden, hidden // heads, heads, edge_dim=edge_dim)`` (as
    :class:`~kglightning.nn.conv.TypedTransformerConv`, so edge features may come per edge type) with concatenated heads,
    wrapped as described in :class:`~kglightning.nn.base._StackedAttentionEncoder`, whose arguments it takes:
    ``in_channels, edge_dim, hidden_channels=256, num_layers=2, heads=8, dropout=0.1``.

    Example:
        >>> import torch
        >>> enc = GraphTransformerEncoder(8, 4, hidden_channels=16, num_layers=2, heads=4)
        >>> enc(torch.randn(3, 8), torch.tensor([[0, 1], [1, 2]]), torch.randn(2, 4)).shape
        torch.Size([3, 16])
    """

    def make_conv(self, channels: int, heads: int, dropout: float, edge_dim: int) -> TypedTransformerConv:
        return TypedTransformerConv(
            channels, channels // heads, heads=heads, concat=True, dropout=dropout, edge_dim=edge_dim
        )
