"""The clean soak: the writer and reader loops, one backend's run, and its summary."""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
import time
from typing import Any, Callable

import numpy as np

import varsync
from varsync.testing.values import filled

from .servers import Server, rss_kib

CONTEXT = multiprocessing.get_context("spawn")
BACKENDS = ("memory", "redis", "reverb", "shm")
WARM_UP = 2.0  # seconds before the first memory reading


def nest(megabytes: float) -> Any:
    """The soaked nest: a large layer, a small one, a scalar, in mixed dtypes."""
    big = max(1, int(megabytes * 1e6 / 4))
    return {
        "policy": [varsync.Spec((big,), "float32"), varsync.Spec((256,), "float64")],
        "normaliser": {"count": varsync.Spec((), "int64"), "mean": varsync.Spec((64,), "float32")},
    }


def number_in(values: Any) -> int | None:
    """The number every element holds, or ``None`` if they differ (a torn value). Not
    ``varsync.testing.values.check_consistent``: that one sorts every leaf (np.unique), 60
    times slower on the soak's 4 MB nest, which would slow the readers it measures."""
    leaves = varsync.flatten(values)
    first = int(np.asarray(leaves[0]).reshape(-1)[0])
    for leaf in leaves:
        if not (np.asarray(leaf) == first).all():
            return None
    return first


# -- the loops ------------------------------------------------------------------------------------


def check_pull(
    outcome: dict[str, Any], version: int, values: Any, held: int, held_number: int
) -> tuple[int, int]:
    """Checks one pulled value against the one held before; the (version, number) now held."""
    number = number_in(values)
    outcome["pulls"] += 1
    if number is None:
        outcome["wrong"].append(f"version {version}: a torn value")
    elif version <= held:
        outcome["wrong"].append(f"version went from {held} to {version}")
    elif number < held_number:
        outcome["wrong"].append(f"took {number} for newer than {held_number}")
    elif number < version:
        outcome["wrong"].append(f"version {version} held the older {number}")
    elif number > version:  # Reverb: a push landed between the count and the sample
        outcome["ahead_of_label"] = outcome.get("ahead_of_label", 0) + 1
    return version, number if number is not None else held_number


def writer(
    url: str,
    options: dict[str, Any],
    signature: Any,
    ready: Any,
    go: Any,
    seconds: float,
    report: Any,
) -> None:
    outcome: dict[str, Any] = {"role": "writer", "pushes": 0, "errors": [], "wrong": []}
    try:
        with varsync.connect(url, **options) as store:
            if type(store.backend).supports_create_table:
                store.create_table("variables", signature)
            else:  # Reverb: the server has it
                store.signature()
            values = [filled(signature, n) for n in (0, 1)]  # reused: no allocation per push
            ready.put("writer")
            go.wait(600)
            start = time.monotonic()
            number = 0
            while time.monotonic() - start < seconds:
                number += 1
                buffers = values[number % 2]
                for leaf in varsync.flatten(buffers):
                    leaf[...] = number
                try:
                    version = store.push(buffers)
                except varsync.VarsyncError as exc:
                    outcome["errors"].append(f"{type(exc).__name__}: {exc}")
                    break
                if version != number:
                    outcome["wrong"].append(f"push {number} returned version {version}")
                outcome["pushes"] = number
                if "rss_start" not in outcome and time.monotonic() - start >= WARM_UP:
                    outcome["rss_start"] = rss_kib()
            outcome["rss_end"] = rss_kib()
            outcome["seconds"] = time.monotonic() - start
    except Exception as exc:  # reported
        outcome["errors"].append(f"{type(exc).__name__}: {exc}")
        ready.put("writer")
    report.put(outcome)


