"""What both typed layers share: edge features given per type are transformed once per type, then gathered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor


class TypedEdgesMixin:
    """For a PyG attention layer with a ``lin_edge`` projection: run its ``forward`` on per-type edge features.

    A subclass implements :meth:`type_values` (what the layer computes from an edge's features, as far as it is
    linear, for the ``T`` type rows) and reads ``_typed_edges`` in its message or edge-update step: while it is
    ``True``, ``edge_attr`` holds those values gathered along the edges instead of raw features.
    """

    lin_edge: Any
    _typed_edges = False

    def type_values(self, edge_attr: Tensor) -> Tensor:
        """The layer's linear map of the ``(T, edge_dim)`` type features, row per type."""
        raise NotImplementedError

    def typed_forward(self, call: Callable[[Tensor | None], Any], edge_attr: Tensor | None, edge_type: Tensor | None):
        """``call(edge_attr)`` (the parent's ``forward`` with these edge features) for edge features per edge or
        per type (``edge_type``)."""
        if edge_type is None:
            return call(edge_attr)
        if edge_attr is None:
            raise ValueError("edge_type needs edge_attr: one feature row per edge type")
        if self.lin_edge is None:  # the layer ignores edge features
            return call(edge_attr.index_select(0, edge_type))
        # index_select: its backward is a scatter-add (advanced indexing's is several times slower on CPU)
        values = self.type_values(edge_attr).index_select(0, edge_type)
        self._typed_edges = True
        try:
            return call(values)
        finally:
            self._typed_edges = False
