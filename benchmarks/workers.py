"""Code that runs in the suite's child processes (started with ``spawn``): the Reverb
server, the fan-out readers and the client-memory probes.

Every loop here is bounded: a child that hears nothing for ``IDLE_LIMIT`` seconds exits.
"""

from __future__ import annotations

import queue
import time
import traceback
from typing import Any, Dict, Tuple

import numpy as np

from common import MB, memory_status, nest_of, peak_above_baseline, reset_peak_rss  # noqa: F401

IDLE_LIMIT = 900.0  # seconds a child waits for its next command before giving up


# -- the Reverb server ------------------------------------------------------------------------


def serve_reverb(signatures: Dict[str, Dict[str, Tuple[tuple, str]]], ready: Any, stop: Any) -> None:
    """Serve one variables table per entry of ``signatures`` until ``stop`` is set (or an
    hour has passed); put the port on ``ready``."""
    import varsync
    from varsync.reverb import serve

    tables = {name: {leaf: varsync.Spec(shape, dtype) for leaf, (shape, dtype) in sig.items()}
              for name, sig in signatures.items()}
    try:
        with serve(tables) as server:
            ready.put(("port", server.port))
            stop.wait(3600)
    except BaseException:
        ready.put(("error", traceback.format_exc()))
        raise


# -- fan-out readers ---------------------------------------------------------------------------


def fanout_reader(index: int, commands: Any, results: Any, go: Any) -> None:
    """A reader process: for each ``("pull", url, table, pulls)`` command, connect (once per
    URL), pull once untimed, report ready, wait for ``go``, then ``update`` its own numpy
    arrays ``pulls`` times and report the times. ``None`` ends it."""
    import varsync

    stores: Dict[str, Any] = {}
    targets: Dict[Tuple[str, str], Any] = {}
    try:
        while True:
            try:
                command = commands.get(timeout=IDLE_LIMIT)
            except queue.Empty:
                return
            if command is None:
                return
            _, url, table, pulls = command
            try:
                store = stores.get(url)
                if store is None:
                    store = stores[url] = varsync.connect(url, timeout=300)
                key = (url, table)
                if key not in targets:
                    signature = store.signature(table)
                    targets[key] = {name: np.empty(spec.shape, spec.dtype) for name, spec in signature.items()}
                mine = targets[key]
                store.update(mine, table)  # warm: connection, mappings, page faults of `mine`
                results.put(("ready", index))
                if not go.wait(600):
                    results.put(("error", index, "no go signal within 600 s"))
                    continue
                started = time.monotonic()
                times = []
                for _ in range(pulls):
                    t0 = time.perf_counter()
                    store.update(mine, table)
                    times.append(time.perf_counter() - t0)
                results.put(("done", index, started, time.monotonic(), times))
            except Exception:  # noqa: BLE001 - reported to the parent
                results.put(("error", index, traceback.format_exc()))
    finally:
        for store in stores.values():
            store.close()


# -- client memory -------------------------------------------------------------------------------


def memory_probe(group: str, url: str, table: str, nbytes: int, results: Any) -> None:
    """Peak resident memory above baseline during one push and one pull (result kept), in a
    fresh process, for a group's varsync backend and its hand-written baseline."""
    try:
        results.put((group, _probe(group, url, table, nbytes)))
    except Exception:  # noqa: BLE001 - reported to the parent
        results.put((group, {"error": traceback.format_exc()}))


def _probe(group: str, url: str, table: str, nbytes: int) -> Dict[str, int]:
    import varsync

    nest = nest_of(nbytes, 4)
    out: Dict[str, int] = {}
    options = {"namespace": "probe"} if group == "redis" else {}
    with varsync.connect(url, timeout=300, **options) as store:
        if group != "reverb":
            store.create_table(table, nest)
        for _ in range(3 if group == "shm" else 1):  # warm: writers, segments, connections
            store.push(nest, table)
        store.pull(table)
        out["push"] = peak_above_baseline(lambda: store.push(nest, table))
        out["pull"] = peak_above_baseline(lambda: store.pull(table))

    if group == "reverb":
        import tensorflow as tf
        from tf_agents.experimental.distributed.reverb_variable_container import (
            ReverbVariableContainer,
        )

        address = url[len("reverb://"):]
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
            lambda: {n: np.frombuffer(hand.get(k), np.float32) for n, k in keys.items()})
        hand.delete(*keys.values())
        hand.close()
    return out
