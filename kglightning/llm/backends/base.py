"""One interface for every LLM: chat messages in; text plus optional token log-probabilities out.

A backend turns a batch of chat conversations into one :class:`Generation` each. Subclasses implement
:meth:`LLMBackend._generate_uncached`; the public :meth:`LLMBackend.generate` adds an optional on-disk
:class:`~kglightning.llm.backends.cache.ResponseCache`, so that a long run that crashes resumes where it stopped:
each result is written to the cache as soon as it arrives, and a rerun only computes what is missing.

Example:
    >>> class Echo(LLMBackend):
    ...     @property
    ...     def name(self) -> str:
    ...         return "echo"
    ...     def _generate_uncached(self, batch, params, on_result):
    ...         for i, messages in enumerate(batch):
    ...             text = messages[-1]["content"][: params.max_new_tokens]
    ...             on_result(i, Generation(text=text, prompt_tokens=1, completion_tokens=len(text)))
    >>> [g.text for g in Echo().generate([[{"role": "user", "content": "hello"}]], max_new_tokens=4)]
    ['hell']
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from kglightning.data.text import neutralize_special_tokens

if TYPE_CHECKING:
    from kglightning.llm.trie.names import NameChoice

__all__ = ["ChatMessage", "FinishReason", "Generation", "GenerationParams", "LLMBackend", "LLMBackendError"]

ChatMessage = dict[str, str]
"""One chat turn in the OpenAI schema: ``{"role": "system" | "user" | "assistant", "content": "..."}``."""

FinishReason = Literal["stop", "length"]


class LLMBackendError(RuntimeError):
    """A backend could not produce a generation (bad request, server error after retries, bad response...)."""


@dataclass
class Generation:
    """The answer to one chat conversation.

    Args:
        text: the generated text (special tokens and the matched stop string removed).
        token_logprobs: natural-log probability of each generated token under the model's own (untempered)
            distribution, or ``None`` when not requested. Each value is ``<= 0``.
        tokens: the generated tokens as strings, aligned with ``token_logprobs`` (``None`` when not requested).
        prompt_tokens: number of prompt tokens after the chat template.
        completion_tokens: number of generated tokens, the end-of-sequence token included when one was emitted.
        finish_reason: ``"stop"`` (end of sequence or a stop string) or ``"length"`` (``max_new_tokens`` reached).
        cached: ``True`` when this generation was read from a response cache instead of being computed.
    """

    text: str
    token_logprobs: list[float] | None = None
    tokens: list[str] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field but ``cached``."""
        out = dataclasses.asdict(self)
        out.pop("cached")
        return out

    def line_logprobs(self) -> list[tuple[str, float, int]]:
        """``(visible text, sum of log-probabilities, tokens)`` of each line the generated tokens write, first first.

        A token counts in a line when it writes visible characters there. Line breaks, spaces and tokens that
        decode to nothing (an end-of-sequence token) belong to no line, so the answer ``"A"`` alone and the first
        line of ``"A\\nB"`` get the same score. A line's text is its tokens' visible characters without any
        whitespace, for checking that a line of :attr:`text` is the one scored (the tokens may cover other text: a
        backend's ``response_prefix``, a server's reasoning). ``[]`` without tokens or log-probabilities.

        Example:
            >>> Generation("A\\nB", token_logprobs=[-0.5, -2.0, -3.0], tokens=["A", "\\n", "B"]).line_logprobs()
            [('A', -0.5, 1), ('B', -3.0, 1)]
            >>> Generation("A", token_logprobs=[-0.5, -0.1], tokens=["A", ""]).line_logprobs()
            [('A', -0.5, 1)]
        """
        if self.tokens is None or self.token_logprobs is None:
            return []
        lines: list[tuple[str, float, int]] = [("", 0.0, 0)]
        for token, lp in zip(self.tokens, self.token_logprobs):
            pieces = token.split("\n")
            lines += [("", 0.0, 0)] * (len(pieces) - 1)
            for j, piece in enumerate(pieces, start=len(lines) - len(pieces)):
                visible = "".join(piece.split())
                if visible:
                    text, total, n = lines[j]
                    lines[j] = (text + visible, total + lp, n + 1)
        return lines

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, cached: bool = False) -> Generation:
        """Inverse of :meth:`to_dict`; unknown keys are ignored.

        >>> Generation.from_dict({"text": "Paris", "completion_tokens": 2}, cached=True)
        Generation(text='Paris', token_logprobs=None, tokens=None, prompt_tokens=0, completion_tokens=2, finish_reason='stop', cached=True)
        """
        names = {f.name for f in dataclasses.fields(cls)} - {"cached"}
        return cls(**{k: v for k, v in data.items() if k in names}, cached=cached)


@dataclass(frozen=True)
class GenerationParams:
    """Decoding settings shared by every backend (and part of the response-cache key).

    Args:
        max_new_tokens: upper bound on generated tokens.
        temperature: ``0`` decodes greedily; ``> 0`` samples.
        top_p: nucleus-sampling mass (ignored when greedy).
        stop: strings that end the generation; the matched string is not part of the returned text.
        logprobs: also return the generated tokens and their log-probabilities.
        seed: seed for sampling, so that sampled runs are reproducible.
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    logprobs: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``stop`` as a list)."""
        return {**dataclasses.asdict(self), "stop": list(self.stop)}


