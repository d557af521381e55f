"""What one redis backend keeps per table: its keys and the signature the primary last
said it has (:class:`Catalog`), and as a writer what it published (:class:`Writes`).

Neither decides whether an answer continues a caller's history: the core does, from the
epoch every answer carries. A writer's record is what the publish script needs to mint
a new epoch when the server went back or restarted (``docs/redis.md``, "When the server
loses data")."""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from varsync._backends.redis.protocol import Keys, check_format, is_epoch, keys_of, text
from varsync._signature import flat_specs
from varsync._signature_json import from_json
from varsync.backend import CorruptDataError, Spec, TableResetError

__all__ = [
    "Catalog",
    "Stored",
    "Written",
    "Writes",
    "MAX_IN_DOUBT",
    "signature_changed",
    "read_stored",
]

#: In-doubt tokens a writer keeps (each push is at most one; after this many unanswered
#: publishes in a row the oldest may be forgotten, at worst costing readers a reset).
MAX_IN_DOUBT = 16


@dataclass(frozen=True)
class Stored:
    """A table's signature text as the primary stored it in the history ``epoch``."""

    epoch: str
    signature: str

    @functools.cached_property
    def specs(self) -> tuple[tuple[tuple[int, ...], str], ...]:
        """Each leaf's shape and dtype: what a caller's specs are compared with."""
        return _layout(flat_specs(from_json(self.signature)))


def _layout(specs: Sequence[Spec]) -> tuple[tuple[tuple[int, ...], str], ...]:
    return tuple((tuple(s.shape), str(s.dtype)) for s in specs)


def signature_changed(name: str, address: str) -> TableResetError:
    """A table created again with another signature is not a new history a pull can
    follow (the reset error's advice) but a layout this container cannot decode: an
    error only the backend can see (it alone reads the stored signature)."""
    return TableResetError(
        f"table {name!r} at {address} was created again with another "
        "signature than the one this container read: its data is in a layout this "
        "container cannot decode. Connect again (varsync.connect) to use the new "
        "signature, or create the table again with this one."
    )


class Catalog:
    """Per table, its keys (worked out once: percent-encoding) and the signature the
    primary last answered, with that answer's epoch. Thread-safe."""

    def __init__(self, key_base: str, cluster_namespace: str | None) -> None:
        self.key_base = key_base
        self._tag = cluster_namespace  # in a Redis Cluster: keys in the table's hash tag
        self._keys: dict[str, Keys] = {}
        self._stored: dict[str, Stored] = {}
        self._lock = threading.Lock()

    @property
    def tables_key(self) -> str:
        return self.key_base + "tables"

    def keys(self, name: str) -> Keys:
        keys = self._keys.get(name)
        if keys is None:
            keys = self._keys[name] = keys_of(self.key_base, name, self._tag)
        return keys

    def get(self, name: str) -> Stored | None:
        return self._stored.get(name)

    def remember(self, name: str, epoch: str, signature: str) -> Stored:
        with self._lock:
            stored = self._stored.get(name)
            if stored is None or stored != Stored(epoch, signature):
                stored = self._stored[name] = Stored(epoch, signature)
            return stored

    @staticmethod
    def same_specs(stored: Stored, specs: Sequence[Spec]) -> bool:
        return stored.specs == _layout(specs)


@dataclass
class Written:
    """What this writer published in the history ``epoch`` of a table it writes with
    ``signature`` (the text it creates the table again with): the last version and its
    token, plus the tokens of the pushes since whose publish script was sent but not
    answered (to notice a server going back in time, and to vouch for the head after a
    server restart). All of them, not the last: a push whose answer was lost may have
    published, and the next push, retried across a restart, is in doubt too before it
    learns anything."""

    epoch: str
    signature: str
    published: int = 0
    token: str = ""
    in_doubt: tuple[str, ...] = ()
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


class Writes:
    """Per table, this writer's :class:`Written` in the history it last published to or
    created. Thread-safe."""

    def __init__(self) -> None:
        self._written: dict[str, Written] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Written | None:
        return self._written.get(name)

    def of(self, name: str, epoch: str, signature: str) -> Written:
        """The record of history ``epoch``: a new one, with nothing published, if this
        writer knew another."""
        with self._lock:
            written = self._written.get(name)
            if written is None or written.epoch != epoch or written.signature != signature:
                written = self._written[name] = Written(epoch, signature)
            return written

    def published(self, written: Written, version: int, token: str) -> None:
        with self._lock:
            written.published, written.token, written.in_doubt = version, token, ()
            written.moved = False

    def moved(self) -> None:
        """A failover moved the primary: see :meth:`Written.vouched`."""
        with self._lock:
            for written in self._written.values():
                written.moved = True


def read_stored(
    client: Any, catalog: Catalog, name: str, address: str, deadline: float
) -> Stored | None:
    """The table's signature and epoch as ``client``'s server (the primary) holds them
    now, remembered in ``catalog``; ``None``: no table."""
    head = catalog.keys(name).head
    raw = client.call("HMGET", head, "fmt", "sig", "epoch", deadline=deadline)
    fmt, signature, epoch = (text(x) for x in raw)
    if fmt is None and signature is None and epoch is None:
        return None
    if signature is None or not is_epoch(epoch):
        raise CorruptDataError(
            f"key {head!r} at {address} is not a varsync table head (no signature, "
            "or no valid epoch); is something else using this key prefix?"
        )
    check_format(f"table {name!r} at {address}", fmt)
    return catalog.remember(name, epoch, signature)
