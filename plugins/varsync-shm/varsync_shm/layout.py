"""Where a store lives under ``/dev/shm``, how names become file names, and the names
of the files in a table's directory: every layout constant of the plugin, in one place.

    <root>/varsync-shm.<store>/            one store: the URL shm://<store>
        n_<namespace>/                     one namespace ("n_" alone for the default "")
            t_<table>/                     one table:
                signature.json             the core's signature text; its identity is the epoch
                lock                       the writers' lock (flock)
                current -> seg-<version>   the published version, replaced by rename(2)
                seg-<version>              one complete version (varsync_shm.segment)
                patch-<version>            the element patches written at a version
                                           (varsync_shm.chains)
                spare-<token>              a retired segment no reader holds, kept for reuse
                .fill-<token>              a segment a writer is filling
                readers/                   the reader registry (varsync_shm.registry)

Names are percent-encoded (``quote(name, safe="")``), so any string is a valid name and
no name can climb out of its directory. Only the standard library and
:mod:`varsync.backend` are imported here.
"""

from __future__ import annotations

import os
import shutil
from urllib.parse import quote, unquote, urlsplit

from varsync.backend import ConfigurationError, CorruptDataError, redact

__all__ = [
    "DEFAULT_ROOT",
    "STORE_PREFIX",
    "store_name_of",
    "store_entry",
    "namespace_entry",
    "table_entry",
    "store_path",
    "namespace_path",
    "table_path",
    "table_name_of",
    "remove_store",
    "SIGNATURE",
    "LOCK",
    "CURRENT",
    "SEGMENT",
    "SPARE",
    "FILL",
    "SEGMENTS",
    "TEMPORARY",
    "READERS",
    "PATCH",
    "version_named",
]

DEFAULT_ROOT = "/dev/shm"
STORE_PREFIX = "varsync-shm."
_NAMESPACE_PREFIX = "n_"
_TABLE_PREFIX = "t_"
_NAME_MAX = 255  # bytes in one file name, on Linux file systems

# The files of a table's directory.
SIGNATURE = "signature.json"
LOCK = "lock"
CURRENT = "current"
SEGMENT = "seg-"
SPARE = "spare-"
FILL = ".fill-"
SEGMENTS = (SEGMENT, SPARE, FILL)
PATCH = "patch-"
#: Names made and renamed only under the writers' lock (links, signatures and patch
#: files being written).
TEMPORARY = (".link-", ".sig-", ".patch-")
READERS = "readers"


def version_named(pointer: str | None, where: str) -> int:
    """The version segment name ``pointer`` (what ``current`` names) says; 0 for ``None``
    (no push yet). ``where``: the table's directory, for messages."""
    if pointer is None:
        return 0
    digits = pointer[len(SEGMENT) :]
    if not pointer.startswith(SEGMENT) or not digits.isdigit():
        raise CorruptDataError(f"{where}/{CURRENT} points to {pointer!r}, not a segment")
    return int(digits)


def store_name_of(url: str) -> str:
    """The store an ``shm://<store>`` URL names; ``ConfigurationError`` if none."""
    parts = urlsplit(url)
    # Without any user-info: files have no use for credentials, and must not show them.
    raw = parts.netloc.rpartition("@")[2] + parts.path
    try:
        name = unquote(raw, errors="strict").strip("/")
    except UnicodeDecodeError as exc:  # %-escapes that are not UTF-8
        raise ConfigurationError(
            f"shm URL {redact(url)!r}: the store name {raw!r} is not valid text ({exc.reason} "
            f"at position {exc.start}); name the store with valid Unicode characters, "
            "percent-encoded as UTF-8 if need be"
        ) from None
    if not name:
        raise ConfigurationError(
            f"shm URL {redact(url)!r} names no store; expected shm://<store>, e.g. shm://training "
            "(processes that connect to the same store share its tables)"
        )
    store_entry(name)  # a name that cannot be a file name is refused now, not later
    return name


def _encode(prefix: str, name: str, what: str) -> str:
    try:
        encoded = prefix + quote(name, safe="")
    except UnicodeEncodeError as exc:  # a lone surrogate: no file name can hold it
        raise ConfigurationError(
            f"{what} name {name!r} is not valid text: {exc.object[exc.start : exc.end]!r} at "
            f"position {exc.start} is a lone surrogate, which cannot be encoded as UTF-8 "
            f"for a file name; use a name of valid Unicode characters"
        ) from None
    if len(encoded) > _NAME_MAX:
        raise ConfigurationError(
            f"{what} name {name[:40]!r}... is too long for a file name under /dev/shm "
            f"({len(encoded)} bytes encoded, at most {_NAME_MAX}); use a shorter name"
        )
    return encoded


def store_entry(store: str) -> str:
    """The file name of store ``store``'s directory, in the root."""
    return _encode(STORE_PREFIX, store, "store")


def namespace_entry(namespace: str) -> str:
    """The file name of a namespace's directory, in its store's directory."""
    return _encode(_NAMESPACE_PREFIX, namespace, "namespace")


def table_entry(table: str) -> str:
    """The file name of a table's directory, in its namespace's directory."""
    return _encode(_TABLE_PREFIX, table, "table")


def store_path(store: str, root: str = DEFAULT_ROOT) -> str:
    """The directory holding store ``store`` (whether or not it exists yet)."""
    return os.path.join(root, store_entry(store))


def namespace_path(store: str, namespace: str, root: str = DEFAULT_ROOT) -> str:
    return os.path.join(store_path(store, root), namespace_entry(namespace))


def table_path(namespace_dir: str, table: str) -> str:
    return os.path.join(namespace_dir, table_entry(table))


def table_name_of(entry: str) -> str | None:
    """The table a directory entry of a namespace holds, or ``None`` for anything else."""
    if not entry.startswith(_TABLE_PREFIX):
        return None
    return unquote(entry[len(_TABLE_PREFIX) :])


def remove_store(store: str, root: str = DEFAULT_ROOT) -> bool:
    """Delete store ``store`` and every table in it; return whether it existed.

    Processes still holding pulled arrays keep them (the kernel frees the memory when
    they drop them); containers still connected see empty namespaces afterwards.
    """
    path = store_path(store, root)
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return False
    return True
