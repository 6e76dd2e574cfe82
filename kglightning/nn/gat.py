"""GAT encoder: stacked PyG ``GATConv`` layers whose attention also sees the edge features."""

from __future__ import annotations

from torch_geometric.nn import GATConv

from kglightning.nn.base import _StackedAttentionEncoder


class GATEncoder(_StackedAttentionEncoder):
    """Graph attention network (Veličković et al., 2018) with relation embeddings in the attention scores.

    Each layer is ``GATConv(hidden, hidden // heads, heads, edge_dim=edge_dim)`` with concatenated heads, a
    residual connection, LayerNorm, ReLU and dropout. Inputs are first projected to ``hidden_channels``.

    Args:
        in_channels: node feature size.
        edge_dim: edge feature size.
        hidden_channels: output size of every layer (``heads * per-head size``).
        num_layers: number of attention layers.
        heads: attention heads per layer.
        dropout: dropout on attention weights and on layer outputs.

    Shapes:
        - input: ``x (N, in_channels)``, ``edge_index (2, E)``, ``edge_attr (E, edge_dim)``
        - output: ``(N, hidden_channels)``

    Example:
        >>> import torch
        >>> enc = GATEncoder(8, 4, hidden_channels=16, num_layers=2, heads=4)
        >>> enc(torch.randn(3, 8), torch.tensor([[0, 1], [1, 2]]), torch.randn(2, 4)).shape
        torch.Size([3, 16])
    """

    def __init__(
        self,
        in_channels: int,
        edge_dim: int,
        hidden_channels: int = 256,
        num_layers: int = 2,
        heads: int = 8,
        dropout: float = 0.1,
    ) -> None:
        super().__init__(in_channels, hidden_channels, num_layers, heads, dropout)
        for _ in range(num_layers):
            self.convs.append(
                GATConv(
                    hidden_channels, hidden_channels // heads, heads=heads, concat=True, dropout=dropout,
                    edge_dim=edge_dim, add_self_loops=True,
                )
            )
