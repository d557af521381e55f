"""``redis://`` and ``rediss://`` (and ``redis+sentinel://``, ``redis+cluster://``): tables
in a Redis server, published atomically by version.

Keys, under ``P = "{prefix}:{namespace}:"`` (namespace and table names percent-encoded;
on a Redis Cluster ``<table>`` is ``{<namespace>:<table>}``, a hash tag: :mod:`.cluster`)::

    P tables                   set: the names of the tables
    P <table>:head             hash: fmt, sig, epoch, version, data, layout, retained, spare, run,
                               leaves, segments (leaf versions and element patches,
                               :mod:`.leaves`)
    P <table>:events           stream: one entry with id "<version>-1" per publish
    P <table>:d:<token>:<i>    string: chunk i of one segment: a version's leaves, or those
                               of them a delta push wrote and its element patches
                               (24-byte header + bytes)

A push sends the arrays' bytes, back to back in flat order, as chunks of ``chunk_size``
bytes under a fresh random token: straight from the arrays' memory, pipelined, each reply
checked, each chunk with a TTL. Then one short Lua script checks that every chunk is
there at its exact length, removes their TTL, bumps the version, points the head at the
token, appends to the stream and retires versions older than the ``keep`` previous ones.
From 4 MiB on, the first version retired is kept as the table's *spare*: the next push
renames its chunks to its own token (the claim script) and overwrites them in place, which
saves the server faulting in fresh memory for every byte (most of a large push's time). A
push that fails before its publish script is sent deletes its chunks and leaves the head
on the previous complete version; once the script is sent the push never deletes anything
(the server may have published it), and a writer that dies mid-push leaves chunks that
expire.

A pull reads the head (one small request; all that ``head`` and an unchanged
``read`` cost), then that token's chunks straight into preallocated arrays, each
checked (magic, token, index, length, CRC-32). A chunk gone means newer versions retired
it: the pull starts again from the head. A wait is the core's loop; it blocks in
``XREAD BLOCK`` on the stream.

Every answer names the table's ``epoch``, a token stored in the head and minted anew
whenever the table's history restarts: the table is created again after the server lost
it, a writer finds the version below one it published (a restore of an older snapshot),
or the server restarted since the head's version was published and this writer did not
publish it (the head records the server's ``run_id``), so no number is ever reused for
another value within one epoch. The core compares epochs (a holder of a version of
another one gets :class:`~varsync.TableResetError`); this backend remembers nothing of
what a caller saw. A table whose keys vanished reads as empty (version 0, no epoch). A
writer publishing to a vanished table creates it again with its signature. What only
this backend can see it still reports: a table created again with another signature
than the caller's specs is a :class:`~varsync.TableResetError` of its own (its data is
in a layout the caller cannot decode).

The objects, each taking what it uses (:mod:`.backend`'s :class:`RedisBackend` builds
them and delegates): :class:`~.topology.Topology` (the servers: primary, replica,
Sentinel; :mod:`.cluster` for a Redis Cluster), :class:`~.router.Router` (where a read
goes, and whether a replica's answer is trusted), :class:`~.reader.Reader` (heads, pulls,
leaf versions, waits; chunks by :class:`~.fetch.Fetcher`), :class:`~.publisher.Publisher`
(creates and pushes), :class:`~.readers.ReaderRegistry`, sharing a
:class:`~.tables.Catalog` of the tables' keys and stored signatures. Below them:
:mod:`.protocol` (keys, head, the loader of the Lua scripts in ``scripts/*.lua`` and
their named replies), :mod:`.leaves` (the leaf map and segments), :mod:`.wire` (the chunk
format, its writer and reader), :mod:`.pool` (connections and requests), :mod:`.options`,
:mod:`.errors` (redis-py's exceptions mapped), :mod:`.pulled` and :mod:`.prefault` (a
pull's memory).
"""

from __future__ import annotations

from varsync._backends.redis.backend import RedisBackend

__all__ = ["RedisBackend"]