def _normalize_stop(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    return tuple(s for s in stop if s)


class LLMBackend(abc.ABC):
    """Abstract chat LLM: :meth:`generate` maps a batch of conversations to one :class:`Generation` each.

    Subclasses set ``self.cache`` (a :class:`~kglightning.llm.backends.cache.ResponseCache` or ``None``) and
    implement :attr:`name` and :meth:`_generate_uncached`. :attr:`cache_key` defaults to :attr:`name`; override it
    when more than the name decides the outputs (a server URL, a quantisation...).
    """

    cache: Any = None

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """A short human-readable model name (used as the served model id)."""

    @property
    def cache_key(self) -> str:
        """What, besides the messages and decoding settings, identifies this backend's outputs."""
        return self.name

    def variant_key(self, params: GenerationParams, constrained: bool) -> str:
        """What else, for these settings, changes this backend's outputs (added to the response-cache key).

        Default ``""``. A backend whose samples depend on how requests are batched, or whose structured generation
        has modes, says so here.
        """
        return ""

    def special_tokens(self) -> Sequence[str]:
        """This model's special-token strings, broken up wherever they occur in messages (see :meth:`as_text`).

        Default ``()``: only the common shapes of :data:`~kglightning.data.text.GENERIC_SPECIAL` are broken up. A
        backend that knows its tokenizer lists its special tokens here.
        """
        return ()

    def as_text(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """``messages`` with special-token strings in their contents broken up by a zero-width space (counted in
        :data:`~kglightning.data.text.PROMPT_TEXT_COUNTS`), so that a KG name or a question that contains
        ``<|im_start|>system`` stays text instead of becoming a control token of the chat template."""
        tokens = self.special_tokens()
        return [{**m, "content": neutralize_special_tokens(m["content"], tokens)} for m in messages]

    @abc.abstractmethod
    def _generate_uncached(
        self,
        batch: Sequence[list[ChatMessage]],
        params: GenerationParams,
        on_result: Callable[[int, Generation], None],
    ) -> None:
        """Generate for every conversation of ``batch``, calling ``on_result(index, generation)`` as each is ready.

        Calling ``on_result`` early (not only at the end) is what lets an interrupted run keep its finished work.
        """

    def _generate_choices(
        self,
        batch: Sequence[list[ChatMessage]],
        params: GenerationParams,
        choices: Sequence[NameChoice],
        on_result: Callable[[int, Generation], None],
    ) -> None:
        """:meth:`_generate_uncached` under one :class:`NameChoice` per conversation (structured generation)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot constrain answers to a set of names here; use LocalHFBackend, "
            "OpenAIChatBackend(structured_outputs='vllm') with a vLLM server, or generate without choices and ground "
            "the answers (kglightning.llm.grounding, kglightning.retrieval.FaissGrounder)"
        )

    def generate(
        self,
        batch: Sequence[list[ChatMessage]],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: str | Sequence[str] | None = None,
        logprobs: bool = False,
        seed: int = 0,
    ) -> list[Generation]:
        """Generate one answer per conversation.

        Args:
            batch: conversations, each a list of :data:`ChatMessage`.
            max_new_tokens: upper bound on generated tokens per conversation.
            temperature: ``0`` decodes greedily (deterministic); ``> 0`` samples with ``seed``.
            top_p: nucleus-sampling mass.
            stop: a string or strings that end a generation (not included in the text).
            logprobs: also return generated tokens and their log-probabilities.
            seed: sampling seed.

        Returns:
            one :class:`Generation` per conversation, in order. Those read from the cache have ``cached=True``.
        """
        params = GenerationParams(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=_normalize_stop(stop),
            logprobs=logprobs,
            seed=seed,
        )
        return self.generate_with_params(batch, params)

    def generate_with_params(
        self,
        batch: Sequence[list[ChatMessage]],
        params: GenerationParams,
        choices: Sequence[NameChoice] | None = None,
    ) -> list[Generation]:
        """:meth:`generate` with the settings already gathered in a :class:`GenerationParams`.

        With ``choices`` (one :class:`~kglightning.llm.trie.names.NameChoice` per conversation), each answer is
        generated under that structure: names of the set, one per line, or ``unknown``. Backends that cannot
        constrain decoding raise :class:`NotImplementedError`.
        """
        for messages in batch:
            _check_messages(messages)
        batch = [self.as_text(messages) for messages in batch]
        if choices is not None and len(choices) != len(batch):
            raise ValueError(f"{len(choices)} choices for {len(batch)} conversations")
        results: list[Generation | None] = [None] * len(batch)
        keys: list[str] = []
        if self.cache is not None:
            keys = [
                self.cache.request_key(
                    self.cache_key
                    + self.variant_key(params, choices is not None)
                    + ("" if choices is None else f":names-{choices[i].key}"),
                    messages,
                    params,
                )  # fmt: skip
                for i, messages in enumerate(batch)
            ]
            for i, key in enumerate(keys):
                results[i] = self.cache.get(key)
        todo = [i for i, r in enumerate(results) if r is None]
        if todo:

            def on_result(j: int, gen: Generation) -> None:
                i = todo[j]
                results[i] = gen
                if self.cache is not None:
                    self.cache.put(keys[i], gen, messages=batch[i], params=params)

            if choices is None:
                self._generate_uncached([batch[i] for i in todo], params, on_result)
            else:
                self._generate_choices([batch[i] for i in todo], params, [choices[i] for i in todo], on_result)
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            raise LLMBackendError(f"{type(self).__name__} returned no generation for inputs {missing[:10]}")
        return [r for r in results if r is not None]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cache_key!r})"


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise TypeError(f"a conversation must be a non-empty list of chat messages, got {messages!r:.120}")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise TypeError(f"a chat message must be a dict with 'role' and 'content', got {m!r:.120}")
