"""Chunks on the wire: their format, and the code that writes and reads them.

A version's arrays travel back to back in flat order, cut into chunks of ``payload``
bytes (the last one shorter). Each chunk is one string value: a header, then its bytes::

    magic "VSC1" | token (8 bytes) | chunk index | payload bytes | CRC-32 of the payload
    (little-endian uint32s), then the payload

Writing sends the arrays' memory as it is, pipelined; reading receives each chunk straight
into preallocated arrays and checks everything the header says. Both speak RESP2 on a
pooled redis-py connection's socket (:class:`Wire`): redis-py would copy every value.
"""

from __future__ import annotations

import functools
import math
import socket
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable, NamedTuple

import numpy as np
from redis import exceptions as rx

from varsync._backends.redis.errors import OutOfTime, reply_error
from varsync._backends.redis.protocol import PENDING_TTL_MS
from varsync.backend import CorruptDataError, remaining

try:  # ISA-L's CRC-32: the same values as zlib's, about 7x faster where it is installed
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the redis extra installs isal where it has wheels
    from zlib import crc32

MAGIC = b"VSC1"
HEADER = struct.Struct("<4s8sIII")  # magic, token, chunk index, payload bytes, CRC-32
# A chunk's payload is chunk_size minus this, so that the stored value with its header,
# the server's string header and the protocol's CRLF fits in chunk_size bytes: allocators
# round up to size classes (jemalloc would put 4 MiB + 24 bytes in a 5 MiB extent).
CHUNK_SLACK = 64
# Chunk requests in flight per reader. The next chunk is asked for as soon as one is
# received, so the server works while the reader checks it; the server buffers at most
# one chunk per reader. Measured on loopback (Redis 6.2 and 7.0), two 4 MiB requests in
# flight pulled 1.8x slower than one; again for issue 40 (1 GB, Redis 6.2 with libc
# malloc, benchmarks/redis_pull.py): 28 % of raw TCP against 72 %, the server faulting in
# 169,000 pages per pull: with two reply buffers of a chunk alive, glibc hands the top of
# its heap back to the kernel when they are freed, and takes it again for the next ones.
READ_AHEAD = 1
WRITE_AHEAD = 8  # chunk writes in flight before their replies are read
DIRECT = 64 << 10  # buffers this big go to and from the socket without a copy


def checksum(parts: Sequence[memoryview]) -> int:
    """The CRC-32 of the parts' bytes back to back (zlib's value)."""
    value = 0
    for part in parts:
        value = crc32(part, value)
    return value


