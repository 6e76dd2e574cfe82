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
