"""PyG attention layers whose edge features may be given once per edge *type* (one layer per file).

A KG subgraph has many edges but few distinct relations, so projecting each relation's features once and gathering
them along the edges gives the same result as projecting every edge, for a fraction of the work.
"""

from kglightning.nn.conv.gat_conv import TypedGATConv
from kglightning.nn.conv.transformer_conv import TypedTransformerConv

__all__ = ["TypedGATConv", "TypedTransformerConv"]
