"""Soak: a writer and several readers per backend, for a bounded time, every pulled value
checked. Not part of ``make test``; ``make soak`` runs it (60 s per backend by default).

Per backend (memory: threads of one process; reverb, redis, shm: one process each, the
servers started and stopped here, on 127.0.0.1 under ``scripts/loopback-only``):

- the writer pushes nests whose every element holds the push's number, as fast as it
  can, and checks that push n returns version n;
- the readers (one blocked in ``wait_for``, the others polling ``pull_if_newer``) check
  every value they get: every element of every leaf the same number (no torn value),
  that number equal to the version it came with and above the one held before (no
  older value taken for newer, no value under another version's number), versions
  strictly increasing;
- memory: resident set size (VmRSS) of the writer, of each reader and of the server
  (redis-server's process, Reverb's server process; for shm, the store's bytes in
  /dev/shm), after a warm-up and at the end.

Prints one table; exits 1 if any value was inconsistent or any call failed.

    scripts/loopback-only .venv/bin/python benchmarks/soak.py --seconds 60
    .venv/bin/python benchmarks/soak.py --seconds 10 --backends memory,redis,shm
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import varsync

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

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


def filled(signature: Any, number: int) -> Any:
    return varsync.nest.map_structure(lambda s: np.full(s.shape, number, s.dtype), signature)


def number_in(values: Any) -> Optional[int]:
    """The number every element holds, or ``None`` if they differ (a torn value)."""
    leaves = varsync.flatten(values)
    first = int(np.asarray(leaves[0]).reshape(-1)[0])
    for leaf in leaves:
        if not (np.asarray(leaf) == first).all():
            return None
    return first


def rss_kib(pid: Optional[int] = None) -> int:
    """Resident set size of a process (this one by default), in KiB."""
    with open(f"/proc/{pid or 'self'}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# -- the loops ------------------------------------------------------------------------------------


def check_pull(outcome: Dict[str, Any], version: int, values: Any, held: int,
               held_number: int) -> Tuple[int, int]:
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



def writer(url: str, options: Dict[str, Any], signature: Any, ready: Any, go: Any,
           seconds: float, report: Any) -> None:
    outcome: Dict[str, Any] = {"role": "writer", "pushes": 0, "errors": [], "wrong": []}
    try:
        with varsync.connect(url, **options) as store:
            if type(store.backend).supports_create_table:
                store.create_table("variables", signature)
            else:  # Reverb: the server has it
                store.signature()
            values = [filled(signature, n) for n in (0, 1)]  # reused buffers: no allocation per push
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


def reader(url: str, options: Dict[str, Any], mode: str, index: int, ready: Any, go: Any,
           seconds: float, report: Any) -> None:
    outcome: Dict[str, Any] = {"role": f"reader-{index} ({mode})", "pulls": 0, "polls": 0,
                               "errors": [], "wrong": []}
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


# -- servers --------------------------------------------------------------------------------------


def _serve_reverb(signature: Any, ready: Any, stop: Any) -> None:
    from varsync.reverb import serve

    with serve({"variables": signature}, port=0) as server:
        ready.put(server.port)
        stop.wait(24 * 3600)


class Server:
    """What one backend runs on: a URL, a way to measure the server's memory, a stop."""

    def __init__(self, backend: str, signature: Any) -> None:
        self.backend = backend
        self.stoppers: List[Callable[[], None]] = []
        self.memory: Callable[[], int] = lambda: 0
        self.memory_name = "-"
        self.address: Optional[Tuple[str, int]] = None  # (host, port) of a server, for proxies
        self.store_path = ""  # shm: the store's directory
        if backend == "memory":
            self.url = f"memory://soak-{uuid.uuid4().hex}"
        elif backend == "shm":
            import varsync_shm

            name = f"soak-{uuid.uuid4().hex}"
            self.url = f"shm://{name}"
            path = self.store_path = varsync_shm.store_path(name)
            self.memory = lambda: _tree_kib(path)
            self.memory_name = "/dev/shm"
            self.stoppers.append(lambda: varsync_shm.remove_store(name))
        elif backend == "redis":
            from _redis_server import running_redis_server

            context = running_redis_server()
            server = context.__enter__()
            self.stoppers.append(lambda: context.__exit__(None, None, None))
            self.url = server.url
            self.address = ("127.0.0.1", server.port)
            self.memory = lambda: rss_kib(server.process.pid)
            self.memory_name = "redis-server"
        else:
            ready, stop = CONTEXT.Queue(), CONTEXT.Event()
            process = CONTEXT.Process(target=_serve_reverb, args=(signature, ready, stop), daemon=True)
            process.start()
            port = ready.get(timeout=300)
            self.url = f"reverb://localhost:{port}"
            self.address = ("127.0.0.1", port)
            self.memory = lambda: rss_kib(process.pid)
            self.memory_name = "reverb server"

            def stop_reverb() -> None:
                stop.set()
                process.join(30)
                if process.is_alive():
                    process.kill()
                    process.join(10)

            self.stoppers.append(stop_reverb)

    def stop(self) -> None:
        for stop in reversed(self.stoppers):
            stop()


def _tree_kib(path: str) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_blocks * 512
            except FileNotFoundError:
                pass
    return total // 1024


# -- one backend -----------------------------------------------------------------------------------


