"""Retrieval over a question's graph: text documents for LLM reasoners, faiss grounding of answers (floor 3)."""

from kglightning.retrieval.documents import DocumentSource, EvidenceDocuments
from kglightning.retrieval.faiss_grounding import FaissGrounder, faiss_gpu_available
from kglightning.retrieval.path_documents import PathDocuments
from kglightning.retrieval.pcst import PCSTRetriever
from kglightning.retrieval.subgraphs import PCSTSubgraphs

__all__ = [
    "DocumentSource",
    "EvidenceDocuments",
    "FaissGrounder",
    "PCSTRetriever",
    "PCSTSubgraphs",
    "PathDocuments",
    "faiss_gpu_available",
]
