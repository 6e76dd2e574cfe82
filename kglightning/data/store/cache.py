"""Where kglightning keeps what it builds once: the embedded benchmark, proposals, text embeddings."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
from pathlib import Path

from kglightning.data.store.owned_files import create_new, open_own

_warned: set[tuple[str, str]] = set()

#: the kind folders of a cache root, whose children are entries kglightning writes
#: (:mod:`~kglightning.data.store.cache_marks`)
KINDS = ("records", "kg", "embeddings", "proposals-v2", "pcst-cuts", "pcst_subgraphs", "detection_graphs",
         "proxy_sft")  # fmt: skip


def warn_once(kind: str, where: str | os.PathLike, msg: str, *args: object, logger: logging.Logger) -> None:
    """Log ``msg`` to ``logger`` as a WARNING the first time this process meets ``kind`` at ``where`` (a store folder,
    or a root for what holds for the whole cache), at DEBUG after: a read-only cache, or records the store cannot
    keep, would otherwise warn at every read of every file."""
    key = (kind, str(where))
    logger.log(logging.DEBUG if key in _warned else logging.WARNING, msg, *args)
    _warned.add(key)


def default_cache_root() -> Path:
    """``$KGLIGHTNING_CACHE`` if set, else ``~/.cache/kglightning``."""
    env = os.environ.get("KGLIGHTNING_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kglightning"


def private_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` and any missing parents with mode ``0700`` (only this user may read or write what the cache
    keeps there); folders that exist are left as they are. Returns the path.

    Example:
        >>> import tempfile, stat
        >>> d = private_dir(Path(tempfile.mkdtemp()) / "a" / "b")
        >>> oct(stat.S_IMODE(d.stat().st_mode)), oct(stat.S_IMODE(d.parent.stat().st_mode))
        ('0o700', '0o700')
    """
    p = Path(path)
    missing = []
    for q in (p, *p.parents):
        if q.exists():
            break
        missing.append(q)
    for q in reversed(missing):
        q.mkdir(mode=0o700, exist_ok=True)
        os.chmod(q, 0o700)  # the umask may have taken bits off, never added: this is exact
    return p


def untrusted(path: str | os.PathLike, alone: bool = False) -> str | None:
    """Why the cache file at ``path`` must not be read, or ``None``: a file is read only when it and every folder up to
    the cache root (:func:`_cache_root_of`: the default root, or a ``cache_dir`` holding kind folders; never a folder
    above it) are owned by this user (or root) and writable by no one else, so that no other user can plant a
    file that a run takes for its own (a wrong KG, another string's vector, an Arrow file that decompresses to
    gigabytes). ``path`` itself must not be a symbolic link (kglightning follows no link in its cache; the cache
    root and the folders above it may be one, as ``~/.cache`` often is). ``alone`` checks ``path`` itself only (its folder was checked
    already: the files of one entry).

    Example:
        >>> import tempfile
        >>> d = private_dir(Path(tempfile.mkdtemp()) / "kg")
        >>> f = d / "index.arrow"
        >>> _ = f.write_bytes(b"")
        >>> os.chmod(f, 0o600); untrusted(f) is None
        True
        >>> os.chmod(f, 0o666); untrusted(f).endswith("is writable by other users")
        True
    """
    if not hasattr(os, "getuid"):  # no POSIX permissions to read (Windows): trust the user's own profile folder
        return None
    me = os.getuid()
    if os.path.islink(path) and Path(os.path.abspath(path)) != Path(os.path.abspath(default_cache_root())):
        return f"{path} is a symbolic link"
    p = Path(path).resolve()
    root = _cache_root_of(p)
    chain = [p, *p.parents]
    if alone:
        chain = chain[:1]
    elif root in chain:
        chain = chain[: chain.index(root) + 1]
    else:  # a folder outside any cache layout: its own folder and the file
        chain = chain[:2]
    for q in chain:
        st = q.stat()
        if st.st_uid not in (me, 0):
            return f"{q} belongs to another user (uid {st.st_uid})"
        if st.st_mode & 0o022 and not (q.is_dir() and st.st_mode & 0o1000):  # a sticky folder (/tmp) is fine
            return f"{q} is writable by other users"
    return None


