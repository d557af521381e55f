"""A table's history: the one rule that says whether an answer continues the history a
caller holds a version of, and the one message when it does not.

A table's versions count up within one history. A history restarts when the store loses
or replaces what it held: a server restarted without its data, a table deleted and made
again, a snapshot older than what readers saw. A reader that holds a version of the old
history must not compare it with the new one's numbers (version 3 of the new history is
not newer than version 7 of the old, nor older: it is another value), so it gets
:class:`~varsync.TableResetError` and pulls again.

Every backend answer that names a version names its epoch too (a
:class:`~varsync.backend.Head`); backends mint and store epochs and remember nothing of
what a caller saw. This module is the only place that compares them: a container keeps
one :class:`Histories`, and every reset error comes from :meth:`Histories.check`.
Two signs of a restart, one rule:

- the answer's epoch is not the one of the version the caller holds (the epoch the
  container handed that version out in, or else the last one it saw for the table);
- the answer's version is below the one the caller holds.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Hashable
from typing import Any

from varsync._backends.base import Head
from varsync._errors import TableResetError

__all__ = ["Histories", "reset_error", "UNKNOWN"]

#: :meth:`Histories.epoch_of` for a version of a table this container knows no epoch of.
UNKNOWN: Any = object()
_LOOK_UP: Any = object()


def reset_error(
    table: str,
    where: str,
    held: int,
    *,
    current: int | None = None,
    why: str = "",
    remedy: str = "pull() to resynchronise",
) -> TableResetError:
    """The error for a reader holding version ``held`` of a table whose history restarted
    (``where``: the redacted URL or address; ``current``: the version now, if known;
    ``why``: what showed it, e.g. "epoch a1 -> b2"; ``remedy``: what the reader does now,
    when a ``pull()`` is not enough, e.g. "connect again" for a table whose signature
    changed)."""
    now = "" if current is None else f" is at version {current} and"
    because = f" ({why})" if why else ""
    return TableResetError(
        f"table {table!r} at {where}{now} started a new history since you read version "
        f"{held}{because}: the store lost or replaced its data (a restart without "
        f"persistence, the table made again). Your version means nothing now; {remedy}."
    )


class Histories:
    """Per table, the epoch a container last saw and the epochs of the last :attr:`KEEP`
    versions it handed out. Thread-safe."""

    KEEP = 64

    def __init__(self, where: str) -> None:
        self.where = where
        self._lock = threading.Lock()
        self._seen: dict[str, Hashable] = {}
        self._handed: dict[str, collections.OrderedDict[int, Hashable]] = {}

    def epoch_of(self, table: str, version: int) -> Any:
        """The history ``version`` of ``table`` belongs to for this container: the epoch
        it handed that version out in, else the last epoch it saw for the table, else
        :data:`UNKNOWN`."""
        with self._lock:
            handed = self._handed.get(table)
            if handed is not None and version in handed:
                return handed[version]
            return self._seen.get(table, UNKNOWN)

    def handed_epoch(self, table: str, version: int) -> Any:
        """The epoch this container handed ``version`` of ``table`` out in, or
        :data:`UNKNOWN` if it did not (recently)."""
        with self._lock:
            handed = self._handed.get(table)
            return UNKNOWN if handed is None else handed.get(version, UNKNOWN)

    def check(self, table: str, held: int, head: Head, *, epoch: Any = _LOOK_UP) -> None:
        """Whether ``head``, an answer about ``table``, continues the history of the
        version ``held`` a caller holds (0: none). ``epoch``: that version's epoch if the
        caller knows it (default: :meth:`epoch_of`).

        Raises :func:`reset_error` if it does not (another epoch, or a version below
        ``held``); the epoch seen before stays, so every holder of an old version hears
        of the restart, not just the first to ask. Otherwise adopts ``head``'s epoch.
        """
        if held:
            if epoch is _LOOK_UP:
                epoch = self.epoch_of(table, held)
            if epoch is not UNKNOWN and epoch != head.epoch:
                raise reset_error(
                    table,
                    self.where,
                    held,
                    current=head.version,
                    why=f"epoch {_shown(epoch)} -> {_shown(head.epoch)}",
                )
            if head.version < held:
                raise reset_error(table, self.where, held, current=head.version)
        with self._lock:
            self._seen[table] = head.epoch

    @staticmethod
    def continues(held: Head, head: Head) -> bool:
        """Whether ``head`` continues the history of the version ``held`` (same epoch,
        not below it): the rule of :meth:`check`, for a caller that resynchronises
        rather than raise (an ``update`` pulls the whole value)."""
        return head.epoch == held.epoch and head.version >= held.version

    def handed(self, table: str, head: Head) -> None:
        """This container handed out ``head``'s version of ``table``."""
        with self._lock:
            self._seen[table] = head.epoch
            versions = self._handed.setdefault(table, collections.OrderedDict())
            versions[head.version] = head.epoch
            versions.move_to_end(head.version)
            while len(versions) > self.KEEP:
                versions.popitem(last=False)

    def forget(self, table: str | None = None) -> None:
        """Know nothing of ``table`` (``None``: of every table)."""
        with self._lock:
            if table is None:
                self._seen.clear()
                self._handed.clear()
            else:
                self._seen.pop(table, None)
                self._handed.pop(table, None)


def _shown(epoch: Hashable) -> str:
    text = epoch.hex() if isinstance(epoch, bytes) else str(epoch)
    return text if len(text) <= 40 else text[:37] + "..."
