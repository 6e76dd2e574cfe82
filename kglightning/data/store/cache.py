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
    the cache root are owned by this user (or root) and writable by no one else, so that no other user can plant a
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
    root = default_cache_root().resolve()
    chain = [p, *p.parents]
    if alone:
        chain = chain[:1]
    elif root in chain:
        chain = chain[: chain.index(root) + 1]
    else:  # a cache_dir outside the cache root: its own folder and the file
        chain = chain[:2]
    for q in chain:
        st = q.stat()
        if st.st_uid not in (me, 0):
            return f"{q} belongs to another user (uid {st.st_uid})"
        if st.st_mode & 0o022 and not (q.is_dir() and st.st_mode & 0o1000):  # a sticky folder (/tmp) is fine
            return f"{q} is writable by other users"
    return None


def untrusted_above(path: str | os.PathLike) -> str | None:
    """:func:`untrusted` of the nearest folder at or above ``path`` that exists (``None`` when none does): asked before
    a folder is made at ``path``, so that nothing is made inside a folder that another user owns or can write."""
    p = Path(os.path.abspath(path))
    there = next((q for q in (p, *p.parents) if q.exists()), None)
    return None if there is None else untrusted(there)


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
        tmp = memo.with_name(f".{memo.name}.{socket.gethostname()}.{os.getpid()}.tmp")
        fd = create_new(tmp)  # raises when anything is at the name: nothing is written through it
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(digest)
            os.replace(tmp, memo)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def files_stamp(path: str | os.PathLike) -> str:
    """A short digest of what is at ``path`` now: every file's relative name and the digest of its bytes
    (:func:`content_digest`).

    A file is stamped alone; a folder by all its files, recursively (names starting with ``.`` skipped: editor and
    lock files; links followed, as a model hub's snapshot folder links its files); a path that does not exist (a hub
    id) stamps as ``""``. Caches of what is computed from model weights or data put it in their key, so that other
    bytes under the same name (a retrained model exported to the same folder, an updated dataset, even one copied
    with ``cp -p`` so that its size and time stay the same) miss the cache, and a copy of the same bytes finds it.

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
    if p.is_file():
        files = [(p.name, p)]
    else:
        files = sorted(
            (str(f.relative_to(p)), f)
            for f in p.rglob("*")
            if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
        )
    digest = hashlib.sha1()
    for name, f in files:
        digest.update(f"{name}\0{content_digest(f)}\n".encode())
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
