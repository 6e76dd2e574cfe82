"""Where kglightning keeps what it builds once: the embedded benchmark, proposals, text embeddings."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_root() -> Path:
    """``$KGLIGHTNING_CACHE`` if set, else ``~/.cache/kglightning``."""
    env = os.environ.get("KGLIGHTNING_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kglightning"
