"""Retrieval over a question's graph: documents for LLM reasoners (floor 3)."""

from kglightning.retrieval.path_documents import PathDocuments

__all__ = ["PathDocuments"]
