"""Plain torch / PyG modules (no Lightning imports)."""

from kglightning.nn.base import GraphEncoder, NodeRows
from kglightning.nn.gat import GATEncoder
from kglightning.nn.graph_transformer import GraphTransformerEncoder
from kglightning.nn.kgguard import EDGE_FORWARD, EDGE_REVERSE, EDGE_VIRTUAL, KGGuard
from kglightning.nn.ungrounded import UngroundedAnswerScorer, nearest_nodes

__all__ = [
    "UngroundedAnswerScorer",
    "nearest_nodes",
    "EDGE_FORWARD",
    "EDGE_REVERSE",
    "EDGE_VIRTUAL",
    "GATEncoder",
    "GraphEncoder",
    "GraphTransformerEncoder",
    "NodeRows",
    "KGGuard",
]
