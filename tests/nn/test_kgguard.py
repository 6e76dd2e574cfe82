from functools import partial

import pytest
import torch

from kglightning.nn import EDGE_FORWARD, EDGE_VIRTUAL, GATEncoder, GraphTransformerEncoder, KGGuard


def _graph():
    x = torch.randn(4, 8)
    edge_index = torch.tensor([[3, 0, 0], [0, 1, 2]])
    kinds = torch.tensor([EDGE_VIRTUAL, EDGE_FORWARD, EDGE_FORWARD])
    return (
        x,
        torch.tensor([True, False, False, False]),
        torch.tensor([False, True, True, False]),
        edge_index,
        torch.randn(3, 8),
        kinds,
        torch.tensor([1, 2]),
        torch.randn(2, 8),
    )


@pytest.mark.parametrize("encoder", [GraphTransformerEncoder, GATEncoder])
def test_one_logit_per_answer_and_gradients_reach_every_part(encoder):
    torch.manual_seed(0)
    net = KGGuard(8, partial(encoder, hidden_channels=16, heads=4), mark_dim=4, mlp_hidden=8)
    out = net(*_graph())
    assert out.shape == (2,)
    out.sum().backward()
    for name in ("topic_mark.weight", "answer_mark.weight", "edge_kind.weight"):
        assert net.get_parameter(name).grad.abs().sum() > 0, name


def test_marks_change_the_output():
    torch.manual_seed(0)
    net = KGGuard(8, partial(GraphTransformerEncoder, hidden_channels=16, heads=4), mark_dim=4).eval()
    args = list(_graph())
    base = net(*args)
    args[2] = torch.tensor([False, True, False, False])  # node 2 no longer marked as an answer
    assert not torch.allclose(base, net(*args))


def test_virtual_edges_ignore_edge_text():
    torch.manual_seed(0)
    net = KGGuard(8, partial(GraphTransformerEncoder, hidden_channels=16, heads=4), mark_dim=4).eval()
    args = list(_graph())
    base = net(*args)
    args[4] = args[4].clone()
    args[4][0] = 100.0  # the virtual edge's text row is ignored
    assert torch.allclose(base, net(*args))


def test_bad_head_count():
    with pytest.raises(ValueError, match="divisible"):
        GraphTransformerEncoder(8, 8, hidden_channels=10, heads=4)


def test_reset_parameters_reinitialises():
    torch.manual_seed(0)
    enc = GATEncoder(8, 4, hidden_channels=16, heads=4)
    before = [p.clone() for p in enc.parameters()]
    enc.reset_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, enc.parameters()))


def _per_type(args):
    """The same graph with edge features given per edge type (each edge its own type, reversed order)."""
    x, topic, answer, edge_index, edge_text, kinds, answer_index, question = args
    order = torch.tensor([2, 1, 0])
    return [x, topic, answer, edge_index, edge_text[order], kinds[order], answer_index, question], order


@pytest.mark.parametrize("per_type", [False, True])
def test_without_question_node_the_virtual_edges_do_not_count(per_type):
    torch.manual_seed(0)
    net = KGGuard(8, partial(GraphTransformerEncoder, hidden_channels=16, heads=4), mark_dim=4,
                  question_node=False).eval()  # fmt: skip
    args = list(_graph())
    kw = {}
    if per_type:
        args, order = _per_type(args)
        kw["edge_type"] = torch.tensor([2, 1, 0])
    base = net(*args, **kw)
    args[0] = args[0].clone()
    args[0][3] += 5.0  # the virtual question node's features: cut off from the answers
    assert torch.allclose(base, net(*args, **kw))
    full = KGGuard(8, partial(GraphTransformerEncoder, hidden_channels=16, heads=4), mark_dim=4).eval()
    full.load_state_dict(net.state_dict())
    assert not torch.allclose(full(*args, **kw), net(*args, **kw))  # with the question node it does count


def test_without_marks_the_answer_mask_is_ignored():
    torch.manual_seed(0)
    net = KGGuard(8, partial(GATEncoder, hidden_channels=16, heads=4), mark_dim=4, marks=False).eval()
    assert net.topic_mark is None and net.encoder.in_channels == 8
    args = list(_graph())
    base = net(*args)
    args[1] = torch.tensor([False, False, False, True])
    args[2] = torch.tensor([False, False, True, False])
    assert torch.allclose(base, net(*args))


def test_without_edge_text_relations_look_alike():
    torch.manual_seed(0)
    net = KGGuard(8, partial(GraphTransformerEncoder, hidden_channels=16, heads=4), mark_dim=4,
                  edge_text=False).eval()  # fmt: skip
    args = list(_graph())
    base = net(*args)
    args[4] = torch.randn(3, 8)  # other relation texts
    assert torch.allclose(base, net(*args))


def test_inputs_graph_and_question():
    torch.manual_seed(0)
    enc = partial(GraphTransformerEncoder, hidden_channels=16, heads=4)
    graph = KGGuard(8, enc, mark_dim=4, inputs="graph").eval()
    args = list(_graph())
    base = graph(*args)
    args[7] = torch.randn(2, 8)  # another question embedding: the MLP does not read it
    assert torch.allclose(base, graph(*args))
    question = KGGuard(8, enc, mark_dim=4, inputs="question").eval()
    assert question.encoder is None
    args = list(_graph())
    base = question(*args)
    args[3] = torch.tensor([[0, 1], [2, 3]])  # another graph: no message passing
    args[4] = torch.randn(3, 8)
    assert torch.allclose(base, question(*args))
    args[0] = args[0].clone()
    args[0][1] += 1.0  # the answer node's own text counts
    assert not torch.allclose(base, question(*args))
    with pytest.raises(ValueError, match="inputs"):
        KGGuard(8, enc, inputs="text")
