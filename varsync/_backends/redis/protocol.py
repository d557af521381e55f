"""The server side of the redis backend: the keys of a table, its head, and the Lua
scripts that change a table atomically.

Every reply a script can give has a name, bound once for both sides: a script's text
begins with ``local NAME, ... = 'value', ...`` made from its :class:`Reply` enum, its
Lua returns ``{NAME, ...}``, and Python matches the same member (:meth:`Script.answer`).
"""

from __future__ import annotations

import enum
import hashlib
import importlib.resources
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import quote

from redis import exceptions as rx

from varsync.backend import CorruptDataError

FORMAT = "1"
"""Layout format of a head whose current version is one whole segment (every version
written by :meth:`write`): what every varsync reads."""
LEAF_FORMAT = "2"
"""Layout format of a head whose current version was composed by ``write_leaves``: its
leaves lie in several segments (``leaves`` and ``segments`` fields, :mod:`.leaves`).
Readers of format 1 only refuse it with their format error."""
CHAIN_FORMAT = "3"
"""Layout format of a composed head in which some leaf is an anchor and the chain of
element patches since it (``write_patches``, :mod:`.leaves`). Readers of formats 1 and 2
only refuse it with their format error; a whole write makes the head format 1 again."""
FORMATS = (FORMAT, LEAF_FORMAT, CHAIN_FORMAT)
#: The formats whose current version is composed: its leaves are named by its leaf map.
COMPOSED_FORMATS = (LEAF_FORMAT, CHAIN_FORMAT)

PENDING_TTL_MS = 3_600_000  # chunks of a push not yet published expire after an hour
STREAM_LENGTH = 16  # entries at least kept in a table's events stream (trimmed by '~')


class Keys(NamedTuple):
    """A table's keys (see the package's docstring)."""

    head: str
    events: str
    chunks: str  # the prefix of its chunks' keys: ``<chunks><token>:<index>``


def keys_of(key_base: str, name: str, namespace: str | None = None) -> Keys:
    """``namespace`` (given in a Redis Cluster): the namespace and the name in braces, a
    hash tag, so that every key of the table (chunks, registry) falls in one slot, one
    node holds it and one script changes it, and tables of the same name in different
    namespaces spread over the nodes. Both are percent-encoded: the tag is always them."""
    quoted = quote(name, safe="")
    if namespace is not None:
        quoted = "{" + quote(namespace, safe="") + ":" + quoted + "}"
    table = key_base + quoted
    return Keys(table + ":head", table + ":events", table + ":d:")


# A generator of this module's own, seeded from the OS, and again in a forked child: not
# random's global one, which a program may seed with a constant, making two writers draw
# the same tokens. Unique, not secret (tokens are in key names): unlike secrets', no
# system call per push.
_TOKENS = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_TOKENS.seed)


def fresh_token() -> bytes:
    """8 random bytes: a push's token (its chunks' keys, their headers) or, as hex, an
    epoch."""
    return _TOKENS.getrandbits(64).to_bytes(8, "little")


def key_base_of(prefix: str, namespace: str) -> str:
    """``P`` of the package's docstring: every key of a namespace starts with it."""
    return f"{prefix}:{quote(namespace, safe='')}:"


# -- the head ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableHead:
    epoch: str
    version: int
    data: str | None
    layout: str | None
    fmt: str = FORMAT
    leaves: str | None = None  # formats 2 and 3: the leaf map, see :mod:`.leaves`
    segments: str | None = None  # the live segments, see :mod:`.leaves`
    chunk: bytes | None = None  # the one chunk of a small version, read with it (PEEK)


