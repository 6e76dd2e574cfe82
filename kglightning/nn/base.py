"""The interface every graph encoder of the detector implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from kglightning.nn.receptive import receptive_blocks


@dataclass
class NodeRows:
    """Node features built for the nodes asked for: ``rows(ids)`` gives the ``(len(ids), in_channels)`` features of
    nodes ``ids`` of ``num_nodes``. :meth:`GraphEncoder.node_states` takes them in place of a full ``x`` when the
    features are cheaper to build for a few rows than for all (a concatenation with learned parts, whose backward
    would otherwise run over every node of the batch). Only this module's ``node_states`` take them: an encoder that
    overrides ``node_states`` is given a tensor (:func:`takes_node_rows`)."""

    num_nodes: int
    rows: Callable[[Tensor], Tensor]
    device: torch.device | str = "cpu"

    def all(self) -> Tensor:
        """The features of every node."""
        return self.rows(torch.arange(self.num_nodes, device=self.device))


def takes_node_rows(encoder: GraphEncoder) -> bool:
    """Whether ``encoder.node_states`` is one of this module's, which take :class:`NodeRows`: an encoder that
    overrides it (as docs/architecture.md shows) is given a plain tensor, as before ``NodeRows`` existed."""
    return type(encoder).node_states in (GraphEncoder.node_states, _StackedAttentionEncoder.node_states)


class GraphEncoder(nn.Module, ABC):
    """A message-passing encoder ``(x, edge_index, edge_attr[, edge_type]) -> h``.

    Subclasses take ``in_channels`` and ``edge_dim`` as their first two ``__init__`` arguments, so a module can
    receive them as ``Callable[[int, int], GraphEncoder]`` and inject the sizes it knows (see
    :class:`kglightning.modules.HallucinationDetector`). They set :attr:`out_channels`.

    Edge features come per edge (``edge_attr (E, edge_dim)``) or, for an encoder with
    :attr:`supports_edge_types`, per edge type: ``edge_attr (T, edge_dim)`` with ``edge_type (E,)``, edge ``e``
    having ``edge_attr[edge_type[e]]``. A KG subgraph has few relations and many edges, so an encoder that projects
    the ``T`` type rows instead of the ``E`` edge rows saves most of its edge work. Callers gather
    ``edge_attr[edge_type]`` themselves for an encoder without that support (see :meth:`edge_features`).

    :meth:`node_states` returns the states of some nodes only; an encoder may then skip what those states do not
    depend on (:class:`_StackedAttentionEncoder` does), the default runs :meth:`forward` on the whole graph.
    """

    out_channels: int
    #: whether :meth:`forward` accepts ``edge_type`` (edge features given per edge type)
    supports_edge_types: bool = False

    @abstractmethod
    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, edge_type: Tensor | None = None) -> Tensor:
        """Node states ``(N, out_channels)``."""

    def edge_features(self, edge_attr: Tensor, edge_type: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``(edge_attr, edge_type)`` in the form this encoder takes: per-type rows are gathered to per-edge rows
        unless the encoder :attr:`supports_edge_types`."""
        if edge_type is None or self.supports_edge_types:
            return edge_attr, edge_type
        return edge_attr.index_select(0, edge_type), None

    def node_states(
        self,
        x: Tensor | NodeRows,
        edge_index: Tensor,
        edge_attr: Tensor,
        edge_type: Tensor | None = None,
        targets: Tensor | None = None,
    ) -> Tensor:
        """States ``(K, out_channels)`` of the ``targets`` nodes (``(N, out_channels)`` of all when ``None``);
        ``x`` is the node features or a :class:`NodeRows` that builds them; ``edge_attr`` may be per edge type with
        ``edge_type`` whatever the encoder supports."""
        x = x.all() if isinstance(x, NodeRows) else x
        h = self(x, edge_index, *self.edge_features(edge_attr, edge_type))
        return h if targets is None else h.index_select(0, targets)

    def reset_parameters(self) -> None:
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()


