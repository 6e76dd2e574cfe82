"""The interface every graph encoder of the detector implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn


class GraphEncoder(nn.Module, ABC):
    """A message-passing encoder ``(x, edge_index, edge_attr) -> h``.

    Subclasses take ``in_channels`` and ``edge_dim`` as their first two ``__init__`` arguments, so a module can
    receive them as ``Callable[[int, int], GraphEncoder]`` and inject the sizes it knows (see
    :class:`kglightning.modules.HallucinationDetector`). They set :attr:`out_channels`.
    """

    out_channels: int

    @abstractmethod
    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        """Node states ``(N, out_channels)``."""

    def reset_parameters(self) -> None:
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()


class _StackedAttentionEncoder(GraphEncoder):
    """Shared body of the attention encoders: input projection, then per layer conv → residual → LayerNorm →
    ReLU → dropout. Subclasses only say which conv a layer is (:meth:`make_conv`).

    Args:
        in_channels: node feature size.
        edge_dim: edge feature size.
        hidden_channels: output size of every layer (``heads * per-head size``).
        num_layers: number of attention layers.
        heads: attention heads per layer (concatenated).
        dropout: dropout on attention weights and on layer outputs.

    Shapes:
        - input: ``x (N, in_channels)``, ``edge_index (2, E)``, ``edge_attr (E, edge_dim)``
        - output: ``(N, hidden_channels)``
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

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        h = self.input_proj(x)
        for conv, norm in zip(self.convs, self.norms):
            h = norm(h + conv(h, edge_index, edge_attr))
            h = nn.functional.dropout(torch.relu(h), p=self.dropout, training=self.training)
        return h

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, num_layers={self.num_layers}, "
            f"heads={self.heads})"
        )
