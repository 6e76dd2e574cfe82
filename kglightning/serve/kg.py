"""The server's KG: a request that sends the question's topic entities instead of its subgraph gets the subgraph cut
here, with the retrieval of ``build-subgraphs`` (:class:`~kglightning.retrieval.pcst.PCSTRetriever`: a k-hop
neighbourhood of the topic entities cut by a prize-collecting Steiner tree, its defaults or the settings given).

Texts the embedding cache holds (the KG's names, once ``build-subgraphs`` or a training run encoded them) come from
it; the question and any other text are encoded per request and never stored
(:class:`~kglightning.data.embeddings.TransientEmbeddings`), so a long-running server neither grows the cache nor
gives a request a cut that depends on the requests before it.

Example:
    >>> import tempfile
    >>> from kglightning.data.kg import KGIndex
    >>> from kglightning.data.records import KGQARecord
    >>> kg = KGIndex.from_triples([("France", "capital", "Paris"), ("France", "language", "French"),
    ...     ("Paris", "river", "Seine"), ("France", "currency", "Euro")])
    >>> served = ServedKG(kg, {"topk": 2, "topk_e": 2}, cache_dir=tempfile.mkdtemp())
    >>> record = KGQARecord("q", "Which river flows through the capital of France?", [], ["France", "Atlantis"],
    ...                     [], [], ["Seine"])
    >>> cut, info = served.cut(record)
    >>> cut.graph, info["missing_topic_entities"]
    ([('France', 'capital', 'Paris'), ('Paris', 'river', 'Seine')], ['Atlantis'])
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kglightning.data.embeddings import SentenceEncoder, TransientEmbeddings
from kglightning.data.kg import KGIndex
from kglightning.data.records import KGQARecord
from kglightning.retrieval.pcst import PCSTRetriever, SubgraphStats

__all__ = ["RETRIEVAL_KEYS", "ServedKG", "check_retrieval", "load_served_kg"]

#: the settings of ``kg_retrieval`` (``build-subgraphs``' options of the same names; ``encoder``: a
#: sentence-transformers folder, default the bundled MiniLM)
RETRIEVAL_KEYS = ("hops", "topk", "topk_e", "cost_e", "max_degree", "max_nodes", "encoder")


def load_served_kg(spec: str) -> KGIndex:
    """The KG named by ``spec``: ``"embedded"`` (the embedded benchmark's) or a triples file, read as
    ``build-subgraphs --kg`` reads it (from the index cache when it was indexed before)."""
    if spec == "embedded":
        from kglightning.retrieval.build_subgraphs import embedded_kg

        return embedded_kg()
    from kglightning.data.sources.triples import load_kg

    return load_kg(spec)


class ServedKG:
    """Cuts a request's subgraph from a KG, as ``build-subgraphs`` would.

    Args:
        kg: the KG.
        retrieval: :data:`RETRIEVAL_KEYS` settings of the retriever (the others: ``build-subgraphs``' defaults).
        source: what the responses name the KG by.
        cache_dir: the embedding cache read (default ``$KGLIGHTNING_CACHE/embeddings``, where ``build-subgraphs``
            writes).

    Raises:
        ValueError: a setting that is not one of :data:`RETRIEVAL_KEYS`, or a value the retriever refuses.
    """

    def __init__(
        self, kg: KGIndex, retrieval: Mapping[str, Any] | None = None, source: str = "", cache_dir: str | None = None
    ) -> None:
        settings = dict(retrieval or {})
        check_retrieval(settings)
        folder = settings.pop("encoder", None)
        encoder = SentenceEncoder(folder, show_progress=False) if folder else SentenceEncoder(show_progress=False)
        self.retriever = PCSTRetriever(encoder, cache_dir=cache_dir, show_progress=False, **settings)
        self.kg, self.source = kg, source

    def cut(self, record: KGQARecord) -> tuple[KGQARecord, dict[str, Any]]:
        """``record`` with its subgraph cut from the KG around its topic entities and only those that are in the KG
        as topic entities (as ``build-subgraphs`` writes it; an empty graph when none is), and what the response says
        of the cut."""
        self.retriever.stats = SubgraphStats()  # one request's: a server's stats would grow without end
        out = self.retriever.retrieve_record(record, self.kg, TransientEmbeddings(self.retriever.embeddings))
        # no topic entity in the KG: an empty graph (the schema refuses such a request first)
        cut = out if out is not None else replace(record, graph=[], q_entity=[])
        nodes = {n for h, _, t in cut.graph for n in (h, t)}
        info = {
            "kg": self.source,
            "triples": len(cut.graph),
            "nodes": len(nodes),
            "topic_entities": list(cut.q_entity),  # those in the KG, as retrieve_record keeps them
            "missing_topic_entities": [e for e in record.q_entity if e not in self.kg],
        }
        return cut, info


def check_retrieval(settings: Mapping[str, Any]) -> None:
    """``ValueError`` naming the first setting that is not one of :data:`RETRIEVAL_KEYS`, or of a wrong type or range
    (checked when the server starts, not by the first request)."""
    unknown = sorted(set(settings) - set(RETRIEVAL_KEYS))
    if unknown:
        raise ValueError(f"kg_retrieval: unknown setting(s) {', '.join(unknown)} (known: {', '.join(RETRIEVAL_KEYS)})")
    at_least = {"hops": 1, "topk": 0, "topk_e": 0, "max_degree": 1, "max_nodes": 1}
    for name, value in settings.items():
        if name in at_least:
            nullable = name in ("max_degree", "max_nodes")
            if value is None and nullable:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < at_least[name]:
                kind = f"a whole number >= {at_least[name]}" + (" or null" if nullable else "")
                raise ValueError(f"kg_retrieval: {name} must be {kind}, got {value!r}")
        elif name == "cost_e":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"kg_retrieval: cost_e must be a finite number >= 0, got {value!r}")
        elif name == "encoder" and not isinstance(value, str):
            raise ValueError(f"kg_retrieval: encoder must be a folder's path, got {value!r}")
