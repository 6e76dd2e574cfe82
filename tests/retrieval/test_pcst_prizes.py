import numpy as np
import pandas as pd
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.llm.utils.backend_utils import retrieval_via_pcst

from kglightning.retrieval.pcst_prizes import pcst_cut


def _graph(seed: int, n: int, e: int, relations: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.nn.functional.normalize(torch.randn(n, 8, generator=g), dim=-1)
    rel = torch.nn.functional.normalize(torch.randn(relations, 8, generator=g), dim=-1)
    rel_of = torch.randint(relations, (e,), generator=g)  # few relations: many tied edge scores, as in a real graph
    edge_index = torch.randint(n, (2, e), generator=g)
    q = torch.nn.functional.normalize(torch.randn(1, 8, generator=g), dim=-1)
    return x, rel[rel_of], edge_index, q


def _pyg(x, edge_attr, edge_index, q, **kw):
    n, e = x.shape[0], edge_index.shape[1]
    data = Data(x=x, edge_index=edge_index, edge_attr=edge_attr, num_nodes=n)
    data.node_idx, data.edge_idx = np.arange(n), np.arange(e)
    nodes = pd.DataFrame({"node_id": range(n), "node_attr": [str(i) for i in range(n)]})
    edges = pd.DataFrame({"src": edge_index[0].tolist(), "edge_attr": ["r"] * e, "dst": edge_index[1].tolist()})
    out, _ = retrieval_via_pcst(data, q, nodes, edges, **kw)
    return np.asarray(out.edge_idx, dtype=np.int64).reshape(-1), np.asarray(out.node_idx, dtype=np.int64).reshape(-1)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(
    "kw",
    [
        {"topk": 3, "topk_e": 5, "cost_e": 0.5},
        {"topk": 10, "topk_e": 3, "cost_e": 0.05},
        {"topk": 0, "topk_e": 5, "cost_e": 0.5},
        {"topk": 3, "topk_e": 0, "cost_e": 0.5},
        {"topk": 5, "topk_e": 8, "cost_e": 2.0, "num_clusters": 2},
    ],
)
def test_same_selection_as_pyg(seed, kw):
    x, edge_attr, edge_index, q = _graph(seed, n=20 + 7 * seed, e=30 + 23 * seed, relations=2 + seed % 5)
    want_e, want_n = _pyg(x, edge_attr.clone(), edge_index, q, **kw)
    got_e, got_n = pcst_cut(edge_index.numpy(), x, edge_attr.clone(), q, **kw)
    assert got_e.tolist() == want_e.tolist()
    assert got_n.tolist() == want_n.tolist()


def test_empty_graph_selects_everything():
    e, n = pcst_cut(np.zeros((2, 0), dtype=np.int64), torch.randn(3, 4), torch.zeros(0, 4), torch.randn(1, 4))
    assert e.tolist() == [] and n.tolist() == [0, 1, 2]
