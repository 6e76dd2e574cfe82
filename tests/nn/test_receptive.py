"""Receptive-field blocks: encoders computing a few nodes' states on their receptive field only."""

from __future__ import annotations

import pytest
import torch

from kglightning.nn import GATEncoder, GraphTransformerEncoder
from kglightning.nn.receptive import receptive_blocks


def _random_graph(seed: int, n: int = 50, e: int = 150):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    return ei, g


def test_blocks_hold_exactly_the_nodes_each_layer_reads():
    ei, g = _random_graph(0)
    targets = torch.tensor([3, 17, 41])
    blocks = receptive_blocks(ei, targets, num_layers=3, num_nodes=50)
    assert blocks[-1].nodes[: blocks[-1].num_out].tolist() == targets.tolist()
    for block, nxt in zip(blocks, blocks[1:]):
        assert block.nodes[: block.num_out].tolist() == nxt.nodes.tolist()  # outputs feed the next layer
    for block in blocks:
        out = set(block.nodes[: block.num_out].tolist())
        # every edge into an output node is kept, no other
        assert block.edge_mask.tolist() == [t in out for t in ei[1].tolist()]
        srcs = set(ei[0, block.edge_mask].tolist())
        assert set(block.nodes.tolist()) == out | srcs
        assert len(set(block.nodes.tolist())) == block.nodes.numel()
        # renumbered edges point at the same global nodes
        assert block.nodes[block.edge_index[0]].tolist() == ei[0, block.edge_mask].tolist()
        assert block.nodes[block.edge_index[1]].tolist() == ei[1, block.edge_mask].tolist()


def test_duplicate_targets_are_refused():
    ei, _ = _random_graph(1)
    with pytest.raises(ValueError, match="distinct"):
        receptive_blocks(ei, torch.tensor([1, 1]), 2, 50)


@pytest.mark.parametrize("encoder", [GraphTransformerEncoder, GATEncoder])
@pytest.mark.parametrize("typed", [True, False])
def test_node_states_equal_the_whole_graph_run(encoder, typed):
    ei, g = _random_graph(2, n=60, e=200)
    ei[:, :3] = torch.tensor([[5, 5, 8], [5, 9, 9]])  # a self-loop and repeated targets
    x = torch.randn(60, 12, generator=g)
    table, edge_type = torch.randn(6, 5, generator=g), torch.randint(0, 6, (200,), generator=g)
    torch.manual_seed(0)
    enc = encoder(12, 5, hidden_channels=16, num_layers=3, heads=4).eval()
    full = enc(x, ei, table[edge_type])
    targets = torch.tensor([9, 5, 33, 9, 0])  # repeats are allowed here
    attr, types = (table, edge_type) if typed else (table[edge_type], None)
    torch.testing.assert_close(
        enc.node_states(x, ei, attr, types, targets=targets), full[targets], atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(enc.node_states(x, ei, attr, types), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("encoder", [GraphTransformerEncoder, GATEncoder])
def test_node_rows_build_only_the_first_layers_nodes_and_give_the_same_states_and_gradients(encoder):
    from kglightning.nn import NodeRows

    ei, g = _random_graph(3, n=60, e=120)
    x_text = torch.randn(60, 10, generator=g)
    mark = torch.nn.Embedding(2, 2)
    flag = torch.randint(0, 2, (60,), generator=g)
    targets = torch.tensor([4, 30, 4])
    torch.manual_seed(0)
    enc = encoder(12, 5, hidden_channels=16, num_layers=2, heads=4).eval()
    attr = torch.randn(120, 5, generator=g)

    full_x = torch.cat([x_text, mark(flag)], dim=-1)
    want = enc.node_states(full_x, ei, attr, targets=targets)
    want.sum().backward()
    want_grad = mark.weight.grad.clone()
    mark.weight.grad = None

    asked = []

    def rows(ids):
        asked.append(ids)
        return torch.cat([x_text.index_select(0, ids), mark(flag.index_select(0, ids))], dim=-1)

    got = enc.node_states(NodeRows(60, rows), ei, attr, targets=targets)
    got.sum().backward()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(mark.weight.grad, want_grad, atol=1e-6, rtol=1e-6)
    first = receptive_blocks(ei, targets.unique(), 2, 60)[0].nodes
    assert len(asked) == 1 and asked[0].tolist() == first.tolist() and first.numel() < 60  # only the rows read
    # without targets, the rows of every node
    torch.testing.assert_close(enc.node_states(NodeRows(60, rows), ei, attr), enc(full_x, ei, attr))


def test_node_rows_of_every_node_are_asked_on_their_device():
    from kglightning.nn import NodeRows

    asked = []
    NodeRows(3, lambda ids: asked.append(ids) or torch.zeros(3, 1, device=ids.device), device="meta").all()
    assert asked[0].device.type == "meta" and asked[0].shape == (3,)


def test_an_encoder_with_its_own_node_states_is_given_a_tensor_by_kgguard():
    """docs/architecture.md shows overriding node_states: such an encoder gets the features as a tensor."""
    from kglightning.nn import KGGuard, NodeRows

    seen = []

    class Own(GraphTransformerEncoder):
        def node_states(self, x, edge_index, edge_attr, edge_type=None, targets=None):
            seen.append(type(x))
            return super().node_states(x, edge_index, edge_attr, edge_type, targets)

    g = torch.Generator().manual_seed(5)
    torch.manual_seed(0)
    net = KGGuard(8, lambda i, e: Own(i, e, hidden_channels=8, num_layers=2, heads=2), mark_dim=2).eval()
    ei = torch.tensor([[0, 1, 3], [1, 2, 0]])
    kind = torch.tensor([0, 0, 2])
    args = (torch.randn(4, 8, generator=g), torch.tensor([True, False, False, False]),
            torch.tensor([False, True, True, False]), ei, torch.randn(3, 8, generator=g), kind,
            torch.tensor([1, 2]), torch.randn(2, 8, generator=g))  # fmt: skip
    own = net(*args)
    assert seen == [torch.Tensor]
    plain = KGGuard(8, lambda i, e: GraphTransformerEncoder(i, e, hidden_channels=8, num_layers=2, heads=2), mark_dim=2)
    plain.load_state_dict(net.state_dict())
    torch.testing.assert_close(plain.eval()(*args), own)  # the NodeRows path gives the same logits
    assert NodeRows  # exported
