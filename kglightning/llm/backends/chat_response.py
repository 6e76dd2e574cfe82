"""Reading an OpenAI chat-completion body into a :class:`~kglightning.llm.backends.base.Generation`, checked.

A body that does not follow the schema (``choices`` not a list of objects, ``content`` a number, a log-probability
that is not a number...) raises :class:`LLMResponseError` naming the field, never an ``AttributeError`` from deep
inside. Text is made encodable: a lone UTF-16 surrogate (``"\\ud800"``, legal in JSON but not in UTF-8) becomes
U+FFFD, so that the answer can be cached and written out.
"""

from __future__ import annotations

import json
import math
from typing import Any

from kglightning.llm.backends.base import Generation, LLMBackendError

__all__ = ["LLMResponseError", "clean_text", "decode_json", "parse_chat_completion"]

_POSITIVE_SLACK = 1e-4  # a log-probability this far above 0 is rounding; further is a broken server


class LLMResponseError(LLMBackendError):
    """The server answered 2xx with a body that is not a chat completion."""


def clean_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (pairs are joined into their character).

    >>> clean_text("a\\ud800b"), clean_text("\\ud83d\\ude00")
    ('a\\ufffdb', '😀')
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def decode_json(raw: bytes, where: str) -> Any:
    """Strict JSON (no ``NaN``/``Infinity``); :class:`LLMResponseError` naming ``where`` otherwise."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise LLMResponseError(f"{where}: the response is not JSON ({e}): {raw[:200]!r}") from e


def _field(obj: Any, key: str, kinds: tuple[type, ...], path: str, *, required: bool = False) -> Any:
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None:
        if required:
            raise LLMResponseError(f"the response has no {path}")
        return None
    if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
        names = " or ".join(k.__name__ for k in kinds)
        raise LLMResponseError(f"{path} should be {names}, got {type(value).__name__}: {value!r:.100}")
    return value


def _count(usage: Any, key: str) -> int | None:
    value = _field(usage, key, (int,), f"usage.{key}")
    if value is not None and value < 0:
        raise LLMResponseError(f"usage.{key} is negative: {value}")
    return value


def _logprobs(choice: dict[str, Any]) -> tuple[list[float] | None, list[str] | None]:
    logprobs = _field(choice, "logprobs", (dict,), "choices[0].logprobs")
    content = _field(logprobs, "content", (list,), "choices[0].logprobs.content")
    if content is None:
        return None, None
    values: list[float] = []
    tokens: list[str] = []
    for j, entry in enumerate(content):
        where = f"choices[0].logprobs.content[{j}]"
        if not isinstance(entry, dict):
            raise LLMResponseError(f"{where} should be an object, got {entry!r:.100}")
        lp = _field(entry, "logprob", (int, float), f"{where}.logprob", required=True)
        try:
            lp = float(lp)
        except OverflowError:
            raise LLMResponseError(f"{where}.logprob is not a log-probability: {str(lp)[:40]}...") from None
        if not math.isfinite(lp) or lp > _POSITIVE_SLACK:
            raise LLMResponseError(f"{where}.logprob is not a finite log-probability: {lp!r}")
        values.append(min(lp, 0.0))
        tokens.append(clean_text(_field(entry, "token", (str,), f"{where}.token", required=True)))
    return values, tokens


def parse_chat_completion(payload: Any) -> Generation:
    """A :class:`Generation` from an OpenAI chat-completion response body (checked; see the module docstring).

    >>> body = {"choices": [{"message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop",
    ...          "logprobs": {"content": [{"token": "Paris", "logprob": -0.1}]}}],
    ...         "usage": {"prompt_tokens": 9, "completion_tokens": 1}}
    >>> parse_chat_completion(body)
    Generation(text='Paris', token_logprobs=[-0.1], tokens=['Paris'], prompt_tokens=9, completion_tokens=1, finish_reason='stop', cached=False)
    >>> parse_chat_completion({"choices": ["x"]})
    Traceback (most recent call last):
    ...
    kglightning.llm.backends.chat_response.LLMResponseError: choices[0] should be an object, got 'x'
    """
    if not isinstance(payload, dict):
        raise LLMResponseError(f"the response should be a JSON object, got {type(payload).__name__}")
    choices = _field(payload, "choices", (list,), "choices", required=True)
    if not choices:
        raise LLMResponseError("the response has an empty choices list")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise LLMResponseError(f"choices[0] should be an object, got {choice!r:.100}")
    message = _field(choice, "message", (dict,), "choices[0].message", required=True)
    text = _field(message, "content", (str,), "choices[0].message.content")
    if text is None and not (message.get("refusal") or message.get("tool_calls")):
        raise LLMResponseError("choices[0].message has no content (and no refusal or tool call that explains it)")
    text = text or ""
    token_logprobs, tokens = _logprobs(choice)
    usage = _field(payload, "usage", (dict,), "usage")
    completion = _count(usage, "completion_tokens")
    return Generation(
        text=clean_text(text),
        token_logprobs=token_logprobs,
        tokens=tokens,
        prompt_tokens=_count(usage, "prompt_tokens") or 0,
        completion_tokens=completion if completion else len(tokens or ()),
        finish_reason=clean_text(_field(choice, "finish_reason", (str,), "choices[0].finish_reason") or "stop"),
    )
