"""``GATConv`` with edge features given per edge type."""

from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import GATConv

from kglightning.nn.conv.typed import TypedEdgesMixin


class TypedGATConv(TypedEdgesMixin, GATConv):
    """PyG's :class:`~torch_geometric.nn.conv.GATConv` (Veličković et al., 2018, with edge features in the
    attention scores) that also accepts edge features as a table of edge *types*.

    With ``edge_type`` given, ``edge_attr`` holds one row per type and edge ``e`` has the features
    ``edge_attr[edge_type[e]]``. An edge enters GAT only through its attention term ``a_e^T W_e e_ij`` (one number
    per head), so that term is computed for the ``T`` types and gathered along the edges. This is exact: the
    self-loops that GAT adds take the mean of their node's incoming edge features (``fill_value="mean"``), and the
    mean of the per-edge terms equals the term of the mean features, since both maps are linear. Without
    ``edge_type`` it is ``GATConv``.

    Takes the arguments of ``GATConv``.

    Shapes:
        - input: ``x (N, in_channels)``, ``edge_index (2, E)``, ``edge_attr (E, edge_dim)`` or ``(T, edge_dim)``
          with ``edge_type (E,)`` in ``[0, T)``
        - output: ``(N, heads * out_channels)`` (``concat=True``) or ``(N, out_channels)``

    Example:
        >>> import torch
        >>> conv = TypedGATConv(8, 4, heads=2, edge_dim=3).eval()
        >>> x, ei = torch.randn(4, 8), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
        >>> types, edge_type = torch.randn(2, 3), torch.tensor([0, 1, 1, 0])
        >>> torch.allclose(conv(x, ei, types, edge_type), conv(x, ei, types[edge_type]), atol=1e-6)
        True
    """

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        edge_index: Tensor,
        edge_attr: Tensor | None = None,
        edge_type: Tensor | None = None,
        size: tuple[int, int] | None = None,
        return_attention_weights: bool | None = None,
    ):
        def call(edge: Tensor | None):
            return super(TypedGATConv, self).forward(x, edge_index, edge, size, return_attention_weights)

        return self.typed_forward(call, edge_attr, edge_type)

    def type_values(self, edge_attr: Tensor) -> Tensor:
        """Each type's attention term ``a_e^T W_e e``, ``(T, heads)``."""
        projected = self.lin_edge(edge_attr).view(-1, self.heads, self.out_channels)
        return (projected * self.att_edge).sum(dim=-1)

    def edge_update(
        self,
        alpha_j: Tensor,
        alpha_i: Tensor | None,
        edge_attr: Tensor | None,
        index: Tensor,
        ptr: Tensor | None,
        dim_size: int | None,
    ) -> Tensor:
        if self._typed_edges:  # edge_attr holds each edge's attention term already
            return super().edge_update(alpha_j + edge_attr, alpha_i, None, index, ptr, dim_size)
        return super().edge_update(alpha_j, alpha_i, edge_attr, index, ptr, dim_size)
