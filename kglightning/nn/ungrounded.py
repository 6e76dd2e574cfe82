"""A scorer for answers that name no node of their question's graph (free-text LLM answers).

Such an answer has no place in the graph for a graph encoder to read, but it is not without evidence: its text, the
question, and the graph node nearest to it in text-embedding space (a near miss of a real entity, or nothing like
any entity) say much about whether it is hallucinated. With few training answers the text embeddings are more
inputs than they can fit; ``UngroundedAnswerScorer(text=False)`` then reads only the similarity to that nearest
node, the answer's place in the list and the answer features.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["UngroundedAnswerScorer", "nearest_nodes"]


def nearest_nodes(
    answer_emb: Tensor, node_emb: Tensor, node_graph: Tensor, answer_graph: Tensor, candidates: Tensor
) -> tuple[Tensor, Tensor]:
    """For each answer, the most similar candidate node of its own graph (cosine similarity of text embeddings).

    Args:
        answer_emb: ``(U, d)`` answer text embeddings.
        node_emb: ``(N, d)`` node text embeddings of the whole batch.
        node_graph: ``(N,)`` graph of each node.
        answer_graph: ``(U,)`` graph of each answer.
        candidates: ``(N,)`` bool, nodes that may be nearest (the entities, not the virtual question nodes).

    Returns:
        ``(U,)`` index of the nearest node (``-1`` when the graph has no candidate) and ``(U,)`` its similarity
        (``0`` without a candidate).

    Example:
        >>> nodes = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> idx, sim = nearest_nodes(torch.tensor([[0.1, 1.0], [1.0, 0.0]]), nodes, torch.tensor([0, 0, 1]),
        ...                          torch.tensor([0, 1]), torch.tensor([True, True, False]))
        >>> idx.tolist(), [round(s, 3) for s in sim.tolist()]
        ([1, -1], [0.995, 0.0])
    """
    sims = F.normalize(answer_emb, dim=-1) @ F.normalize(node_emb, dim=-1).T  # (U, N)
    allowed = (node_graph[None, :] == answer_graph[:, None]) & candidates[None, :]
    sims = sims.masked_fill(~allowed, float("-inf"))
    if sims.shape[1] == 0:
        return torch.full((len(answer_emb),), -1, dtype=torch.long, device=answer_emb.device), sims.new_zeros(len(sims))
    best, idx = sims.max(dim=1)
    none = ~allowed.any(dim=1)
    return idx.masked_fill(none, -1), best.masked_fill(none, 0.0)


class UngroundedAnswerScorer(nn.Module):
    """An MLP over ``[answer ‖ question ‖ nearest node ‖ answer ⊙ question ‖ similarity ‖ rank ‖ features]`` -> one
    logit.

    Args:
        text_dim: text-embedding size (the detector passes its own).
        hidden: hidden width.
        dropout: dropout after the hidden layer.
        answer_features: extra inputs per answer (the detector passes the number its data module gives, e.g. the
            LLM's votes for the answer; see :mod:`~kglightning.evidence.answer_signals`).
        text: read the three text embeddings (answer, question, nearest node) and the answer-question product.
            ``False`` keeps only the similarity, the rank and the answer features: a few scalars that a few hundred
            training answers can fit without learning their wording by heart.

    Shapes: ``answer``, ``question`` and ``nearest`` ``(U, text_dim)`` (``nearest`` zero when the graph has no
    entity), ``similarity`` and ``rank`` ``(U,)``, ``features`` ``(U, answer_features)``; returns ``(U,)`` logits
    (hallucinated = 1).

    Example:
        >>> scorer = UngroundedAnswerScorer(4, hidden=8, answer_features=2)
        >>> e = torch.randn(3, 4)
        >>> scorer(e, e, e, torch.zeros(3), torch.zeros(3), torch.zeros(3, 2)).shape
        torch.Size([3])
    """

    def __init__(
        self, text_dim: int, hidden: int = 128, dropout: float = 0.1, answer_features: int = 0, text: bool = True
    ) -> None:
        super().__init__()
        if answer_features < 0:
            raise ValueError(f"answer_features must be >= 0, got {answer_features}")
        self.answer_features = answer_features
        self.text = text
        inputs = (4 * text_dim if text else 0) + 2 + answer_features
        self.mlp = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(
        self,
        answer: Tensor,
        question: Tensor,
        nearest: Tensor,
        similarity: Tensor,
        rank: Tensor,
        features: Tensor | None = None,
    ) -> Tensor:
        parts = [answer, question, nearest, answer * question] if self.text else []
        parts += [similarity[:, None].to(answer.dtype), rank[:, None].to(answer.dtype)]
        if self.answer_features:
            if features is None or features.shape != (len(answer), self.answer_features):
                got = None if features is None else tuple(features.shape)
                raise ValueError(
                    f"this scorer reads {self.answer_features} features per answer, got {got} for {len(answer)} answers"
                )
            parts.append(features.to(answer.dtype))
        return self.mlp(torch.cat(parts, dim=-1)).squeeze(-1)
