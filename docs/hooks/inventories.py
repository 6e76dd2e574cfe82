"""MkDocs hook: the offline inventories of ``tools/docs_inventories.py``, read fresh at every build.

``mkdocs.yml`` names them with relative ``file:`` URLs. mkdocstrings reads each inventory through MkDocs' download
cache, which keeps what a URL gave for a day, whatever the file holds now, and a relative path depends on the folder
the build runs from. Before mkdocstrings reads them, this hook rewrites each ``file:`` URL as an absolute one (from
``mkdocs.yml``'s folder) that ends with the file's content digest as a fragment (``#sha256=...``; ``urllib`` ignores
the fragment when it opens the file), so a changed inventory is a new URL, and every checkout reads its own files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority


def fresh_url(url: str, base: Path) -> str:
    """``url`` (a relative or absolute ``file:`` URL, without a fragment) as an absolute ``file://`` URL ending in
    ``#sha256=<digest of the file>``; any other URL as it is."""
    if not url.startswith("file:"):
        return url
    path = url[len("file:") :].split("#", 1)[0]
    path = path[2:] if path.startswith("//") else path
    full = (base / path).resolve()
    digest = hashlib.sha256(full.read_bytes()).hexdigest()
    return f"{full.as_uri()}#sha256={digest}"


@event_priority(100)  # before mkdocstrings' own on_config, which starts reading the inventories
def on_config(config: Any) -> Any:
    base = Path(config.config_file_path).resolve().parent
    plugin = config.plugins.get("mkdocstrings")
    if plugin is not None:
        for handler in plugin.config.handlers.values():
            for inv in handler.get("inventories", []) if isinstance(handler, dict) else []:
                if isinstance(inv, dict) and "url" in inv:
                    inv["url"] = fresh_url(inv["url"], base)
    return config
