"""Plain torch / PyG modules (no Lightning imports)."""

from kglightning.nn.base import GraphEncoder
from kglightning.nn.gat import GATEncoder
from kglightning.nn.graph_transformer import GraphTransformerEncoder
from kglightning.nn.kgguard import EDGE_FORWARD, EDGE_REVERSE, EDGE_VIRTUAL, KGGuard

__all__ = [
    "EDGE_FORWARD",
    "EDGE_REVERSE",
    "EDGE_VIRTUAL",
    "GATEncoder",
    "GraphEncoder",
    "GraphTransformerEncoder",
    "KGGuard",
]
