"""The signature each table had when this backend handed it out, and the one reset the
backend itself decides: a table made again with *another* signature.

A table made again is a new history (a new ``signature.json``, so a new epoch), which the
core tells its holders about by comparing epochs. But a table made again with another
signature holds data in a layout the container that read the old one cannot decode, so
no pull can follow it: every call on it raises :class:`~varsync.TableResetError`, whose
advice is to connect again. Only the backend sees that the text changed.
"""

from __future__ import annotations

import threading

from varsync.backend import BackendConnectionError, TableResetError
from varsync_shm._fds import Descriptors
from varsync_shm.store import Epoch, SegmentStore, TableDir

__all__ = ["Signatures"]


class Signatures:
    """Per table, the signature text this backend knows and the epoch of the
    ``signature.json`` that held it; thread-safe. ``where`` names the store in messages."""

    def __init__(self, files: SegmentStore, where: str) -> None:
        self._files = files
        self._where = where
        self._lock = threading.Lock()
        self._known: dict[str, tuple[str, Epoch]] = {}

    def remember(self, name: str, text: str, epoch: Epoch, *, replace: bool = False) -> None:
        """Know ``text`` as table ``name``'s signature, in the file of ``epoch``, unless
        another text is known and not ``replace``\\ d (the container still holds that one)."""
        with self._lock:
            known = self._known.get(name)
            if known is None or known[0] == text or replace:
                self._known[name] = (text, epoch)

    def knows(self, name: str) -> bool:
        return name in self._known

    def check(self, table: TableDir, epoch: Epoch) -> None:
        """Raise :class:`TableResetError` if the ``signature.json`` of ``epoch`` holds
        another signature than the one this backend knows; learn it otherwise. As a rule
        nothing to do: the epoch is the known one."""
        known = self._known.get(table.name)
        if known is not None and known[1] == epoch:
            return
        fds = Descriptors()
        try:
            if not self._files.check(table, fds):  # a directory not seen yet: check it
                return
            found = table.read_signature(fds)
            if found is None:
                return
            text, read = found
            if known is not None and known[0] != text:
                raise TableResetError(
                    f"table {table.name!r} at {self._where} was created again with another "
                    f"signature ({table.path}) than the one this container read: its data "
                    "is in a layout this container cannot decode. To use the new signature, "
                    "connect again (varsync.connect); or create the table again with this one"
                )
            self.remember(table.name, text, read)
        finally:
            fds.close()

    def checked(self, table: TableDir) -> Epoch:
        """The table's epoch, after :meth:`check`; for a writer, under the writers' lock:
        a table without a signature is gone."""
        epoch = table.epoch()
        if epoch is None:
            raise gone(table.name, table.path, self._where)
        self.check(table, epoch)
        return epoch


def gone(name: str, path: str, where: str) -> BackendConnectionError:
    """The error for a push into table ``name`` of store ``where``, whose directory
    ``path`` was deleted."""
    return BackendConnectionError(
        f"table {name!r} of {where} is gone ({path} was deleted); "
        "create_table() it again, then push"
    )