def text(value: Any) -> Any:
    """A reply's bytes as text (anything else as it is)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def is_epoch(epoch: str | None) -> bool:
    """Whether ``epoch`` is one varsync writes (``fresh_token().hex()``)."""
    return epoch is not None and len(epoch) == 16 and all(c in "0123456789abcdef" for c in epoch)


def check_format(where: str, fmt: str | None) -> None:
    """``where``: ``"table 'name' at <address>"``, for messages (as below)."""
    if fmt not in FORMATS:
        raise CorruptDataError(
            f"{where} has layout format {fmt!r}; this varsync reads formats "
            f"{', '.join(FORMATS[:-1])} and {FORMATS[-1]} (a newer varsync wrote it, or "
            "something else did)"
        )


def parse_head(where: str, key: str, raw: Sequence[Any], fields: Sequence[str]) -> TableHead | None:
    """The head from ``HMGET key fmt epoch version *fields``, or ``None`` if its keys
    vanished."""
    fmt, epoch, version, *extra = (text(x) for x in raw)
    if fmt is None and epoch is None and version is None:
        return None
    check_format(where, fmt)
    try:
        # ASCII digits below 2**53, as the publish script checks (Lua numbers are doubles)
        digits = version or ""
        if not is_epoch(epoch) or not (digits.isascii() and digits.isdigit()):
            raise ValueError
        number = int(digits)
        if number >= 2**53:
            raise ValueError
    except (TypeError, ValueError):
        raise CorruptDataError(
            f"{where}: head {key!r} has epoch {epoch!r} and version {version!r}; is "
            "something else writing under this prefix?"
        ) from None
    named = dict(zip(fields, extra))
    return TableHead(
        epoch,
        number,
        named.get("data"),
        named.get("layout"),
        fmt,
        named.get("leaves"),
        named.get("segments"),
    )


def parse_layout(where: str, layout: str | None) -> tuple[int, int, int]:
    """A head's ``layout``: total bytes, payload bytes per chunk, chunks."""
    try:
        total, chunk, chunks = (int(x) for x in str(layout).split(":"))
        if total < 0 or chunk <= 0 or chunks != -(-total // chunk):
            raise ValueError
    except ValueError:
        raise CorruptDataError(f"{where}: malformed layout {layout!r} in its head") from None
    return total, chunk, chunks


# -- scripts ------------------------------------------------------------------------------------


class Reply(str, enum.Enum):
    """The first element of a script's reply: the member's value is what the Lua returns,
    its name what both sides call it."""


class Created(Reply):
    CREATED = "created"  # fmt, signature, epoch: this call made the table
    EXISTS = "exists"  # fmt, signature, epoch of the table already there
    NOT_A_HEAD = "not-a-head"  # the head key holds something else


class Published(Reply):
    PUBLISHED = "published"  # version, epoch (a new one if this push started a history)
    VANISHED = "vanished"  # the head is gone: nothing published
    OTHER_EPOCH = "other-epoch"  # epoch: the table was created again since the writer looked
    CHUNK_MISSING = "chunk-missing"  # index of a chunk not there at its length
    MALFORMED_HEAD = "malformed-head"  # the head field that is malformed
    BASE_MOVED = "base-moved"  # version: leaves written on another base: nothing published
    NO_BASE = "no-base"  # why: no version of this history to compose leaves on: nothing


class Peeked(Reply):
    HEAD = "head"  # fmt, epoch, version, data, layout, and the chunk (PEEK) or nil


class Claimed(Reply):
    CLAIMED = "claimed"  # chunks renamed to the push's keys
    NO_SPARE = "no-spare"  # no spare (or another epoch): nothing changed
    SPARE_DROPPED = "spare-dropped"  # a spare the push could not use, no longer the spare


@dataclass(frozen=True)
class Script:
    """A Lua script the backend runs (by its SHA; its text where the server lacks it), and
    the names of its replies, which the script sees as Lua constants of the same names.
    Each script is a file, ``scripts/<name>.lua`` beside this module."""

    name: str
    text: str
    sha: str
    replies: type[Reply]

    @classmethod
    def load(cls, name: str, replies: type[Reply]) -> Script:
        """The script ``scripts/<name>.lua`` of this package, with ``replies``."""
        body = (importlib.resources.files(__package__) / "scripts" / f"{name}.lua").read_text(
            encoding="utf-8"
        )
        return cls.of(name, "\n" + body, replies)  # a blank line: the SHA it always had

    @classmethod
    def of(cls, name: str, body: str, replies: type[Reply]) -> Script:
        members = list(replies)
        text = (
            f"local {', '.join(r.name for r in members)} = "
            f"{', '.join(repr(r.value) for r in members)}\n{body}"
        )
        return cls(name, text, hashlib.sha1(text.encode()).hexdigest(), replies)

    def answer(self, raw: Any) -> tuple[Any, list[Any]]:
        """The reply's name (a member of :attr:`replies`) and the rest of it: from a
        table, or from one string of space-separated fields."""
        try:
            if isinstance(raw, bytes):
                raw = raw.split(b" ")
            return self.replies(text(raw[0])), list(raw[1:])
        except (TypeError, ValueError, IndexError, KeyError):
            raise rx.InvalidResponse(
                f"the {self.name} script answered {str(raw)[:80]}, none of "
                f"{', '.join(r.name for r in self.replies)}"
            ) from None


CREATE = Script.load("create", Created)

PUBLISH = Script.load("publish", Published)

CLAIM = Script.load("claim", Claimed)

#: The most bytes a version may hold for PEEK to return it with its head.
PEEK_BYTES = 256 << 10

PEEK = Script.load("peek", Peeked)
