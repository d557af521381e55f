"""A table's history restarting, decided in one place and told in one message.

A table's versions count up within one history. A history restarts when the store loses
or replaces what it held: a server restarted without its data, a table deleted and made
again, a snapshot older than what readers saw. A reader that holds a version of the old
history must not compare it with the new one's numbers (version 3 of the new history is
not newer than version 7 of the old, nor older: it is another value), so it gets
:class:`~varsync.TableResetError` and pulls again.

Two signs of a restart, one mechanism for both:

- the version is below the one the reader holds (the container checks this for every
  backend);
- the engine's own mark of a history (an *epoch*: the token in a Redis table's head,
  a Reverb server's start time, a store's inode) is not the one this client saw before.
  A backend keeps a :class:`Histories` and calls :meth:`Histories.check` with the epoch
  each answer carries.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

from varsync.errors import TableResetError

__all__ = ["Histories", "reset_error"]


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
    """The epoch this client trusts for each table, and the rule for a new one.

    Thread-safe. An epoch is any hashable the engine returns with its answers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epochs: dict[str, Hashable] = {}

    def trusted(self, table: str) -> Hashable | None:
        """The epoch last adopted for ``table``, or ``None`` if none was."""
        with self._lock:
            return self._epochs.get(table)

    def check(
        self, table: str, epoch: Hashable, held: int, *, where: str, current: int | None = None
    ) -> bool:
        """Whether ``epoch`` is new for ``table``, adopting it.

        The first epoch seen is adopted. A different one is adopted too, unless the caller
        holds a version of the old history (``held > 0``): then :func:`reset_error` is
        raised and the old epoch stays trusted, so every holder of an old version hears of
        the restart, not just the first to ask.
        """
        with self._lock:
            known = self._epochs.get(table)
            if known == epoch:
                return False
            if known is not None and held > 0:
                raise reset_error(
                    table, where, held, current=current, why=f"epoch {known} -> {epoch}"
                )
            self._epochs[table] = epoch
            return known is not None

    def adopt(self, table: str, epoch: Hashable) -> None:
        """Trust ``epoch`` for ``table`` from now on (e.g. after this client created it)."""
        with self._lock:
            self._epochs[table] = epoch

    def forget(self, table: str | None = None) -> None:
        """Trust nothing for ``table`` (``None``: for every table)."""
        with self._lock:
            if table is None:
                self._epochs.clear()
            else:
                self._epochs.pop(table, None)
