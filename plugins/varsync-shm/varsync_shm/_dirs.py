"""The directories of a store, made private and checked, level by level.

Whoever can write to a store's directories can plant values that the store's readers
pull, and in ``/dev/shm`` every local user can create directories. So each level varsync
uses (store, namespace, table) must be a real directory (not a symbolic link), owned by
this process's user and not writable by group or others; anything else is refused with
:class:`~varsync.ConfigurationError`. Levels varsync makes are made mode 0700.

Each level is opened relative to the descriptor of the one above (``dir_fd``) with
``O_NOFOLLOW`` and checked on that descriptor (``fstat``), so what is checked is what is
used: no name can be swapped between the check and the use. Below a checked store
directory only its owner (and root) can change anything, which is why the backend keeps
the store's descriptor and addresses tables relative to it.
"""

from __future__ import annotations

import errno
import os
import stat

from varsync.backend import ConfigurationError
from varsync_shm._fds import Descriptors

__all__ = ["check_root", "enter", "MODE"]

MODE = 0o700
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_root(root: str) -> None:
    """Refuse a root directory where other users could replace a store's directory."""
    try:
        status = os.stat(root)
    except (OSError, ValueError):
        status = None
    if status is None or not stat.S_ISDIR(status.st_mode):
        raise ConfigurationError(
            f"shm root {root!r} is not a directory; shm:// keeps its files in /dev/shm, "
            "or in the directory given as ?root=<dir> (use a RAM-backed tmpfs)"
        )
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise ConfigurationError(
            f"shm root {root!r} has mode {mode:04o}: group or others can write to it and it "
            "is not sticky, so they could replace a store's directory. Use a root only you "
            f"can write to, or make it sticky (chmod +t {root}), as /dev/shm is"
        )


def enter(parent: int, name: str, path: str, fds: Descriptors, *, create: bool) -> int:
    """The descriptor (owned by ``fds``) of directory ``name`` in directory ``parent``,
    made mode 0700 first if ``create``; -1 if it does not exist and not ``create``.
    ``path`` names it in messages. Refuses what is not a private directory of ours."""
    made = False
    if create:
        try:
            os.mkdir(name, MODE, dir_fd=parent)
            made = True
        except FileExistsError:
            pass
    try:
        fd = fds.open(name, _DIRECTORY, dir_fd=parent)
    except FileNotFoundError:
        if create:  # removed between mkdir and open: by another process of ours
            raise ConfigurationError(
                f"{path} vanished while it was being made; try again"
            ) from None
        return -1
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(parent, name):
            raise ConfigurationError(
                f"{path} is a symbolic link; varsync-shm uses only real directories (a link "
                "could lead to files someone else controls). Remove the link, or use another "
                "store name"
            ) from None
        if exc.errno == errno.ENOTDIR:
            raise ConfigurationError(
                f"{path} is not a directory; remove it, or use another store name"
            ) from None
        raise
    status = os.fstat(fd)
    if made and stat.S_IMODE(status.st_mode) != MODE:  # a umask took bits we need
        os.chmod(fd, MODE)
        status = os.fstat(fd)
    _check(status, path)
    return fd


def _is_link(parent: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _check(status: os.stat_result, path: str) -> None:
    uid, mode = os.geteuid(), stat.S_IMODE(status.st_mode)
    why = (
        "varsync-shm uses only directories that you own and that neither group nor others "
        "can write to, since whoever can write there can plant values your processes would "
        "pull"
    )
    if status.st_uid != uid:
        raise ConfigurationError(
            f"{path} is owned by {_owner(status.st_uid)}, mode {mode:04o}, not by you "
            f"({_owner(uid)}); {why}. Do not use it: remove it if you trust nothing in it "
            "(its owner or root can), or use another store name"
        )
    if mode & 0o022:
        raise ConfigurationError(
            f"{path} has mode {mode:04o}: group or others can write to it; {why}. If you "
            f"made it and trust what is in it, chmod 700 {path}; else remove it, or use "
            "another store name"
        )
