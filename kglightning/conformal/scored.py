"""Answers with a hallucination score each, as the selection rules take them (:class:`ScoredAnswers`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

ALL = "all"  # the one group of a selection without groups


@dataclass
class ScoredAnswers:
    """Answers with a hallucination score each, the question they answer, an optional group and label.

    Args:
        scores: ``(N,)`` hallucination scores, higher = more likely hallucinated; finite.
        question: ``(N,)`` integer ids of the answers' questions (the exchangeable unit of every rule but ``"fdr"``);
            floats that are not whole numbers are refused (``1.2`` and ``1.7`` would become one question), and so
            are ids outside int64 (a cast would wrap ``1e19`` and ``2e19`` to one id).
        group: ``N`` group names, or ``None`` for one group.
        hallucinated: ``(N,)`` booleans, or 0 and 1 (``True`` = hallucinated); required for calibration answers.
            Anything else (``0.3``, NaN) is refused, not cast.
        keys: ``N`` stable names of the answers (e.g. ``"<question id>#<position>"``): the FDR rules then draw each
            answer's tie-breaks from its name and the seed, so the selection does not depend on the answers' order
            (as after a DDP gather). ``None``: draws in order from the seed.
    """

    scores: Tensor
    question: Tensor
    group: list[str] | None = None
    hallucinated: Tensor | None = None
    keys: list[str] | None = None

    def __post_init__(self) -> None:
        self.scores = torch.as_tensor(self.scores, dtype=torch.float64, device="cpu").flatten()
        self.question = _ids(self.question)
        n = self.scores.numel()
        if not bool(torch.isfinite(self.scores).all()):
            raise ValueError("scores must be finite (no NaN or inf)")
        if self.question.numel() != n:
            raise ValueError(f"question has {self.question.numel()} entries for {n} scores")
        if self.group is not None and len(self.group) != n:
            raise ValueError(f"group has {len(self.group)} entries for {n} scores")
        if self.group is not None and ALL in self.group:
            raise ValueError(f"the group name {ALL!r} is reserved for every answer together; rename that group")
        if self.keys is not None and len(self.keys) != n:
            raise ValueError(f"keys has {len(self.keys)} entries for {n} scores")
        if self.hallucinated is not None:
            self.hallucinated = _booleans(self.hallucinated)
            if self.hallucinated.numel() != n:
                raise ValueError(f"hallucinated has {self.hallucinated.numel()} entries for {n} scores")

    def __len__(self) -> int:
        return self.scores.numel()

    def groups(self) -> list[str]:
        return [ALL] * len(self) if self.group is None else [str(g) for g in self.group]

    def draws(self, seed: int, mask: Tensor, salt: str = "") -> Tensor | None:
        """Tie-break draws in ``[0, 1)`` for the answers in ``mask``, from their keys and ``seed`` (``None`` without
        keys): the first 53 bits of ``blake2b(seed, salt, key)``; another ``salt`` gives independent draws.
        :meth:`AnswerSelector.select` passes a ``seed`` derived from its own and from :meth:`fingerprint`."""
        if self.keys is None:
            return None
        picked = [
            f"{seed}\x00{salt}\x00{k}" if salt else f"{seed}\x00{k}" for k, m in zip(self.keys, mask.tolist()) if m
        ]
        return torch.tensor(
            [int.from_bytes(hashlib.blake2b(_utf8(k), digest_size=8).digest(), "big") >> 11 for k in picked],
            dtype=torch.float64, device="cpu",
        ) / float(2**53)  # fmt: skip

    def fingerprint(self, labels: bool = True) -> bytes:
        """A digest of the answers' content: scores, keys (or question ids), groups and, with ``labels``, the
        labels, taken in key order when there are keys (so it does not depend on the answers' order)."""
        n = len(self)
        order = sorted(range(n), key=self.keys.__getitem__) if self.keys is not None else list(range(n))
        idx = torch.tensor(order, dtype=torch.long, device="cpu")
        h = hashlib.blake2b(digest_size=16)
        h.update(n.to_bytes(8, "big"))
        h.update(self.scores[idx].numpy().tobytes())
        if self.keys is not None:
            h.update(b"".join(len(k).to_bytes(8, "big") + _utf8(k) for k in (self.keys[i] for i in order)))
        else:
            h.update(self.question.numpy().tobytes())
        if self.group is not None:
            names = self.groups()
            h.update(b"".join(len(g).to_bytes(8, "big") + _utf8(g) for g in (names[i] for i in order)))
        if labels and self.hallucinated is not None:
            h.update(self.hallucinated[idx].numpy().tobytes())
        return h.digest()

    def mask(self, group: str) -> Tensor:
        return torch.tensor([g == group for g in self.groups()], dtype=torch.bool, device="cpu")


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # an id read from JSON may hold a lone surrogate


_INT64 = 2.0**63  # int64 holds [-2**63, 2**63): a float outside would wrap in a cast, and merge questions


def _ids(x: Tensor | Sequence) -> Tensor:
    try:  # a list of Python floats in float64 (torch's default float32 would merge ids above 2**24)
        floats = isinstance(x, (list, tuple)) and any(isinstance(v, float) for v in x)
        q = torch.as_tensor(x, dtype=torch.float64 if floats else None, device="cpu").flatten()
    except (OverflowError, RuntimeError, ValueError) as e:  # a Python integer beyond 64 bits
        raise ValueError(f"question must hold integer ids that fit in 64 bits ({e})") from None
    if q.dtype == torch.bool:
        raise ValueError("question must hold integer ids, got booleans")
    if q.is_floating_point():
        q = q.double()  # a float32 id is compared in float64, where 2**63 and its neighbours are exact
        whole = torch.isfinite(q) & (q == torch.round(q))
        if not bool(whole.all()):
            bad = float(q[~whole][0])
            raise ValueError(f"question must hold integer ids, got {bad!r} (a cast would merge distinct questions)")
        inside = (q >= -_INT64) & (q < _INT64)
        if not bool(inside.all()):
            bad = float(q[~inside][0])
            raise ValueError(
                f"question must hold integer ids in [-2**63, 2**63), got {bad!r} (a cast to int64 would wrap it and "
                "merge distinct questions)"
            )
    elif q.dtype == torch.uint64 and bool((q.view(torch.int64) < 0).any()):  # at or above 2**63
        raise ValueError("question must hold integer ids below 2**63 (a cast to int64 would wrap them)")
    return q.long()


def _booleans(x: Tensor | Sequence) -> Tensor:
    y = torch.as_tensor(x, device="cpu").flatten()
    if y.dtype != torch.bool:
        ok = (y == 0) | (y == 1)  # NaN is neither
        if not bool(ok.all()):
            raise ValueError(f"hallucinated must hold booleans or 0/1 (True = hallucinated), got {y[~ok][0].item()!r}")
        y = y.bool()
    return y
