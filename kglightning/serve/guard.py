"""The detector as a function of requests: :class:`GuardScorer` turns records sent one by one into the rows
``predict`` writes for them, and :func:`verdicts` those rows into a :class:`~kglightning.serve.schema.GuardResponse`.

Nothing here knows of HTTP: the scorer is the detector and the data module a ``predict`` run would use (the same
graph rows, answer features and ``predict_step``), over texts embedded per request
(:class:`~kglightning.data.embeddings.RequestEmbeddings`): a text the data module's cache holds gets the row
``predict`` read for it, so a question the cache has seen gets ``predict``'s probabilities, and a request's result
does not depend on the requests batched with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kglightning.data.embeddings import RequestEmbeddings
from kglightning.data.records import KGQARecord
from kglightning.datamodules.detection import DetectionDataModule
from kglightning.datamodules.graph_forms import collate_graphs
from kglightning.metrics.functional.qa import is_abstention
from kglightning.modules.detector import HallucinationDetector
from kglightning.serve.kg import ServedKG
from kglightning.serve.selection import ServedSelection, answer_kinds

__all__ = ["GuardScorer", "verdicts"]


class GuardScorer:
    """Scores the answers of records with a trained detector, as ``predict`` would.

    Args:
        model: the detector, its trained weights loaded.
        data: the data module it was trained with (its encoder, cache, graph settings and answer features).
        checkpoint: what the responses name the weights by (:func:`~kglightning.fileio.file_digest` of the
            checkpoint).
        kg: the KG that the subgraphs of requests sent without one are cut from (``None``: none).
    """

    def __init__(
        self, model: HallucinationDetector, data: DetectionDataModule, checkpoint: str = "", kg: ServedKG | None = None
    ) -> None:
        if not isinstance(data, DetectionDataModule):
            raise TypeError(f"the detector's data module must be a DetectionDataModule, got {type(data).__name__}")
        self.model = model.eval().requires_grad_(False)
        self.data = data
        if hasattr(data.encoder, "show_progress"):  # no progress bar per request in the server's log
            data.encoder.show_progress = False
        self.checkpoint = checkpoint
        self.kg = kg

    def with_graph(self, record: KGQARecord, cut: bool) -> tuple[KGQARecord, dict[str, Any] | None]:
        """``record``, and with ``cut`` its subgraph cut from :attr:`kg` (and what the response says of the cut)."""
        if not cut:
            return record, None
        if self.kg is None:
            raise RuntimeError(f"record {record.id!r} came without a graph, and this scorer has no KG to cut one from")
        return self.kg.cut(record)

    def warm_up(self) -> None:
        """What the first request would otherwise wait for: the text encoder, and the relation prior's fit on the
        train split when the detector uses it."""
        self.data.encoder.encode(["warm-up"])
        if self.kg is not None:
            self.kg.retriever.encoder.encode(["warm-up"])
        if "relation_prior" in self.data.answer_features:
            self.data.relation_prior()

    @torch.inference_mode()
    def score(self, records: Sequence[KGQARecord]) -> list[dict[str, Any] | None]:
        """Per record, the row ``predict_step`` gives for it (``None`` when no answer is left to classify: every
        one an abstention, or ungrounded ones dropped by the data module's ``ungrounded="drop"``)."""
        table = RequestEmbeddings(self.data.embeddings)
        graphs = self.data.request_graphs(records, table)
        built = [g for g in graphs if g is not None]
        rows: list[dict[str, Any]] = []
        if built:
            batch = collate_graphs(built, table.rows).to(self.model.device)
            rows = self.model.predict_step(batch, 0)
        found = iter(rows)
        return [next(found) if g is not None else None for g in graphs]


def verdicts(
    request_id: str | None, answers: Sequence[str], row: dict[str, Any] | None, threshold: float,
    ungrounded_threshold: float, checkpoint: str, selection: ServedSelection | None = None,
    kept: tuple[Sequence[bool], dict[str, Any]] | None = None, retrieved: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A response (:class:`~kglightning.serve.schema.GuardResponse` as a dict) from the ``predict`` row of a request
    (``None``: nothing to classify). An answer is kept when ``selection`` keeps it, or, without one, when it is not
    flagged; ``kept``: instead, whether each of the row's answers is kept and the selection that decided it (a batch
    rule's, :meth:`ServedSelection.select_batch`). An entry of ``answers`` without a verdict is listed in
    ``not_scored`` with its reason; ``retrieved``: what :meth:`ServedKG.cut` said of the subgraph it cut."""
    out, covered = [], set()
    described = kept[1] if kept is not None else selection.describe() if selection is not None else None
    if row is not None:
        flagged = set(row["flagged"])
        kinds = answer_kinds(row)
        entries = row.get("prediction_entries") or [[] for _ in row["prediction"]]
        for j, (name, p, logit, kind, mine) in enumerate(zip(row["prediction"], row["hallucination_prob"],
                                                             row["hallucination_logit"], kinds, entries)):  # fmt: skip
            covered.update(mine)
            keep = (
                kept[0][j] if kept is not None else selection.keeps(logit, kind) if selection else name not in flagged
            )
            out.append({"answer": name, "hallucination_prob": p, "hallucination_logit": logit,
                        "flagged": name in flagged, "grounding": kind, "in_graph": kind != "ungrounded",
                        "entries": list(mine), "kept": bool(keep)})  # fmt: skip
    missing = [
        {"entry": k, "answer": a, "reason": "abstention" if is_abstention(a) else "ungrounded_dropped"}
        for k, a in enumerate(answers)
        if k not in covered
    ]
    return {
        "id": request_id,
        "answers": out,
        "not_scored": missing,
        "abstained": not any(v["kept"] for v in out),
        "threshold": float(row["threshold"]) if row is not None else threshold,
        "ungrounded_threshold": float(row["ungrounded_threshold"]) if row is not None else ungrounded_threshold,
        "checkpoint": checkpoint,
        "selection": described,
        "retrieved": retrieved,
    }