def reader(
    url: str,
    options: dict[str, Any],
    mode: str,
    index: int,
    ready: Any,
    go: Any,
    seconds: float,
    report: Any,
) -> None:
    outcome: dict[str, Any] = {
        "role": f"reader-{index} ({mode})",
        "pulls": 0,
        "polls": 0,
        "errors": [],
        "wrong": [],
    }
    try:
        with varsync.connect(url, **options) as store:
            store.signature()  # the writer has created the table by now
            ready.put(f"reader-{index}")
            go.wait(600)
            start = time.monotonic()
            held, held_number = 0, 0
            while time.monotonic() - start < seconds + 0.5:  # a little past the writer
                try:
                    if mode == "wait":
                        try:
                            store.wait_for(held, timeout=1.0)
                        except varsync.PullTimeoutError:
                            continue
                    got = store.pull_if_newer(held)
                except varsync.VarsyncError as exc:
                    outcome["errors"].append(f"{type(exc).__name__}: {exc}")
                    break
                if got is None:
                    outcome["polls"] += 1
                    time.sleep(0.0005)  # a poller's cadence, not synchronisation
                    continue
                held, held_number = check_pull(outcome, got[0], got[1], held, held_number)
                del got
                if "rss_start" not in outcome and time.monotonic() - start >= WARM_UP:
                    outcome["rss_start"] = rss_kib()
            outcome["rss_end"] = rss_kib()
            outcome["last_version"] = held
    except Exception as exc:  # reported
        outcome["errors"].append(f"{type(exc).__name__}: {exc}")
        ready.put(f"reader-{index}")
    report.put(outcome)


# -- one backend -----------------------------------------------------------------------------------


def soak(backend: str, seconds: float, readers: int, megabytes: float) -> dict[str, Any]:
    signature = nest(megabytes)
    server = Server(backend, signature)
    options: dict[str, Any] = {"timeout": 60}
    threads = backend == "memory"  # one process: the store is in it
    make_queue: Callable[[], Any] = queue.Queue if threads else CONTEXT.Queue
    ready, report = make_queue(), make_queue()
    go = threading.Event() if threads else CONTEXT.Event()
    runners: list[Any] = []

    def start(target: Callable[..., None], *args: Any) -> None:
        kind = threading.Thread if threads else CONTEXT.Process
        runner = kind(target=target, args=args, daemon=True)
        runner.start()
        runners.append(runner)

    outcomes: list[dict[str, Any]] = []
    try:
        start(writer, server.url, options, signature, ready, go, seconds, report)
        ready.get(timeout=300)  # the table exists before readers connect
        for index in range(readers):
            mode = "wait" if index == 0 else "poll"
            start(reader, server.url, options, mode, index, ready, go, seconds, report)
        for _ in range(readers):
            ready.get(timeout=300)
        go.set()
        time.sleep(WARM_UP)  # a fixed warm-up before the first reading of the server
        server_start = server.memory()
        deadline = time.monotonic() + seconds + 120
        while len(outcomes) < readers + 1 and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                outcomes.append(report.get(timeout=1))
        server_end = server.memory()
    finally:
        go.set()
        for runner in runners:
            runner.join(30)
            if not threads and runner.is_alive():
                runner.kill()
                runner.join(10)
        server.stop()
    return {
        "backend": backend,
        "seconds": seconds,
        "megabytes": megabytes,
        "outcomes": outcomes,
        "expected_reports": readers + 1,
        "server": server.memory_name,
        "server_kib": (server_start, server_end),
    }


def summary(result: dict[str, Any]) -> dict[str, Any]:
    outcomes = result["outcomes"]
    writers = [o for o in outcomes if o["role"] == "writer"]
    readers = [o for o in outcomes if o["role"] != "writer"]
    pushes = writers[0]["pushes"] if writers else 0

    def growth(o: dict[str, Any]) -> float:
        return (o.get("rss_end", 0) - o.get("rss_start", o.get("rss_end", 0))) / 1024

    return {
        "backend": result["backend"],
        "pushes": pushes,
        "pushes_per_s": pushes / max(result["seconds"], 1e-9),
        "pulls": sum(o["pulls"] for o in readers),
        "polls": sum(o["polls"] for o in readers),
        "readers": len(readers),
        "inconsistent": sum(len(o["wrong"]) for o in outcomes),
        "errors": sum(len(o["errors"]) for o in outcomes)
        + (result["expected_reports"] - len(outcomes)),
        "ahead_of_label": sum(o.get("ahead_of_label", 0) for o in readers),
        "caught_up": all(o.get("last_version") == pushes for o in readers),
        "writer_rss_mib": (
            writers[0].get("rss_start", 0) / 1024 if writers else 0,
            growth(writers[0]) if writers else 0,
        ),
        "reader_rss_growth_mib": max((growth(o) for o in readers), default=0.0),
        "server": result["server"],
        "server_mib": (
            result["server_kib"][0] / 1024,
            (result["server_kib"][1] - result["server_kib"][0]) / 1024,
        ),
        "problems": [p for o in outcomes for p in o["errors"] + o["wrong"]][:10],
    }
