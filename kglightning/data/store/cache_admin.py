"""``kglightning cache list|du|clean``: what the cache holds, how much, and removing what kglightning wrote.

The cache (``$KGLIGHTNING_CACHE``, default ``~/.cache/kglightning``) holds one folder per kind of thing built once
(:data:`~kglightning.data.store.cache_marks.KINDS`: ``records``, ``kg``, ``embeddings``, ``proposals-v2``, ...) and
the embedded benchmark's folders (``embedded-v<V>-seed<S>``). Each child of a kind folder is one *entry*; an entry
that kglightning wrote carries its marker (:mod:`~kglightning.data.store.cache_marks`), and its age is the time it
was last written or read. ``list`` and ``du`` also show entries without the marker (*unmarked*: written by a version
of kglightning before markers, or not by kglightning at all), the temporaries of writers (running or killed), and
the folders of other tools in the cache root; they are never removed. An entry written before markers existed is
marked the next time a run reads it and finds it whole and trusted
(:func:`~kglightning.data.store.cache_marks.adopt`), and is from then on an entry like any other.

``clean`` (:func:`~kglightning.data.store.cache_clean.clean`) removes, in every kind or in ``--kind``:

* always: what killed runs left, by the exact names kglightning's writers use: their temporaries
  (``.<name>.kgl-<host>.<pid>.tmp``, :mod:`~kglightning.data.store.temporaries`) of this user in which nothing was
  written for a day, whatever their host, or for ten minutes when their process is gone on this host (and, named
  as the release before the ``kgl-`` token named them, this host's of a gone process, and folders of any host that
  hold kglightning's marker and are a day old); lock files (``records/<key>.lock``), in-use markers
  (``.<name>.in-use``) and entry markers (``.<name>.kglightning-entry``) of entries that are gone, a day old and
  held by no process; and digest memos (``records/stamps/<digest>``) a month old;
* ``--older-than DAYS``: marked entries not used for that long;
* ``--max-size GB`` (default ``KGLIGHTNING_CACHE_MAX_GB`` when it is set): the least recently used marked entries,
  until the marked entries of the kinds cleaned hold at most that much.

It removes only marked entries (this user's, with a marker that is a regular file of this user no one else can
write; an entry whose marker is not believed is skipped, with the reason) and kglightning's own temporaries
(by their exact names) and locks (empty regular files of this user), never an entry a running process
has pinned (:mod:`~kglightning.data.store.cache_pins`), never follows a link (a kind folder or an entry that is a
link is skipped, with a message), never walks a kind folder that others can write, skips a folder it cannot read
(``skipped <path>: cannot be read (<error>)``) and goes on with the rest, removes nothing outside the cache root, and prints every path it removed as it removes it (``--dry-run``: would remove, and writes nothing), the
totals at the end. The in-use files it makes to lock an entry while removing it are removed with the entry. Nothing
is removed when an entry is written: the cache grows until ``clean`` runs.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from kglightning.data.store.cache import default_cache_root
from kglightning.data.store.cache_clean import clean
from kglightning.data.store.cache_scan import human, other_folders, scan
from kglightning.help_format import DefaultsHelpFormatter

__all__ = ["main", "max_bytes_from_env"]

_NO_LINKS = "a symbolic link; kglightning follows no link out of its cache"


def max_bytes_from_env() -> int | None:
    """``KGLIGHTNING_CACHE_MAX_GB`` in bytes (the default of ``clean --max-size``), or ``None`` when it is unset,
    empty or infinite.

    Raises:
        ValueError: a value that is not a number of GB >= 0 (``nan``, ``-1``, ``5GB``).
    """
    value = os.environ.get("KGLIGHTNING_CACHE_MAX_GB", "").strip()
    return _gigabytes(value, "KGLIGHTNING_CACHE_MAX_GB") if value else None


def _gigabytes(value: str, what: str) -> int | None:
    try:
        gb = float(value)
    except ValueError:
        gb = math.nan
    if not gb >= 0:
        raise ValueError(f"{what}={value!r}: expected a number of GB >= 0")
    return None if math.isinf(gb) or gb * 2**30 >= 2**62 else int(gb * 2**30)


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        days = math.nan
    if not days >= 0:
        raise ValueError(f"--older-than {value}: expected a number of days >= 0")
    return days


def _show(root: Path, kinds: list[str] | None, du: bool) -> None:
    found, now = scan(root, kinds), time.time()
    if du:
        totals: dict[str, int] = {}
        for e in found.entries:
            key = e.kind if e.marked else f"{e.kind} ({e.state})"
            totals[key] = totals.get(key, 0) + e.bytes
        for kind, n in sorted(totals.items()):
            print(f"{kind:28s} {human(n):>10s}")
        print(f"{'total':28s} {human(sum(totals.values())):>10s}  ({root})")
    else:
        print(f"{root}")
        for e in found.entries:
            note = "" if e.marked else f"  ({e.state}{': never removed by clean' if e.state == 'unmarked' else ''})"
            note = f"  (refused: {e.why})" if e.state == "refused" else note
            print(f"{e.kind:18s} {human(e.bytes):>10s} {(now - e.used) / 86400:7.1f} d  {e.path.name}{note}")
    for link in found.links:
        print(f"skipped {link}: {_NO_LINKS}")
    for folder, why in found.untrusted:
        print(f"skipped {folder}: {why}; kglightning neither reads nor cleans a folder others could have written")
    for folder, why in found.unreadable:
        print(f"skipped {folder}: cannot be read ({why})")
    if any(e.state == "unmarked" for e in found.entries):
        print("unmarked: no kglightning marker (not written by kglightning, or written before markers existed and "
              "not read since: a run that reads such an entry marks it); `kglightning cache clean` leaves them: "
              "remove them by hand once no run needs them")  # fmt: skip
    others = [] if kinds else other_folders(root)
    if others:
        print(f"not kglightning's, not counted: {', '.join(others)}")


def main(argv: list[str] | None = None, prog: str = "kglightning cache") -> int:
    p = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter, prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("action", choices=("list", "du", "clean"))
    p.add_argument(
        "--kind",
        nargs="+",
        default=None,
        help="only these kinds (records, kg, embeddings, embedded, ...; default: every kind)",
    )
    p.add_argument(
        "--older-than",
        default=None,
        metavar="DAYS",
        help="clean: marked entries unused this long (default: no age limit)",
    )
    p.add_argument("--max-size", default=None, metavar="GB", help="clean: keep at most this much in marked entries "
                   "(default: $KGLIGHTNING_CACHE_MAX_GB)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="clean: say what would go; remove and write nothing")
    args = p.parse_args(argv)
    root = default_cache_root()
    if args.action in ("list", "du"):
        _show(root, args.kind, args.action == "du")
        return 0
    try:
        older = None if args.older_than is None else _days(args.older_than) * 86400
        cap = max_bytes_from_env() if args.max_size is None else _gigabytes(args.max_size, "--max-size")
    except ValueError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    done = clean(root, older, cap, args.kind, args.dry_run, say=lambda line: print(line, flush=True))
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(done.removed)} paths, {human(sum(size for _, size, _ in done.removed))}")
    if done.unmarked:
        print(f"left {len(done.unmarked)} unmarked entries ({human(sum(e.bytes for e in done.unmarked))}): no "
              "kglightning marker; `kglightning cache list` names them, remove them by hand")  # fmt: skip
    return 0
