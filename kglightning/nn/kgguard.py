"""The KG-Guard hallucination detector network (KG-Guard §3.2, App. A), without any Lightning code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from kglightning.nn.base import GraphEncoder, NodeRows, takes_node_rows

#: ``edge_kind`` values of the augmented graph.
EDGE_FORWARD, EDGE_REVERSE, EDGE_VIRTUAL = 0, 1, 2
NUM_EDGE_KINDS = 3


class KGGuard(nn.Module):
    """Scores every proposed answer node of a question subgraph in one forward pass.

    Node features are ``[text embedding ‖ M_T[is_topic] ‖ M_A[is_answer]]`` with learned mark tables ``M_T`` and
    ``M_A`` of shape ``(2, mark_dim)``. Edge features are relation-text embeddings plus a learned embedding of the
    edge kind (forward triple, explicit reverse edge, or virtual-question edge); the virtual edges, which join the
    virtual question node to the topic entities, have no relation text, so their feature is the learned kind
    embedding alone. An MLP reads ``[h_answer ‖ z_question]`` and returns one logit (hallucinated = 1).

    Args:
        text_dim: size of the text embeddings of nodes, relations and questions.
        encoder: builds the graph encoder from ``(in_channels, edge_dim)``, e.g. a
            :class:`~kglightning.nn.GraphTransformerEncoder` class or a partial of it.
        mark_dim: size of the topic and answer mark embeddings (``d_T = d_A``).
        mlp_hidden: hidden size of the classifier MLP.
        dropout: dropout inside the MLP.
        answer_features: extra inputs per answer node appended to the MLP's input (e.g. how well the relation path
            from a topic entity to the answer fits the question; 0: none, the paper's detector).
        marks: the topic and answer marks in the node features (``False``: Table 4's "w/o marking").
        question_node: keep the virtual question node's edges (``False``: Table 4's "w/o virtual q. node"; the
            edges of kind ``EDGE_VIRTUAL`` are dropped before message passing).
        edge_text: relation-text embeddings in the edge features (``False``: the learned edge-kind embedding alone).
        inputs: what the MLP reads (Table 5): ``"graph+question"`` ``[h_answer ‖ z_q]`` (the paper's detector);
            ``"graph"`` ``h_answer`` alone; ``"question"`` no graph encoder at all, ``[φ(answer text) ‖ z_q]``.

    Shapes:
        - ``x_text (N, text_dim)``; ``topic_mask``, ``answer_mask (N,)`` bool
        - ``edge_index (2, E)``; ``edge_text (E, text_dim)`` (rows of virtual edges are ignored); ``edge_kind (E,)``
        - or, per edge type: ``edge_text (T, text_dim)`` and ``edge_kind (T,)`` describe ``T`` (relation, kind)
          types and ``edge_type (E,)`` gives each edge's type. The result is the same; an encoder that
          :attr:`~kglightning.nn.GraphEncoder.supports_edge_types` then projects ``T`` rows instead of ``E``
          (see :func:`edge_types`).
        - ``answer_index (A,)`` node indices; ``question (A, text_dim)`` the question embedding of each answer
        - output: logits ``(A,)``

    Example:
        >>> from kglightning.nn import GraphTransformerEncoder
        >>> from functools import partial
        >>> net = KGGuard(8, partial(GraphTransformerEncoder, hidden_channels=16, heads=2), mark_dim=4)
        >>> x = torch.randn(3, 8); ei = torch.tensor([[2, 0], [0, 1]])
        >>> logits = net(x, torch.tensor([True, False, False]), torch.tensor([False, True, False]), ei,
        ...              torch.randn(2, 8), torch.tensor([EDGE_VIRTUAL, EDGE_FORWARD]), torch.tensor([1]),
        ...              torch.randn(1, 8))
        >>> logits.shape
        torch.Size([1])
    """

    def __init__(
        self,
        text_dim: int,
        encoder: Callable[[int, int], GraphEncoder],
        mark_dim: int = 20,
        mlp_hidden: int = 256,
        dropout: float = 0.1,
        answer_features: int = 0,
        marks: bool = True,
        question_node: bool = True,
        edge_text: bool = True,
        inputs: Literal["graph+question", "graph", "question"] = "graph+question",
    ) -> None:
        super().__init__()
        if inputs not in ("graph+question", "graph", "question"):
            raise ValueError(f"inputs must be 'graph+question', 'graph' or 'question', got {inputs!r}")
        self.text_dim = text_dim
        self.answer_features = answer_features
        self.marks, self.question_node, self.edge_text, self.inputs = marks, question_node, edge_text, inputs
        graph = inputs != "question"  # without a graph encoder, marks and edge features have no reader
        self.topic_mark = nn.Embedding(2, mark_dim) if marks and graph else None
        self.answer_mark = nn.Embedding(2, mark_dim) if marks and graph else None
        self.edge_kind = nn.Embedding(NUM_EDGE_KINDS, text_dim) if graph else None
        self.encoder = encoder(text_dim + 2 * mark_dim * marks, text_dim) if graph else None
        # the answer node's state (or, without a graph encoder, its text) and the question embedding
        reads = (self.encoder.out_channels if self.encoder is not None else text_dim) + text_dim * (inputs != "graph")
        self.head = nn.Sequential(
            nn.Linear(reads + answer_features, mlp_hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_hidden, 1),
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for table in (self.topic_mark, self.answer_mark, self.edge_kind):
            if table is not None:
                nn.init.normal_(table.weight, std=0.1)
        if self.encoder is not None:
            self.encoder.reset_parameters()
        for layer in self.head:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()

    def forward(
        self,
        x_text: Tensor,
        topic_mask: Tensor,
        answer_mask: Tensor,
        edge_index: Tensor,
        edge_text: Tensor,
        edge_kind: Tensor,
        answer_index: Tensor,
        question: Tensor,
        edge_type: Tensor | None = None,
        answer_features: Tensor | None = None,
    ) -> Tensor:
        if self.answer_features and (answer_features is None or answer_features.shape[-1] != self.answer_features):
            raise ValueError(f"this detector reads {self.answer_features} answer features per answer node; the batch "
                             "has none or another number (set data.init_args.answer_features)")  # fmt: skip
        if self.encoder is None:  # inputs="question": no message passing
            h = x_text.index_select(0, answer_index)
        else:
            h = self._answer_states(x_text, topic_mask, answer_mask, edge_index, edge_text, edge_kind, edge_type,
                                    answer_index)  # fmt: skip
        parts = [h] + ([question] if self.inputs != "graph" else [])
        parts += [answer_features.to(h.dtype)] if self.answer_features else []
        return self.head(torch.cat(parts, dim=-1)).squeeze(-1)

    def _answer_states(self, x_text: Tensor, topic_mask: Tensor, answer_mask: Tensor, edge_index: Tensor,
                       edge_text: Tensor, edge_kind: Tensor, edge_type: Tensor | None, answer_index: Tensor) -> Tensor:  # fmt: skip
        """The graph encoder's states of the answer nodes."""
        assert self.encoder is not None and self.edge_kind is not None
        x: Tensor | NodeRows = x_text
        if self.topic_mark is not None and self.answer_mark is not None:
            topic, answer = self.topic_mark, self.answer_mark

            def marked(ids: Tensor) -> Tensor:  # built for the nodes the encoder reads only (and so is its backward)
                return torch.cat([x_text.index_select(0, ids), topic(topic_mask.index_select(0, ids).long()),
                                  answer(answer_mask.index_select(0, ids).long())], dim=-1)  # fmt: skip

            if takes_node_rows(self.encoder):
                x = NodeRows(x_text.size(0), marked, x_text.device)
            else:  # an encoder with its own node_states reads the whole tensor, built as it always was
                x = torch.cat([x_text, topic(topic_mask.long()), answer(answer_mask.long())], dim=-1)
        if not self.question_node:
            keep = (edge_kind if edge_type is None else edge_kind[edge_type]) != EDGE_VIRTUAL
            edge_index = edge_index[:, keep]
            if edge_type is None:
                edge_text, edge_kind = edge_text[keep], edge_kind[keep]
            else:
                edge_type = edge_type[keep]
        edge_attr = self.edge_kind(edge_kind)
        if self.edge_text:
            edge_attr = edge_attr + edge_text * (edge_kind != EDGE_VIRTUAL).unsqueeze(-1).to(edge_text.dtype)
        return self.encoder.node_states(x, edge_index, edge_attr, edge_type, targets=answer_index)


def edge_types(edge_text: Tensor, edge_kind: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The distinct (relation text id, edge kind) pairs of a batch's edges.

    Args:
        edge_text: ``(E,)`` row ids of each edge's relation text in an embedding table.
        edge_kind: ``(E,)`` edge kinds (``EDGE_FORWARD``, ``EDGE_REVERSE``, ``EDGE_VIRTUAL``).

    Returns:
        ``(type_text (T,), type_kind (T,), edge_type (E,))``: the text id and kind of each of the ``T`` types, and
        the type of each edge, so that ``type_text[edge_type] == edge_text`` and ``type_kind[edge_type] ==
        edge_kind``.

    Example:
        >>> edge_types(torch.tensor([5, 7, 5, 5]), torch.tensor([0, 0, 1, 0]))
        (tensor([5, 5, 7]), tensor([0, 1, 0]), tensor([0, 2, 1, 0]))
    """
    key = edge_text * NUM_EDGE_KINDS + edge_kind
    if key.device.type == "cpu":  # numpy's sort-based unique is several times faster than torch's on the CPU
        found, inverse = np.unique(key.numpy(), return_inverse=True)
        types, edge_type = torch.from_numpy(found), torch.from_numpy(inverse.reshape(-1))
    else:
        types, edge_type = torch.unique(key, return_inverse=True)
    return types // NUM_EDGE_KINDS, types % NUM_EDGE_KINDS, edge_type
