"""Typed-edge attention layers: per-type edge features give the layer's per-edge result, values and gradients."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import GATConv, TransformerConv

from kglightning.nn.conv import TypedGATConv, TypedTransformerConv


def _graph(seed: int = 0, n: int = 30, e: int = 120, types: int = 5):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei[:, :3] = torch.tensor([[4, 4, 7], [4, 9, 9]])  # a self-loop and a repeated target
    return (
        torch.randn(n, 12, generator=g),
        ei,
        torch.randn(types, 6, generator=g),
        torch.randint(0, types, (e,), generator=g),
    )


@pytest.mark.parametrize(
    "typed, plain",
    [
        (TypedTransformerConv, TransformerConv),
        (TypedGATConv, GATConv),
    ],
)
def test_same_output_and_gradients_as_the_pyg_layer(typed, plain):
    x, ei, table, edge_type = _graph()
    torch.manual_seed(0)
    ours = typed(12, 4, heads=3, edge_dim=6)
    torch.manual_seed(0)
    ref = plain(12, 4, heads=3, edge_dim=6)
    ref.load_state_dict(ours.state_dict())
    ours.eval(), ref.eval()
    t1, t2 = table.clone().requires_grad_(), table.clone().requires_grad_()
    out = ours(x, ei, t1, edge_type)
    expected = ref(x, ei, t2[edge_type])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    (out**2).sum().backward()
    (expected**2).sum().backward()
    torch.testing.assert_close(t1.grad, t2.grad, atol=1e-4, rtol=1e-4)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize("typed", [TypedTransformerConv, TypedGATConv])
def test_without_edge_type_it_is_the_plain_layer_and_bipartite_inputs_work(typed):
    x, ei, table, edge_type = _graph(1)
    conv = typed(12, 4, heads=2, edge_dim=6).eval()
    torch.testing.assert_close(conv(x, ei, table[edge_type]), conv(x, ei, table, edge_type), atol=1e-5, rtol=1e-5)
    keep = ei[1] < 10  # edges into nodes 0..9, given as a (source, target) pair of feature tables
    out = conv((x, x[:10]), ei[:, keep], table, edge_type[keep])
    torch.testing.assert_close(out, conv(x, ei, table, edge_type)[:10], atol=1e-5, rtol=1e-5)


def test_edge_type_needs_edge_features():
    x, ei, _, edge_type = _graph()
    with pytest.raises(ValueError, match="edge_type needs edge_attr"):
        TypedTransformerConv(12, 4, edge_dim=6)(x, ei, None, edge_type)