def byte_views(arrays: Sequence[np.ndarray]) -> list[memoryview]:
    """Each array's memory as a flat view of unsigned bytes: no copy of a C-contiguous
    one (another is copied first)."""
    views = []
    for array in arrays:
        try:  # a C-contiguous array of a dtype the buffer protocol knows: 4x as quick
            views.append(array.data.cast("B"))
        except (TypeError, ValueError, BufferError):  # ml_dtypes' types; not contiguous
            views.append(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
    return views


def chunk_parts(views: Sequence[memoryview], chunk: int) -> Iterator[list[memoryview]]:
    """The arrays' bytes back to back, cut into chunks: each chunk as the list of slices
    of the views it covers."""
    parts: list[memoryview] = []
    room = chunk
    for view in views:
        position, size = 0, len(view)
        while position < size:
            take = min(room, size - position)
            parts.append(view[position : position + take])
            position += take
            room -= take
            if room == 0:
                yield parts
                parts, room = [], chunk
    if parts:
        yield parts


class Sent(NamedTuple):
    """What :func:`send_chunks` learned: the first chunk write's error (not raised), and
    the reply to the command sent after the chunks (an error reply as an exception, not
    raised), or ``None`` if that command was not sent."""

    error: BaseException | None
    reply: Any | None


def send_chunks(
    conn: Any,
    chunk_prefix: str,
    token: bytes,
    arrays: Sequence[np.ndarray],
    payload: int,
    recycled: bool,
    then: Callable[[], bytes] | None = None,
) -> Sent:
    """Write every chunk of ``arrays`` (pipelined, straight from their memory) and read
    every reply, even after an error, so the connection stays usable.

    ``then`` makes a command (see :func:`command`) sent right after the last chunk,
    before their replies are read, unless a chunk write failed already: a push's publish
    script, which checks the chunks itself, so that a small push costs one round trip
    instead of two. It is called just before its bytes are sent.

    Fresh chunks are SET with a TTL (``PENDING_TTL_MS``; the publish script removes it).
    ``recycled``: the chunk keys exist already, each exactly as long as the chunk written
    to it (the spare version's, see the claim script), and are overwritten in place
    (SETRANGE): Redis then reuses memory it has, where a new value is fresh memory that the
    server faults in page by page, measured as most of a large push's time."""
    ttl = str(PENDING_TTL_MS).encode()
    reply = b":" if recycled else b"+"  # SETRANGE answers the length, SET +OK
    wire = Wire(conn, math.inf)
    pending = 0
    error: BaseException | None = None
    for index, parts in enumerate(chunk_parts(byte_views(arrays), payload)):
        nbytes = sum(len(p) for p in parts)
        crc = checksum(parts)
        key = f"{chunk_prefix}{index}".encode()
        if recycled:
            wire.put(
                b"*4\r\n$8\r\nSETRANGE\r\n$%d\r\n%b\r\n$1\r\n0\r\n$%d\r\n"
                % (len(key), key, nbytes + HEADER.size)
            )
        else:
            wire.put(
                b"*5\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n" % (len(key), key, nbytes + HEADER.size)
            )
        wire.put(HEADER.pack(MAGIC, token, index, nbytes, crc))
        for part in parts:
            wire.put(part)
        if recycled:
            wire.put(b"\r\n")
        else:
            wire.put(b"\r\n$2\r\nPX\r\n$%d\r\n%b\r\n" % (len(ttl), ttl))
        pending += 1
        if pending >= WRITE_AHEAD:
            wire.flush()
            error = wire.status(reply)
            pending -= 1
            if error is not None:
                break
    sent = False
    if error is None and then is not None:
        wire.put(then())
        sent = True
    wire.flush()
    while pending:  # read every reply, even after an error
        answer = wire.status(reply)
        error = error or answer
        pending -= 1
    return Sent(error, wire.reply() if sent else None)


#: How a read follows a Redis Cluster's ASK redirection (a chunk of a slot in migration
#: is on the target node already): ``ask(redirection, use)`` runs ``use`` on a
#: connection to the node the redirection names (see :mod:`.cluster`).
Ask = Callable[[rx.AskError, Callable[[Any], bool]], bool]


def receive_chunks(
    conn: Any,
    deadline: float,
    chunk_prefix: str,
    token: bytes,
    arrays: list[np.ndarray],
    payload: int,
    chunks: int,
    where: str,
    ask: Ask | None = None,
) -> list[np.ndarray] | None:
    """Read the ``chunks`` chunks under ``chunk_prefix`` into ``arrays`` (in flat order),
    checking each one's length, header and checksum; ``None`` if one is gone. ``where``
    names the version in messages (``"table 'name' at <address> version 3"``)."""
    parts = chunk_parts(byte_views(arrays), payload)
    if not receive_selected(conn, deadline, chunk_prefix, token, range(chunks), parts, where, ask):
        return None
    return arrays


def receive_selected(
    conn: Any,
    deadline: float,
    chunk_prefix: str,
    token: bytes,
    indices: Sequence[int],
    parts_of: Iterable[list[memoryview]],
    where: str,
    ask: Ask | None = None,
) -> bool:
    """Read the chunks ``indices`` under ``chunk_prefix``, each whole into its list of
    ``parts_of`` (views whose lengths add up to its payload), checking each one's length,
    header and checksum; ``False`` if one is gone. A chunk answered by an ASK
    redirection is read where it points, if ``ask`` is given. A connection left with a
    reply half read (an error mid-transfer) is closed."""
    wire = Wire(conn, deadline)
    requested = 0
    try:
        for _ in range(min(READ_AHEAD, len(indices))):
            wire.request_get(f"{chunk_prefix}{indices[requested]}".encode())
            requested += 1
        wire.flush()
        for index, parts in zip(indices, parts_of):
            wire.arm()
            crc: int | None = None
            try:
                length = wire.bulk_length()
            except rx.AskError as redirection:
                if ask is None:
                    raise
                asked = functools.partial(
                    _asked,
                    key=f"{chunk_prefix}{index}".encode(),
                    index=index,
                    parts=parts,
                    token=token,
                    where=where,
                    deadline=deadline,
                )
                if not ask(redirection, asked):
                    return False
            else:
                if length is None:
                    return False
                crc = _take(wire, length, index, parts, token, where)
            if requested < len(indices):  # the next request first, then the checksum
                wire.request_get(f"{chunk_prefix}{indices[requested]}".encode())
                requested += 1
                wire.flush()
            if crc is not None:
                _check(parts, crc, where, index)
    except BaseException:
        conn.disconnect()
        raise
    return True


def _asked(
    conn: Any,
    *,
    key: bytes,
    index: int,
    parts: list[memoryview],
    token: bytes,
    where: str,
    deadline: float,
) -> bool:
    """One chunk read after ``ASKING``, on the node an ASK redirection named."""
    wire = Wire(conn, deadline)
    wire.put(b"*1\r\n$6\r\nASKING\r\n")
    wire.request_get(key)
    wire.flush()
    wire.arm()
    error = wire.status()
    if error is not None:
        raise error
    length = wire.bulk_length()
    if length is None:
        return False
    _check(parts, _take(wire, length, index, parts, token, where), where, index)
    return True


def _take(
    wire: Wire, length: int, index: int, parts: list[memoryview], token: bytes, where: str
) -> int:
    """A chunk's bulk reply of ``length`` bytes, its header checked, into ``parts``;
    the checksum its header gives."""
    nbytes = _length_checked(length, index, parts, where)
    crc = _header_checked(wire.exactly(HEADER.size), index, nbytes, token, where)
    for part in parts:
        wire.readinto(part)
    wire.end_of_bulk()
    return crc


def _length_checked(length: int, index: int, parts: list[memoryview], where: str) -> int:
    """The payload bytes of chunk ``index``, once its ``length`` stored bytes fit ``parts``."""
    nbytes = sum(len(p) for p in parts)
    if length != nbytes + HEADER.size:
        raise CorruptDataError(
            f"{where} chunk {index} holds {length} bytes; expected {nbytes + HEADER.size}"
        )
    return nbytes


def _header_checked(header: bytes, index: int, nbytes: int, token: bytes, where: str) -> int:
    """The checksum a chunk's header gives, once it says chunk ``index`` of ``token``,
    of ``nbytes`` payload bytes."""
    fields = HEADER.unpack(header)
    if fields[:4] != (MAGIC, token, index, nbytes):
        raise CorruptDataError(
            f"{where} chunk {index} is not the chunk the head names (foreign or stale data)"
        )
    crc: int = fields[4]
    return crc


def unpack_chunk(
    stored: bytes, token: bytes, arrays: list[np.ndarray], where: str
) -> list[np.ndarray]:
    """A version of one chunk, read already (its bytes ``stored``, see the peek script),
    into ``arrays``, checked as :func:`receive_chunks` checks each chunk it receives."""
    views = byte_views(arrays)
    nbytes = _length_checked(len(stored), 0, views, where)
    crc = _header_checked(stored[: HEADER.size], 0, nbytes, token, where)
    source, at = memoryview(stored), HEADER.size
    for view in views:
        view[:] = source[at : at + len(view)]
        at += len(view)
    _check(views, crc, where, 0)
    return arrays


def _check(parts: list[memoryview], crc: int, where: str, index: int) -> None:
    if checksum(parts) != crc:
        raise CorruptDataError(
            f"{where} chunk {index} fails its checksum: the stored bytes were changed"
        )


def command(*args: Any) -> bytes:
    """A command in RESP2, ready to send: each argument as bytes (text as UTF-8)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        value = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(value), value))
    return b"".join(parts)


class Wire:
    """RESP2 on a pooled connection's socket, for what redis-py cannot do without copying:
    send array memory as it is, and receive bulk replies straight into arrays."""

    # Replies' lines and small bulk parts; bulk parts of DIRECT bytes or more bypass it.
    # Made (and zeroed) for every push and pull: 256 KiB took 11 us of a 1 KB push's
    # 500, 64 KiB takes 3.
    _BUFFER = 64 << 10

    def __init__(self, conn: Any, deadline: float) -> None:
        self.sock: socket.socket = conn._sock  # redis-py keeps the connected socket here
        self.base_timeout = self.sock.gettimeout()
        self.deadline = deadline
        self.buffer = bytearray(self._BUFFER)
        self.view = memoryview(self.buffer)
        self.start = self.end = 0
        self.out = bytearray()

    # -- sending

    def put(self, data: Any) -> None:
        if len(data) >= DIRECT:
            self.flush()
            self._send(data)
        else:
            self.out += data
            if len(self.out) >= DIRECT:
                self.flush()

    def flush(self) -> None:
        if self.out:
            self._send(self.out)
            del self.out[:]

    def request_get(self, key: bytes) -> None:
        self.put(b"*2\r\n$3\r\nGET\r\n$%d\r\n%b\r\n" % (len(key), key))

    def _send(self, data: Any) -> None:
        try:
            self.sock.sendall(data)
        except socket.timeout:
            raise rx.TimeoutError("timed out sending to the server") from None

    # -- receiving

    def arm(self) -> None:
        """Bound the next reply by the transfer's deadline."""
        if self.deadline == math.inf:
            return
        left = remaining(self.deadline)
        if left <= 0:
            raise OutOfTime("the transfer took longer than its timeout")
        self.sock.settimeout(left if self.base_timeout is None else min(left, self.base_timeout))

    def _recv_into(self, target: memoryview) -> int:
        try:
            got = self.sock.recv_into(target)
        except socket.timeout:
            if self.deadline != math.inf and remaining(self.deadline) <= 0.01:
                raise OutOfTime("the transfer took longer than its timeout") from None
            raise rx.TimeoutError("timed out reading from the server") from None
        if got == 0:
            raise rx.ConnectionError("the server closed the connection")
        return got

    def _fill(self) -> None:
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.buffer):
            kept = bytes(self.view[self.start : self.end])
            self.view[: len(kept)] = kept
            self.start, self.end = 0, len(kept)
        self.end += self._recv_into(self.view[self.end :])

    def line(self) -> bytes:
        while True:
            at = self.buffer.find(b"\r\n", self.start, self.end)
            if at >= 0:
                text = bytes(self.view[self.start : at])
                self.start = at + 2
                return text
            if self.end - self.start >= len(self.buffer):
                raise rx.InvalidResponse("a reply line longer than 64 KiB")
            self._fill()

    def readinto(self, target: memoryview) -> None:
        size = len(target)
        done = min(size, self.end - self.start)
        target[:done] = self.view[self.start : self.start + done]
        self.start += done
        while done < size:
            if size - done >= DIRECT:
                done += self._recv_into(target[done:])
            else:
                self._fill()
                take = min(size - done, self.end - self.start)
                target[done : done + take] = self.view[self.start : self.start + take]
                self.start += take
                done += take

    def exactly(self, size: int) -> bytes:
        start = self.start
        if self.end - start >= size:  # received already: the common case of small replies
            self.start = start + size
            return bytes(self.view[start : start + size])
        out = bytearray(size)
        self.readinto(memoryview(out))
        return bytes(out)

    def end_of_bulk(self) -> None:
        if self.exactly(2) != b"\r\n":
            raise rx.InvalidResponse("a bulk reply did not end with CRLF")

    def bulk_length(self) -> int | None:
        """The length of the next bulk reply; ``None`` for a nil (missing key)."""
        line = self.line()
        if line[:1] == b"$":
            length = int(line[1:])
            return None if length < 0 else length
        raise reply_error(line)

    def reply(self) -> Any:
        """The next reply, whatever its kind: an error reply as its exception (not
        raised), a status as text, an integer, bytes or ``None``, an array as a list."""
        line = self.line()
        kind = line[:1]
        if kind == b"$":
            length = int(line[1:])
            if length < 0:
                return None
            value = self.exactly(length)
            self.end_of_bulk()
            return value
        if kind == b":":
            return int(line[1:])
        if kind == b"*":
            count = int(line[1:])
            return None if count < 0 else [self.reply() for _ in range(count)]
        if kind == b"+":
            return line[1:].decode("utf-8", "replace")
        return reply_error(line)

    def status(self, kind: bytes = b"+") -> BaseException | None:
        """The next reply: ``None`` if it is of ``kind`` (``+`` a status such as OK, ``:``
        an integer), else its error (not raised)."""
        line = self.line()
        if line[:1] == kind:
            return None
        return reply_error(line)