def _cache_root_of(path: Path) -> Path | None:
    """The cache root that ``path`` (absolute, or resolved) lies in: the default root (:func:`default_cache_root`)
    when ``path`` is it or lies under it, else the folder holding the nearest folder on the way named as a kind
    (:data:`KINDS`: a data module's ``cache_dir`` holds ``records``, ``kg``, ...); ``None`` outside any cache."""
    root = default_cache_root()
    for r in (Path(os.path.abspath(root)), root.resolve()):
        if path == r or r in path.parents:
            return r
    return next((q.parent for q in (path, *path.parents) if q.name in KINDS and q.parent != q), None)


def untrusted_above(path: str | os.PathLike) -> str | None:
    """:func:`untrusted` of the nearest folder at or above ``path`` that exists, asked before a folder is made at
    ``path``, so that nothing is made inside a folder that another user owns or can write; ``None`` when none
    exists. Only the cache root (:func:`_cache_root_of`) and what lies below it count: a root that does not exist
    yet is made ``0700`` whatever the folder above it is (a group-writable ``~/.cache`` is common), and then checked
    like every folder below it."""
    p = Path(os.path.abspath(path))
    there = next((q for q in (p, *p.parents) if q.exists()), None)
    if there is None:
        return None
    root = _cache_root_of(p)
    if root is not None and there in root.parents:  # the root is not made yet: it will be, privately
        return None
    return untrusted(there)


#: where :func:`content_digest` remembers digests, under the cache root (bookkeeping of the record store's kind)
STAMPS = ("records", "stamps")
_digests: dict[str, str] = {}  # stat stamp -> digest, for this process


def content_digest(path: str | os.PathLike) -> str:
    """The BLAKE2b-128 hex digest of the bytes of the file at ``path``.

    It is remembered per resolved path and ``stat`` stamp (inode, size, modification time and change time: a write,
    a ``cp -p`` or a ``touch -r`` moves the change time, which no user can set back), in this process and under
    ``records/stamps/`` of the cache root (a memo is read only when :func:`untrusted` passes it, and written only
    into a folder it passes, through a new file: see :func:`_remember`), so that an unchanged file is hashed once.
    """
    path = Path(path)
    st = path.stat()
    stamp = f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    if stamp in _digests:
        return _digests[stamp]
    memo = default_cache_root().joinpath(*STAMPS, hashlib.sha1(stamp.encode()).hexdigest()[:20])
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if untrusted(memo) is None:
            with os.fdopen(open_own(memo), encoding="ascii") as f:  # a regular file of this user, no link, no FIFO
                known = f.read(64).strip()
            if len(known) == 32 and all(c in "0123456789abcdef" for c in known):
                _digests[stamp] = known
                return known
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 23):
            digest.update(chunk)
    out = _digests[stamp] = digest.hexdigest()
    _remember(memo, out)
    return out


