"""Small shared pieces of the KG index: the hop type and CSR slicing (used by the index, its path search, the
evidence search and the KG-Trie)."""

from __future__ import annotations

import numpy as np

#: one walked hop ``(head, relation, tail)``; a reverse hop has ``~relation`` and runs from the triple's tail
Hop = tuple[str, str, str]


def csr_positions(indptr: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Edge positions of all ``nodes`` in a CSR structure, node by node (vectorized slice concatenation).

    Example:
        >>> csr_positions(np.array([0, 2, 2, 5]), np.array([2, 0])).tolist()  # node 2's edges, then node 0's
        [2, 3, 4, 0, 1]
    """
    starts = indptr[nodes]
    counts = indptr[nodes + 1] - starts
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts)
    return offsets + np.arange(total, dtype=np.int64)
