"""What one redis backend knows of each table: the signature it read, which history
(epoch) it trusts, and as a writer what it published in that history."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from varsync.backend import Histories, TableResetError


@dataclass
class Table:
    """A table in the history ``epoch``: the signature text this backend read, and the
    last version this writer published there with its token, plus the tokens of the
    pushes since then whose publish script was sent but not answered (to notice a server
    going back in time, and to vouch for the head after a server restart). All of them,
    not the last: a push whose answer was lost may have published, and the next push,
    retried across a restart, is in doubt too before it learns anything."""

    epoch: str
    signature: str
    published: int = 0
    token: str = ""
    in_doubt: tuple[str, ...] = ()
    leaf_count: int | None = None  # leaves of its signature, once a call needed it
    moved: bool = False  # the primary moved (a failover) since this writer last published

    def doubt(self, token: str) -> None:
        """``token``'s publish script is about to be sent: from now on it may publish."""
        if token not in self.in_doubt:
            self.in_doubt = (*self.in_doubt, token)[-MAX_IN_DOUBT:]

    def vouched(self) -> str:
        """The tokens whose version this writer vouches for on a restarted server. After
        a failover only the last one before this push's (the last in :attr:`in_doubt`):
        an earlier one on the new primary means a later push may have been published on
        the old one, and replicated to a replica readers read, but not to this one; its
        number must not name another value."""
        tokens = [t for t in (self.token, *self.in_doubt) if t]
        return ",".join(tokens[-2:] if self.moved else tokens)


#: In-doubt tokens a writer keeps (each push is at most one; after this many unanswered
#: publishes in a row the oldest may be forgotten, at worst costing readers a reset).
MAX_IN_DOUBT = 16


class Known:
    """The tables one backend knows, and the epoch it trusts for each (a
    :class:`Histories`, which decides when another one is a reset). Thread-safe."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._histories = Histories()
        self._tables: dict[str, Table] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Table | None:
        return self._tables.get(name)

    def remember(self, name: str, epoch: str, signature: str) -> Table:
        """Trust ``epoch`` for the table from now on; a new history (or signature) starts
        with nothing published by this writer."""
        with self._lock:
            table = self._tables.get(name)
            if table is None or table.epoch != epoch or table.signature != signature:
                table = Table(epoch, signature)
                self._tables[name] = table
            self._histories.adopt(name, epoch)
            return table

    def trusted(self, name: str) -> str | None:
        """The epoch trusted for the table, ``None`` before any."""
        epoch = self._histories.trusted(name)
        return None if epoch is None else str(epoch)

    def moved(self) -> None:
        """A failover moved the primary: see :meth:`Table.vouched`."""
        with self._lock:
            for table in self._tables.values():
                table.moved = True

    def trusts(self, name: str, epoch: str) -> bool:
        return self._histories.trusted(name) == epoch

    def check(self, name: str, epoch: str, held: int, current: int) -> None:
        """Adopt the head's ``epoch`` for a caller holding version ``held`` (0: none),
        or raise the core's reset error if it holds one of another history."""
        if self._histories.check(name, epoch, held, where=self._address, current=current):
            table = self._tables.get(name)
            if table is not None:
                self.remember(name, epoch, table.signature)

    def published(self, table: Table, version: int, token: str) -> None:
        with self._lock:
            table.published, table.token, table.in_doubt = version, token, ()
            table.moved = False

    def check_same_signature(self, name: str, stored: str | None, table: Table) -> None:
        """A table created again with another signature is not a new history a pull can
        follow (the reset error's advice) but a layout this container cannot decode."""
        if stored != table.signature:
            raise TableResetError(
                f"table {name!r} at {self._address} was created again with another "
                "signature than the one this container read: its data is in a layout this "
                "container cannot decode. Connect again (varsync.connect) to use the new "
                "signature, or create the table again with this one."
            )
