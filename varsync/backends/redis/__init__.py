"""``redis://`` and ``rediss://`` (and ``redis+sentinel://``, ``redis+cluster://``): tables
in a Redis server, published atomically by version.

Keys, under ``P = "{prefix}:{namespace}:"`` (namespace and table names percent-encoded;
on a Redis Cluster ``<table>`` is ``{<namespace>:<table>}``, a hash tag: :mod:`.cluster`)::

    P tables                   set: the names of the tables
    P <table>:head             hash: fmt, sig, epoch, version, data, layout, retained, spare, run,
                               leaves, segments (leaf versions, :mod:`.leaves`)
    P <table>:events           stream: one entry with id "<version>-1" per publish
    P <table>:d:<token>:<i>    string: chunk i of one segment: a version's leaves, or those
                               of them a delta push wrote (24-byte header + bytes)

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

A pull reads the head (one small request; all that ``version`` and an unchanged
``pull_if_newer`` cost), then that token's chunks straight into preallocated arrays, each
checked (magic, token, index, length, CRC-32). A chunk gone means newer versions retired
it: the pull starts again from the head. A wait is the core's loop; it blocks in
``XREAD BLOCK`` on the stream.

The head's ``epoch`` changes whenever the table's history restarts: the table is created
again after the server lost it, a writer finds the version below one it published (a
restore of an older snapshot), or the server restarted since the head's version was
published and this writer did not publish it (the head records the server's ``run_id``),
so no number is ever reused for another value within one epoch. A reader that holds a
version of another epoch gets :class:`~varsync.TableResetError` (from the core's
:class:`~varsync.backend.Histories`); a table whose keys vanished reads as empty (version
0), so holders of a version get the same error and ``pull`` waits for a writer to publish
again. A writer publishing to a vanished table creates it again with its signature.

Modules: :mod:`.protocol` (keys, head, the loader of the Lua scripts in ``scripts/*.lua``
and their named replies), :mod:`.readers` (the reader registry), :mod:`.leaves`
(leaf versions: segments, the leaf map, delta pushes and pulls),
:mod:`.wire` (the chunk format, its writer and reader), :mod:`.options`, :mod:`.errors`
(redis-py's exceptions mapped), :mod:`.pool` (connections and requests),
:mod:`.topology` (reads from replicas, the primary found by Sentinel), :mod:`.cluster`
(a Redis Cluster's slot map and redirections), :mod:`.waits`
(the wait loop's look at the head and its XREAD BLOCK),
:mod:`.backend` (:class:`RedisBackend`).
"""

from __future__ import annotations

from varsync.backends.redis.backend import RedisBackend

__all__ = ["RedisBackend"]
