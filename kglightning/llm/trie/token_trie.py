"""A prefix tree over token-id sequences (the data structure of GCR's KG-Trie, written from scratch).

Each node maps a next token id to a child node; a node is *terminal* when a stored sequence ends there. The
allowed continuations of a prefix are the keys of its node, and each node caches them as a ``torch.long`` tensor
per device, so a logits processor can mask the vocabulary with one indexing op per row and step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch

__all__ = ["TokenTrie", "TrieNode"]


class TrieNode:
    """One node of a :class:`TokenTrie`.

    Attributes:
        children: next token id -> child node.
        terminal: whether a stored sequence ends at this node.
    """

    __slots__ = ("children", "terminal", "_ids")

    def __init__(self) -> None:
        self.children: dict[int, TrieNode] = {}
        self.terminal = False
        self._ids: dict[torch.device, torch.Tensor] = {}

    def allowed(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The child token ids as a ``(num_children,)`` long tensor on ``device`` (cached; sorted)."""
        device = torch.device(device)
        ids = self._ids.get(device)
        if ids is None:
            ids = torch.tensor(sorted(self.children), dtype=torch.long, device=device)
            self._ids[device] = ids
        return ids

    def __repr__(self) -> str:
        return f"TrieNode(children={len(self.children)}, terminal={self.terminal})"


class TokenTrie:
    """A prefix tree of token-id sequences.

    Args:
        sequences: sequences to insert (each a sequence of ``int`` token ids; empty ones are ignored).

    Example:
        >>> trie = TokenTrie([(5, 1, 2), (5, 1, 3), (7,)])
        >>> len(trie), trie.num_nodes
        (3, 6)
        >>> sorted(trie.root.children), sorted(trie.node((5, 1)).children)
        ([5, 7], [2, 3])
        >>> trie.node((5, 9)) is None, (5, 1, 3) in trie, (5, 1) in trie
        (True, True, False)
        >>> trie.node((5, 1)).allowed()
        tensor([2, 3])
        >>> sorted(trie)
        [(5, 1, 2), (5, 1, 3), (7,)]
    """

    def __init__(self, sequences: Iterable[Sequence[int]] = ()) -> None:
        self.root = TrieNode()
        self._size = 0
        self._nodes = 1
        for seq in sequences:
            self.insert(seq)

    def insert(self, sequence: Sequence[int]) -> bool:
        """Insert one sequence; returns whether it was new (an empty sequence is ignored and returns ``False``)."""
        if not len(sequence):
            return False
        node = self.root
        for tok in sequence:
            child = node.children.get(tok)
            if child is None:
                child = node.children[tok] = TrieNode()
                node._ids.clear()
                self._nodes += 1
            node = child
        if node.terminal:
            return False
        node.terminal = True
        self._size += 1
        return True

    def node(self, prefix: Sequence[int]) -> TrieNode | None:
        """The node reached by ``prefix`` (the root for an empty one), or ``None`` when it leaves the trie."""
        node: TrieNode | None = self.root
        for tok in prefix:
            node = node.children.get(tok)
            if node is None:
                return None
        return node

    def __contains__(self, sequence: object) -> bool:
        if not isinstance(sequence, Sequence) or not len(sequence):
            return False
        node = self.node(sequence)  # type: ignore[arg-type]
        return node is not None and node.terminal

    def __len__(self) -> int:
        """The number of distinct stored sequences."""
        return self._size

    @property
    def num_nodes(self) -> int:
        """The number of nodes, root included."""
        return self._nodes

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        """Every stored sequence (depth first, children in insertion order)."""
        stack: list[tuple[TrieNode, tuple[int, ...]]] = [(self.root, ())]
        while stack:
            node, prefix = stack.pop()
            if node.terminal:
                yield prefix
            stack.extend((child, prefix + (tok,)) for tok, child in reversed(node.children.items()))

    def __repr__(self) -> str:
        return f"TokenTrie(sequences={self._size}, nodes={self._nodes})"
