"""Retrieval over a question's graph: text documents for LLM reasoners, faiss grounding of answers (floor 3)."""

from typing import TYPE_CHECKING

from kglightning.lazy import lazy_exports

if TYPE_CHECKING:  # the exports, imported on first use (kglightning.lazy)
    from kglightning.retrieval.documents import DocumentSource, EvidenceDocuments
    from kglightning.retrieval.faiss_grounding import FaissGrounder, faiss_gpu_available
    from kglightning.retrieval.path_documents import PathDocuments
    from kglightning.retrieval.pcst import PCSTRetriever
    from kglightning.retrieval.subgraphs import PCSTSubgraphs

__getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "DocumentSource",
    "EvidenceDocuments",
    "FaissGrounder",
    "PCSTRetriever",
    "PCSTSubgraphs",
    "PathDocuments",
    "faiss_gpu_available",
]