def _remember(memo: Path, digest: str) -> None:
    """Write ``digest`` to the memo file ``memo``, only into a folder :func:`untrusted` passes (one that another user
    can write could hold a link planted at the temporary's name, or a memo of theirs) and through a new file
    (``O_EXCL``, no link followed), renamed into place; a read-only cache, or one refused, is left as it is."""
    with contextlib.suppress(OSError):
        if untrusted_above(memo.parent) is not None:  # (nothing is made in a folder another user may own)
            return
        private_dir(memo.parent)
        if untrusted(memo.parent) is not None:
            return
        tmp = memo.with_name(f".{memo.name}.kgl-{socket.gethostname()}.{os.getpid()}.tmp")  # temporaries' form
        fd = create_new(tmp)  # raises when anything is at the name: nothing is written through it
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(digest)
            os.replace(tmp, memo)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def folder_files(path: str | os.PathLike) -> tuple[list[tuple[str, Path]], list[tuple[str, str]]]:
    """The files under the folder ``path`` as ``(relative name, path)`` pairs, and the linked folders not walked
    again as ``(relative name, what it stands for)``, both sorted.

    Names starting with ``.`` are skipped (editor and lock files). Links are followed, to files and to folders (a
    ``save_to_disk`` folder whose split folder is a link, a model hub snapshot whose files are links), wherever they
    point, once the folders themselves are walked, with two exceptions that are recorded instead of walked: a folder
    met a second time (through a link, or a link back up the tree: a loop) stands for the name it was first walked
    under (its own path when it is in the tree; ``"."``: ``path`` itself), and a link to a folder above ``path`` (the
    walk never leaves ``path``'s tree upwards) stands for ``"above"``. A folder that
    cannot be listed is left out, as a reader of the folder could not read it either.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> (d / "real").mkdir(); _ = (d / "real" / "x.arrow").write_bytes(b"1")
        >>> (d / "split").symlink_to(d / "real"); (d / "real" / "loop").symlink_to(d)
        >>> folder_files(d)[0] == [("real/x.arrow", d / "real" / "x.arrow")], folder_files(d)[1]
        (True, [('real/loop', '.'), ('split', 'real')])
    """
    top = Path(path)
    top_real = top.resolve()
    seen: dict[Path, str] = {top_real: "."}
    files: list[tuple[str, Path]] = []
    aliases: list[tuple[str, str]] = []
    stack, links = [(top, "")], []  # folders to walk; linked folders, walked once the tree itself is
    while stack or links:
        if not stack:  # the folders themselves first, so that a folder also linked to is named by its own path
            child, child_rel = links.pop(0)
            try:
                real = child.resolve()
            except OSError:
                continue
            if real in seen:
                aliases.append((child_rel, seen[real]))
            elif real in top_real.parents:
                aliases.append((child_rel, "above"))
            else:
                seen[real] = child_rel
                stack.append((child, f"{child_rel}/"))
            continue
        folder, rel = stack.pop()
        try:
            with os.scandir(folder) as it:
                names = sorted(e.name for e in it if not e.name.startswith("."))
        except OSError:
            continue
        below = []
        for name in names:
            child, child_rel = folder / name, f"{rel}{name}"
            try:
                if child.is_symlink() and child.is_dir():
                    links.append((child, child_rel))
                elif child.is_dir():
                    seen[child.resolve()] = child_rel
                    below.append((child, f"{child_rel}/"))
                elif child.is_file():
                    files.append((child_rel, child))
            except OSError:  # a link loop, a name that cannot be looked at
                continue
        stack.extend(reversed(below))  # depth first, in name order: the same tree is walked the same way
    return sorted(files), sorted(aliases)


def files_stamp(path: str | os.PathLike) -> str:
    """A short digest of what is at ``path`` now: every file's relative name and the digest of its bytes
    (:func:`content_digest`).

    A file is stamped alone; a folder by all its files, recursively (:func:`folder_files`: names starting with
    ``.`` skipped, links followed, as a model hub's snapshot folder links its files and a dataset folder may link
    its split folders; a folder met again through a link is stamped by the name it stands for); a path that does
    not exist (a hub id) stamps as ``""``. Caches of what is computed from model weights or data put it in their
    key, so that other bytes under the same name (a retrained model exported to the same folder, an updated
    dataset, even one copied with ``cp -p`` so that its size and time stay the same) miss the cache, and a copy of
    the same bytes finds it.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "model.safetensors").write_bytes(b"v1")
        >>> a = files_stamp(d)
        >>> _ = (d / "model.safetensors").write_bytes(b"v2")
        >>> a != files_stamp(d), files_stamp(d / "missing")
        (True, '')
    """
    p = Path(path).expanduser()
    if not p.exists():
        return ""
    files, aliases = ([(p.name, p)], []) if p.is_file() else folder_files(p)
    digest = hashlib.sha1()
    for name, f in files:
        digest.update(f"{name}\0{content_digest(f)}\n".encode())
    for name, alias in aliases:
        digest.update(f"{name}\0-> {alias}\n".encode())
    return digest.hexdigest()[:12]


def folder_name(key: str, width: int = 60) -> str:
    """One safe folder name for a cache ``key`` that may hold ``/``, ``..`` or a server's text: its first ``width``
    characters with everything but letters, digits, ``.``, ``_`` and ``-`` replaced by ``_``, then a hash of the whole
    key (so two keys never share a folder, and no key leaves the cache root).

    Example:
        >>> folder_name("kaping-openai-chat:http://host/v1:../../etc")[:40]
        'kaping-openai-chat_http___host_v1_.._.._'
        >>> "/" in folder_name("a/../b"), folder_name("a/b") != folder_name("a_b")
        (False, True)
    """
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", key[:width]).strip(".") or "key"
    return f"{slug}-{hashlib.sha1(key.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"
