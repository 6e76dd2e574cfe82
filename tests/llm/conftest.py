"""Fixtures for the LLM backend tests: a loaded backend over the tiny chat model of ``tests/conftest.py``."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_backend(tiny_chat_model_dir):
    """A loaded :class:`LocalHFBackend` over the tiny model (shared: loading is the slow part)."""
    from kglightning.llm.backends.local_hf import LocalHFBackend

    backend = LocalHFBackend(tiny_chat_model_dir, batch_size=4, show_progress=False)
    backend.load()
    return backend


def _conversations(n: int) -> list[list[dict[str, str]]]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"question {i}: what is the capital of " + "France " * (i % 4)}]
        if i % 3 == 0:
            msgs.insert(0, {"role": "system", "content": "You are a helpful assistant."})
        out.append(msgs)
    return out


@pytest.fixture(scope="session")
def make_conversations():
    """``make_conversations(n)``: ``n`` distinct short conversations of varying length (batches need padding)."""
    return _conversations
