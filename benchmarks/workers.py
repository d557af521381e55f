"""Code that runs in the suite's child processes (started with ``spawn``): the Reverb
servers, the fan-out readers and the client-memory probes.

Every loop here is bounded: a child that hears nothing for ``IDLE_LIMIT`` seconds exits.
"""

from __future__ import annotations

import contextlib
import queue
import time
import traceback
from typing import Any, Callable, cast

import numpy as np

from .common import nest_of, peak_above_baseline

IDLE_LIMIT = 3600.0  # seconds a child waits for its next command before giving up


# -- the Reverb server ------------------------------------------------------------------------


def serve_reverb(
    servers: dict[str, dict[str, Any]], ready: Any, stop: Any, lifetime: float
) -> None:
    """Run one Reverb server per entry of ``servers`` (each on a port of its own, serving
    one table per entry of its ``{table: nest of varsync.Spec}``) until ``stop`` is set, or
    ``lifetime`` seconds have passed (an orphan's end); put ``("ports", {name: port})`` on
    ``ready``."""
    from varsync.reverb import serve

    try:
        with contextlib.ExitStack() as stack:
            ports = {
                name: stack.enter_context(serve(tables)).port for name, tables in servers.items()
            }
            ready.put(("ports", ports))
            stop.wait(lifetime)
    except BaseException:
        ready.put(("error", traceback.format_exc()))
        raise


# -- fan-out readers ---------------------------------------------------------------------------


def fanout_reader(name: str, commands: Any, results: Any, go: Any) -> None:
    """A reader process. For each ``(kind, url, table, pulls)`` command: connect (once per
    URL), fill its own numpy arrays once untimed, report ready, wait for ``go``, then fill
    them ``pulls`` times and report the times. ``kind`` "varsync": ``update`` from the
    container at ``url``; "redis-py": ``table`` is ``{key: float32 count}``, each array
    filled from ``GET key`` as a hand-written reader would. ``None`` ends it. Reports
    ``("up", name)`` first, so that the suite can start every child before measuring."""
    clients: dict[str, Any] = {}
    results.put(("up", name))
    try:
        while True:
            try:
                command = commands.get(timeout=IDLE_LIMIT)
            except queue.Empty:
                return
            if command is None:
                return
            kind, url, table, pulls = command
            try:
                if url not in clients:
                    clients[url] = _connect(kind, url)
                fill, _ = _filler(kind, clients[url], table)
                fill()  # warm: connection, mappings, page faults of the arrays
                results.put(("ready", name))
                if not go.wait(600):
                    results.put(("error", name, "no go signal within 600 s"))
                    continue
                started = time.monotonic()
                times = []
                for _ in range(pulls):
                    t0 = time.perf_counter()
                    fill()
                    times.append(time.perf_counter() - t0)
                results.put(("done", name, started, time.monotonic(), times))
                del fill  # its arrays: a reader holds one command's at a time
            except Exception:
                results.put(("error", name, traceback.format_exc()))
    finally:
        for client in clients.values():
            client.close()


def _connect(kind: str, url: str) -> Any:
    if kind == "redis-py":
        import redis

        return redis.Redis.from_url(url, socket_timeout=300)
    import varsync

    return varsync.connect(url, timeout=300)


def _filler(kind: str, client: Any, table: Any) -> tuple[Callable[[], Any], dict[str, Any]]:
    """A call that fills this reader's own arrays with the table's current values, and
    those arrays."""
    if kind == "redis-py":
        arrays = {key: np.empty(count, np.float32) for key, count in table.items()}

        def hand_fill() -> None:
            for key, array in arrays.items():
                np.copyto(array, np.frombuffer(client.get(key), np.float32))

        return hand_fill, arrays
    signature = client.signature(table)
    mine = {name: np.empty(spec.shape, spec.dtype) for name, spec in signature.items()}
    # Every leaf, every time: the table does not change between the fills, so a delta
    # update (the default) would fetch nothing after the first and move no bytes.
    return (lambda: client.update(mine, table, delta_only=False)), mine


# -- client memory -------------------------------------------------------------------------------


def memory_probe(group: str, commands: Any, results: Any) -> None:
    """Peak resident memory above baseline during one push and one pull (result kept), in a
    fresh process, for a group's varsync backend and its hand-written baseline. Imports
    what the group needs, reports ``(group, "up")``, then measures on the one command
    ``(url, table, nbytes)`` (``None``: nothing to do)."""
    try:
        if group == "reverb":
            pass
        results.put((group, "up"))
        command = commands.get(timeout=IDLE_LIMIT)
        if command is not None:
            results.put((group, _probe(group, *command)))
    except Exception:
        results.put((group, {"error": traceback.format_exc()}))


def _probe(group: str, url: str, table: str, nbytes: int) -> dict[str, int]:
    import varsync

    nest = nest_of(nbytes, 4)
    out: dict[str, int] = {}
    options = {"namespace": "probe"} if group == "redis" else {}
    with varsync.connect(url, timeout=300, **options) as store:
        if group != "reverb":
            store.create_table(table, nest)
        for _ in range(3 if group == "shm" else 1):  # warm: writers, segments, connections
            store.push(nest, table)
        # Held while the measured pull runs, as a loop of `params = pull()` holds the last
        # pull: redis:// would otherwise pull into that pull's memory (reuse_pulled) and
        # show no growth at all.
        held = store.pull(table)
        out["push"] = peak_above_baseline(lambda: store.push(nest, table))
        out["pull"] = peak_above_baseline(lambda: store.pull(table))
        del held

    if group == "reverb":
        import tensorflow as tf
        from tf_agents.experimental.distributed.reverb_variable_container import (
            ReverbVariableContainer,
        )

        address = url[len("reverb://") :]
        tfa = ReverbVariableContainer(address, table_names=(table,))
        variables = {name: tf.Variable(leaf) for name, leaf in nest.items()}
        tfa.push(variables, table)
        tfa.pull(table)
        out["tf-agents push"] = peak_above_baseline(lambda: tfa.push(variables, table))
        out["tf-agents pull"] = peak_above_baseline(lambda: tfa.pull(table))
    elif group == "redis":
        import redis

        hand = redis.Redis.from_url(url)
        keys = {name: f"probe:hand:{name}" for name in nest}

        def hand_push() -> None:
            for name, leaf in nest.items():
                hand.set(keys[name], leaf.tobytes())

        hand_push()
        out["redis-py push"] = peak_above_baseline(hand_push)
        out["redis-py pull"] = peak_above_baseline(
            lambda: {
                n: np.frombuffer(cast(bytes, hand.get(k)), np.float32) for n, k in keys.items()
            }
        )
        hand.delete(*keys.values())
        hand.close()
    return out