class _StackedAttentionEncoder(GraphEncoder):
    """Shared body of the attention encoders: input projection, then per layer conv → residual → LayerNorm →
    ReLU → dropout. Subclasses only say which conv a layer is (:meth:`make_conv`); a conv that takes
    ``conv(h, edge_index, edge_attr, edge_type)`` (see :mod:`kglightning.nn.conv`) gets per-type edge features.

    Args:
        in_channels: node feature size.
        edge_dim: edge feature size.
        hidden_channels: output size of every layer (``heads * per-head size``).
        num_layers: number of attention layers.
        heads: attention heads per layer (concatenated).
        dropout: dropout on attention weights and on layer outputs.

    Shapes:
        - input: ``x (N, in_channels)``, ``edge_index (2, E)``, ``edge_attr (E, edge_dim)``, or
          ``edge_attr (T, edge_dim)`` with ``edge_type (E,)``
        - output: ``(N, hidden_channels)``
    """

    supports_edge_types = True

    def __init__(
        self,
        in_channels: int,
        edge_dim: int,
        hidden_channels: int = 256,
        num_layers: int = 2,
        heads: int = 8,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if hidden_channels % heads:
            raise ValueError(f"hidden_channels ({hidden_channels}) must be divisible by heads ({heads})")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.in_channels = in_channels
        self.out_channels = hidden_channels
        self.num_layers = num_layers
        self.heads = heads
        self.dropout = dropout
        self.input_proj = nn.Linear(in_channels, hidden_channels)
        self.convs = nn.ModuleList(
            [self.make_conv(hidden_channels, heads, dropout, edge_dim) for _ in range(num_layers)]
        )
        self.norms = nn.ModuleList([nn.LayerNorm(hidden_channels) for _ in range(num_layers)])

    @abstractmethod
    def make_conv(self, channels: int, heads: int, dropout: float, edge_dim: int) -> nn.Module:
        """One attention layer ``channels -> channels`` (``heads`` concatenated heads) taking edge features."""

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, edge_type: Tensor | None = None) -> Tensor:
        h = self.input_proj(x)
        for conv, norm in zip(self.convs, self.norms):
            h = self._finish(h, conv(h, edge_index, edge_attr, edge_type), norm)
        return h

    def _finish(self, h: Tensor, message: Tensor, norm: nn.Module) -> Tensor:
        h = norm(h + message)
        return nn.functional.dropout(torch.relu(h), p=self.dropout, training=self.training)

    def node_states(
        self,
        x: Tensor | NodeRows,
        edge_index: Tensor,
        edge_attr: Tensor,
        edge_type: Tensor | None = None,
        targets: Tensor | None = None,
    ) -> Tensor:
        """States of ``targets`` computed on their receptive field only
        (:func:`~kglightning.nn.receptive.receptive_blocks`): each layer runs on the nodes and edges the next one reads, the last on ``targets``.
        Equal to ``forward(...)[targets]``; on KG-Guard's graphs (about 1.5 % of nodes are answers) it does about a
        quarter of the node work. A :class:`NodeRows` ``x`` builds the features of the first layer's nodes only."""
        if targets is None:
            return self(x.all() if isinstance(x, NodeRows) else x, edge_index, edge_attr, edge_type)
        wanted, order = targets.unique(return_inverse=True)
        num_nodes = x.num_nodes if isinstance(x, NodeRows) else x.size(0)
        blocks = receptive_blocks(edge_index, wanted, len(self.convs), num_nodes)
        # index_select, not x[...]: its backward is a fast scatter-add, that of advanced indexing is not
        first = blocks[0].nodes
        h = self.input_proj(x.rows(first) if isinstance(x, NodeRows) else x.index_select(0, first))
        for block, conv, norm in zip(blocks, self.convs, self.norms):
            if edge_type is None:
                attr, types = edge_attr.index_select(0, block.edge_ids), None
            else:
                attr, types = edge_attr, edge_type.index_select(0, block.edge_ids)
            out = h[: block.num_out]
            h = self._finish(out, conv((h, out), block.edge_index, attr, types), norm)
        return h.index_select(0, order)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, num_layers={self.num_layers}, "
            f"heads={self.heads})"
        )
