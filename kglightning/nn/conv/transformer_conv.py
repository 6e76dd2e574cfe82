"""``TransformerConv`` with edge features given per edge type."""

from __future__ import annotations

import math

from torch import Tensor
from torch.nn import functional as F
from torch_geometric.nn import TransformerConv
from torch_geometric.utils import softmax

from kglightning.nn.conv.typed import TypedEdgesMixin


class TypedTransformerConv(TypedEdgesMixin, TransformerConv):
    """PyG's :class:`~torch_geometric.nn.conv.TransformerConv` (Shi et al., 2021) that also accepts edge features
    as a table of edge *types*.

    With ``edge_type`` given, ``edge_attr`` holds one row per type and edge ``e`` has the features
    ``edge_attr[edge_type[e]]``. The edge projection ``W_e`` is then applied to the ``T`` type rows only and its
    result gathered along the edges, which is exact (``W_e`` is linear) and saves the ``(E, edge_dim) x
    (edge_dim, heads * out_channels)`` products of the forward and backward passes. The attention is the layer's
    usual one: ``alpha_ij = softmax_j((W_q x_i)^T (W_k x_j + W_e e_ij) / sqrt(d))`` and
    ``x_i' = W_s x_i + sum_j alpha_ij (W_v x_j + W_e e_ij)``. Without ``edge_type`` it is ``TransformerConv``.

    Takes the arguments of ``TransformerConv``.

    Shapes:
        - input: ``x (N, in_channels)``, ``edge_index (2, E)``, ``edge_attr (E, edge_dim)`` or ``(T, edge_dim)``
          with ``edge_type (E,)`` in ``[0, T)``
        - output: ``(N, heads * out_channels)`` (``concat=True``) or ``(N, out_channels)``

    Example:
        >>> import torch
        >>> conv = TypedTransformerConv(8, 4, heads=2, edge_dim=3).eval()
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
        return_attention_weights: bool | None = None,
    ):
        def call(edge: Tensor | None):
            return super(TypedTransformerConv, self).forward(x, edge_index, edge, return_attention_weights)

        return self.typed_forward(call, edge_attr, edge_type)

    def type_values(self, edge_attr: Tensor) -> Tensor:
        """Each type's projection ``W_e e``, ``(T, heads * out_channels)``."""
        return self.lin_edge(edge_attr)

    def message(
        self,
        query_i: Tensor,
        key_j: Tensor,
        value_j: Tensor,
        edge_attr: Tensor | None,
        index: Tensor,
        ptr: Tensor | None,
        size_i: int | None,
    ) -> Tensor:
        if not self._typed_edges:
            return super().message(query_i, key_j, value_j, edge_attr, index, ptr, size_i)
        edge = edge_attr.view(-1, self.heads, self.out_channels)  # already W_e e_ij
        alpha = (query_i * (key_j + edge)).sum(dim=-1) / math.sqrt(self.out_channels)
        alpha = softmax(alpha, index, ptr, size_i)
        self._alpha = alpha
        alpha = F.dropout(alpha, p=self.dropout, training=self.training)
        return (value_j + edge) * alpha.unsqueeze(-1)