def soak(backend: str, seconds: float, readers: int, megabytes: float) -> Dict[str, Any]:
    signature = nest(megabytes)
    server = Server(backend, signature)
    options: Dict[str, Any] = {"timeout": 60}
    threads = backend == "memory"  # one process: the store is in it
    make_queue: Callable[[], Any] = queue.Queue if threads else CONTEXT.Queue
    ready, report = make_queue(), make_queue()
    go = threading.Event() if threads else CONTEXT.Event()
    runners: List[Any] = []

    def start(target: Callable[..., None], *args: Any) -> None:
        runner = (threading.Thread if threads else CONTEXT.Process)(target=target, args=args, daemon=True)
        runner.start()
        runners.append(runner)

    outcomes: List[Dict[str, Any]] = []
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
            try:
                outcomes.append(report.get(timeout=1))
            except queue.Empty:
                pass
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
        "backend": backend, "seconds": seconds, "megabytes": megabytes, "outcomes": outcomes,
        "expected_reports": readers + 1, "server": server.memory_name,
        "server_kib": (server_start, server_end),
    }


def summary(result: Dict[str, Any]) -> Dict[str, Any]:
    outcomes = result["outcomes"]
    writers = [o for o in outcomes if o["role"] == "writer"]
    readers = [o for o in outcomes if o["role"] != "writer"]
    pushes = writers[0]["pushes"] if writers else 0

    def growth(o: Dict[str, Any]) -> float:
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
        "writer_rss_mib": (writers[0].get("rss_start", 0) / 1024 if writers else 0,
                           growth(writers[0]) if writers else 0),
        "reader_rss_growth_mib": max((growth(o) for o in readers), default=0.0),
        "server": result["server"],
        "server_mib": (result["server_kib"][0] / 1024,
                       (result["server_kib"][1] - result["server_kib"][0]) / 1024),
        "problems": [p for o in outcomes for p in o["errors"] + o["wrong"]][:10],
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per backend (default 60)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help=f"comma-separated, from {', '.join(BACKENDS)}")
    parser.add_argument("--readers", type=int, default=3, help="reader processes (default 3)")
    parser.add_argument("--megabytes", type=float, default=4.0, help="size of the nest (default 4)")
    parser.add_argument("--faults", choices=("none", "on", "both"), default="both",
                        help="none: the clean soak; on: with interrupts and lost replies "
                        "(see benchmarks/_soak_faults.py); both (default): clean, then faulty")
    parser.add_argument("--seed", type=int, default=0, help="of the faults (default 0)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(chosen) - set(BACKENDS))
    if unknown or args.seconds <= 0 or args.readers < 1:
        parser.error(f"unknown backends {unknown}" if unknown else "--seconds > 0, --readers >= 1")
    faulty: Any = None
    if args.faults != "none":
        import _soak_faults as faulty  # imports this file as ``soak``: here, not at the top

    print(f"soak: {args.seconds:g} s per backend, 1 writer and {args.readers} readers, "
          f"{args.megabytes:g} MB nest; {os.cpu_count()} CPUs", flush=True)
    rows = []
    for backend in chosen:
        if args.faults != "on":
            print(f"  {backend} ...", flush=True)
            rows.append(summary(soak(backend, args.seconds, args.readers, args.megabytes)))
        if faulty:
            print(f"  {backend} with faults ...", flush=True)
            result = faulty.soak_with_faults(backend, args.seconds, args.readers,
                                             args.megabytes, args.seed)
            rows.append(summary(result))
            faulty.summarise(result, rows[-1])
    print()
    print("| backend | pushes | pushes/s | values pulled and checked | unchanged polls | "
          "inconsistent | errors | writer RSS (growth) | max reader RSS growth | server memory (growth) |"
          + (faulty.HEADER if faulty else ""))
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---|"
          + ("---:|---:|---:|---|---|---|" if faulty else ""))
    for r in rows:
        in_process = r["backend"] == "memory"  # writer and readers are threads of this process
        print(
            f"| {r['backend']}{' + faults' if r.get('faults') else ''} | {r['pushes']} | "
            f"{r['pushes_per_s']:.0f} | {r['pulls']} | "
            f"{r['polls']} | {r['inconsistent']} | {r['errors']} | "
            f"{r['writer_rss_mib'][0]:.0f} MiB ({r['writer_rss_mib'][1]:+.1f}) | "
            + ("(same process) | – |" if in_process else
               f"{r['reader_rss_growth_mib']:+.1f} MiB | "
               f"{r['server']}: {r['server_mib'][0]:.0f} MiB ({r['server_mib'][1]:+.1f}) |")
            + (faulty.columns(r) if faulty else "")
        )
    if faulty:
        print(f"faults: {faulty.NOTE}")
    for r in rows:
        name = r["backend"] + (" (faults)" if r.get("faults") else "")
        if not r["caught_up"]:
            print(f"{name}: a reader did not reach the last version")
        if r["ahead_of_label"]:
            print(f"{name}: {r['ahead_of_label']} pulls got a value newer than their "
                  "version number (a push landed between reading the count and sampling)")
        if r.get("faults"):
            for line in faulty.notes(r):
                print(line)
        for problem in r["problems"]:
            print(f"{name}: {problem}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    failed = any(r["inconsistent"] or r["errors"] or not r["caught_up"] or r.get("leaks")
                 for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
