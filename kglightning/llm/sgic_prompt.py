"""SGIC's input format (SGIC Table 1): documents with uncertainty scores, the question, previous answers by round.

One user turn in three shapes:

* :meth:`SGICPrompt.plain`: the documents and the question, no scores: the round-0 answer and, with a single
  document, the answer that scores that document (Eq. 3);
* :meth:`SGICPrompt.calibration`: every document followed by ``(Uncertainty Score: s)``, the question, then
  ``Previous Generated Answer:`` with one ``Round k: answer (Uncertainty Score: s)`` line per earlier round, then
  ``Answer:``.

Documents longer than ``max_document_tokens`` are cut to that many tokens (the tokenizer's when one is given,
whitespace words otherwise) and counted in :attr:`SGICPrompt.truncated`.

Example:
    >>> p = SGICPrompt(instruction="Answer briefly.")
    >>> print(p.calibration("Who?", ["Ann wrote it."], [12.3], [("Ann", 40.0)])[0]["content"])
    Answer briefly.
    Document [1]: Ann wrote it. (Uncertainty Score: 12)
    Question: Who?
    Previous Generated Answer:
    Round 1: Ann (Uncertainty Score: 40)
    Answer:
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["SGICPrompt"]

_INSTRUCTION = (
    "Write a short answer to the question, using the documents below. A score after a document or a previous answer "
    "is its uncertainty, from 0 (certain) to 100 (uncertain): prefer certain documents, and keep a previous answer "
    "only if it is certain and supported."
)


class SGICPrompt:
    """Renders SGIC's prompts as chat messages (one user turn, optionally after a system turn).

    Args:
        instruction: the first line of every prompt (the paper's begins ``Write a short answer``).
        system_prompt: a system turn before the user turn, or ``None`` for none.
        max_document_tokens: documents are cut to this many tokens (the paper: 200); ``None`` keeps them whole.
        tokenizer: counts and cuts tokens (a Hugging Face tokenizer); ``None`` counts whitespace words.
    """

    def __init__(
        self,
        instruction: str = _INSTRUCTION,
        system_prompt: str | None = None,
        max_document_tokens: int | None = 200,
        tokenizer: Any = None,
    ) -> None:
        if max_document_tokens is not None and max_document_tokens < 1:
            raise ValueError(f"max_document_tokens must be >= 1 or None, got {max_document_tokens}")
        self.instruction = instruction
        self.system_prompt = system_prompt
        self.max_document_tokens = max_document_tokens
        self.tokenizer = tokenizer
        self.truncated = 0
        self._cut: dict[str, str] = {}

    @property
    def cache_key(self) -> str:
        """What the rendered prompts depend on: the texts, the cut, and the tokenizer that counts tokens."""
        tok = self.tokenizer
        counter = None if tok is None else [getattr(tok, "name_or_path", type(tok).__name__), len(tok)]
        parts = [self.instruction, self.system_prompt, self.max_document_tokens, counter]
        return hashlib.sha1(json.dumps(parts, default=str).encode()).hexdigest()[:12]

    def document(self, text: str) -> str:
        """``text`` cut to ``max_document_tokens`` (each distinct long document is counted once).

        >>> p = SGICPrompt(max_document_tokens=3)
        >>> p.document("one two three four"), p.truncated
        ('one two three', 1)
        """
        text = " ".join(text.split())
        if self.max_document_tokens is None:
            return text
        if text in self._cut:
            return self._cut[text]
        n = self.max_document_tokens
        if self.tokenizer is None:
            words = text.split(" ")
            cut = text if len(words) <= n else " ".join(words[:n])
        else:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            cut = text if len(ids) <= n else self.tokenizer.decode(ids[:n]).strip()
        self.truncated += cut != text
        self._cut[text] = cut
        return cut

    def _messages(self, body: list[str]) -> list[dict[str, str]]:
        user = {"role": "user", "content": "\n".join([self.instruction, *body])}
        return [{"role": "system", "content": self.system_prompt}, user] if self.system_prompt is not None else [user]

    def plain(self, question: str, documents: Sequence[str]) -> list[dict[str, str]]:
        """The documents and the question without scores.

        >>> SGICPrompt(instruction="Answer.").plain("Who?", ["A.", "B."])[0]["content"].splitlines()
        ['Answer.', 'Document [1]: A.', 'Document [2]: B.', 'Question: Who?', 'Answer:']
        """
        docs = [f"Document [{i}]: {self.document(d)}" for i, d in enumerate(documents, 1)]
        return self._messages([*docs, f"Question: {question}", "Answer:"])

    def calibration(
        self,
        question: str,
        documents: Sequence[str],
        document_scores: Sequence[float],
        history: Sequence[tuple[str, float]],
    ) -> list[dict[str, str]]:
        """Table 1: scored documents, the question, ``Previous Generated Answer`` rounds, ``Answer:``.

        Args:
            question: the question.
            documents: its documents.
            document_scores: one 0-100 uncertainty per document (Eq. 3).
            history: ``(answer, uncertainty)`` of every earlier round, oldest first (Round 1 is the first answer).
        """
        if len(document_scores) != len(documents):
            raise ValueError(f"{len(documents)} documents but {len(document_scores)} document scores")
        docs = [
            f"Document [{i}]: {self.document(d)} (Uncertainty Score: {round(s)})"
            for i, (d, s) in enumerate(zip(documents, document_scores), 1)
        ]
        rounds = [
            f"Round {k}: {' '.join(a.split())} (Uncertainty Score: {round(s)})" for k, (a, s) in enumerate(history, 1)
        ]
        return self._messages([*docs, f"Question: {question}", "Previous Generated Answer:", *rounds, "Answer:"])
