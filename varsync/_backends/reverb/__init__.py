"""``reverb://host:port``: variables in the tables of a Reverb server (extra ``reverb``).

Tables are the ones TF-Agents' ``ReverbVariableContainer`` uses: ``max_size=1``,
``max_times_sampled=0``, a ``MinSize(1)`` rate limiter and the variables' specs as the
signature. Either container reads what the other wrote.

- **Version** = the table's count of completed inserts (from ``server_info``: one small
  request, whatever the table's size). TF-Agents' pushes count too. The count restarts
  when the server restarts, so every answer names the server run it counts in, as the
  epoch of its ``Head``: Reverb has no token for a run, so the backend names each run by
  the estimated start of its table worker (:mod:`.versions`). The core compares epochs:
  a reader holding a version of another run gets ``TableResetError``, also when the new
  count reached its number again.
- **Push** goes through one long-lived trajectory writer per table: measured about twice
  as fast as a new writer per insert (``client.insert``, TF-Agents' ``TFClient.insert``);
  see ``benchmarks/``. The version returned is the insert count read right after the
  push was confirmed. Before each push the table's run and count are checked: a writer
  whose server restarted is replaced, so the push after a restart goes through.
- **Pull** checks the count first (an empty table is never sampled, so it never blocks),
  then samples the single item on a (reused) worker thread bounded by the timeout
  (:mod:`.sampling`).
- **Size**: Reverb aborts the client process when one insert request exceeds gRPC's 2 GB
  limit, so pushes above :data:`MAX_PUSH_BYTES` are refused before anything is sent.
- Reverb has no change notification (nor leaf versions, nor a reader registry: the
  backend declares no ability): the core's wait loop polls :meth:`~ReverbBackend.head`
  (growing interval, 50 ms at most).

Modules: :mod:`.engine` (the Reverb and TensorFlow imports, error translation),
:mod:`.tables` (reading a table's info), :mod:`.versions` (server runs as epochs, whose
insert was ours), :mod:`.sampling` (the worker threads), :mod:`.backend` (:class:`ReverbBackend`).
"""

from __future__ import annotations

# Importing any of them imports Reverb and TensorFlow first, or raises the
# MissingDependencyError that names the extra to install (.engine).
from varsync._backends.reverb.backend import MAX_PUSH_BYTES, ReverbBackend
from varsync._backends.reverb.tables import HOW_TO_CONFIGURE, check_table_info

__all__ = ["ReverbBackend", "MAX_PUSH_BYTES", "HOW_TO_CONFIGURE", "check_table_info"]
