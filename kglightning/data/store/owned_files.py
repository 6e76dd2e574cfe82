"""Opening the cache's own small files without trusting what is at their names, and removing a tree without recursion.

The cache's bookkeeping files have names anyone can compute: an entry's marker (``.kglightning-entry``), its in-use
file (``.<entry>.in-use``), a record store's lock (``<key>.lock``), a digest memo and the temporaries of writers
(``.<name>.kgl-<host>.<pid>.tmp``). Whatever is at such a name is opened here without following a link and without
waiting (``O_NOFOLLOW | O_NONBLOCK``: a FIFO planted at the name is refused, not waited on), and is used only when
``fstat`` of the open descriptor shows a regular file of this user (:func:`open_own`); a file is created only where
no name exists yet (:func:`create_new`: ``O_CREAT | O_EXCL | O_NOFOLLOW``), so a link planted at a writer's name
makes the write fail instead of writing through it. :func:`remove_tree_at` removes a folder through descriptors,
never following a link, with no recursion however deep the folder is.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["NotOurs", "create_new", "open_own", "refusal", "remove_tree_at"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class NotOurs(OSError):
    """What is at a name of the cache is not a regular file of this user (a link, a FIFO, a folder, another user's
    file); the message names the path and what it is."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def refusal(st: os.stat_result, private: bool = False) -> str | None:
    """Why a file with the ``stat`` (or ``lstat``) result ``st`` is not one of this user's own regular files, or
    ``None``; ``private`` also refuses one that the group or others may write (a marker: only its owner may say
    that an entry is kglightning's)."""
    if not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st.st_mode)}, not a regular file"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid})"
    if private and st.st_mode & 0o022:
        return "is writable by other users"
    return None


def open_own(path: str | os.PathLike, flags: int = os.O_RDONLY, *, create: bool = False,
             dir_fd: int | None = None, private: bool = False) -> int:  # fmt: skip
    """A descriptor of the file at ``path`` (relative to ``dir_fd`` when given), opened without following a link or
    waiting on a FIFO, and only when it is a regular file of this user (:func:`refusal`); ``create`` makes it
    (``0600``) when the name is free.

    Raises:
        NotOurs: something else is at the name (a link, a FIFO, a folder, another user's file).
        OSError: it cannot be opened (missing without ``create``, no permission, a read-only file system).
    """
    flags |= _NOFOLLOW | _NONBLOCK | _CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a link (EMLINK on FreeBSD)
            raise NotOurs(err.errno, f"{path} is a symbolic link; kglightning follows no link in its cache") from None
        if err.errno == errno.ENXIO:  # a FIFO without a reader, opened for writing without waiting
            raise NotOurs(err.errno, f"{path} is a FIFO, not a regular file") from None
        raise
    why = refusal(os.fstat(fd), private)
    if why is not None:
        os.close(fd)
        raise NotOurs(errno.EPERM, f"{path} {why}")
    return fd


def create_new(path: str | os.PathLike, mode: int = 0o600, dir_fd: int | None = None) -> int:
    """A descriptor, open for writing, of a new file at ``path``: fails (``FileExistsError``) when anything is at the
    name already, a link included, so nothing is ever written through a name someone else prepared."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode, dir_fd=dir_fd)


def remove_tree_at(parent_fd: int, name: str) -> None:
    """Remove the folder ``name`` of the folder ``parent_fd`` and all it holds, through descriptors: no link is
    followed (a link inside is removed as a link), at most two folders are open at once and nothing recurses, so a
    folder nested thousands of levels deep is removed like any other.

    Raises:
        OSError: something could not be removed, or a folder was moved while it was being emptied.
    """
    flags = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
    fd = os.open(name, flags, dir_fd=parent_fd)
    path: list[tuple[str, int, int]] = []  # (name, dev, inode) of each folder entered below the top one
    try:
        while True:
            sub = None
            with os.scandir(fd) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        sub = e.name
                        break
                    os.unlink(e.name, dir_fd=fd)
            if sub is not None:  # go down into it
                child = os.open(sub, flags, dir_fd=fd)
                here = os.fstat(fd)
                path.append((sub, here.st_dev, here.st_ino))
                os.close(fd)
                fd = child
                continue
            if not path:  # the top folder is empty
                break
            done, dev, ino = path.pop()  # go back up, and remove the folder just emptied
            up = os.open("..", flags, dir_fd=fd)
            os.close(fd)
            fd = up
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (dev, ino):
                raise OSError(errno.ESTALE, f"a folder under {name} was moved while it was being removed")
            os.rmdir(done, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
