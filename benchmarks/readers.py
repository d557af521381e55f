"""The stages with processes of their own: reader processes pulling one table at once, the
client-memory probes, and cold starts.

- fan-out: 1, 2, 4, 8 readers of one table on reverb://, redis:// and shm://: aggregate
  throughput, and the growth of the server's memory while they pull;
- reader memory (issue 4): redis-server's memory growth while four readers pull one
  400 MB table through varsync, beside four hand-written redis-py readers of the same bytes;
- client memory: peak resident memory above baseline during one push and one pull, in a
  fresh process per backend, as a multiple of the payload;
- cold start (issue 15.5): a new process's first ``varsync.connect(url)`` + ``pull``, per
  backend, and the heavy modules it imported (``COLD_CHILD``).

The fan-out and reader-memory stages share one set of reader processes and servers of
their own, so that what the servers held before the readers is those tables alone.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import workers
from .common import GB, MB, Sampler, allocated_bytes_under, nest_of, rss_of
from .plan import Plan, Readers
from .servers import ReverbProcess, next_message, running_redis_server, stop_children

TABLE = "variables"


@dataclass
class Pulled:
    """One contender of a readers stage: what the readers run, and the server's memory."""

    contender: str
    kind: str  # "varsync" or "redis-py" (see workers.fanout_reader)
    url: str
    table: Any  # a table name, or {key: float32 count} for redis-py
    measures: dict[str, Callable[[], int]]


def run_readers(
    plan: Plan,
    readers: Children,
    reverb: ReverbProcess,
    out: dict[str, Any],
    log: Callable[[str], None],
) -> None:
    """The fan-out, then the reader-memory comparison, on servers of their own: ``reverb``
    (started with the suite, serving table "fanout") and a new redis-server."""
    import redis

    import varsync
    import varsync_shm

    fan, mem = plan.fanout, plan.reader_memory
    shm_name = f"bench-fanout-{uuid.uuid4().hex[:6]}"
    reverb_pid, addresses = reverb.wait()
    reverb_address = addresses["fanout"]
    with contextlib.ExitStack() as stack:
        redis_server = stack.enter_context(running_redis_server())
        admin = stack.enter_context(redis.Redis.from_url(redis_server.url))
        stack.callback(varsync_shm.remove_store, shm_name)
        redis_memory = {
            "server RSS": lambda: rss_of(redis_server.pid),
            "used_memory": lambda: int(admin.info("memory")["used_memory"]),
        }
        nest = nest_of(fan.nbytes, 4)
        fanout = [
            Pulled(
                "reverb",
                "varsync",
                f"reverb://{reverb_address}",
                "fanout",
                {"server RSS": lambda: rss_of(reverb_pid)},
            ),
            Pulled("redis", "varsync", f"{redis_server.url}?namespace=fanout", TABLE, redis_memory),
            Pulled(
                "shm",
                "varsync",
                f"shm://{shm_name}",
                TABLE,
                {
                    "bytes in /dev/shm": lambda: allocated_bytes_under(
                        varsync_shm.store_path(shm_name)
                    )
                },
            ),
        ]
        for pulled in fanout:
            with varsync.connect(pulled.url, timeout=300) as store:
                if pulled.contender != "reverb":  # Reverb's tables are the server's
                    store.create_table(pulled.table, nest)
                for _ in range(3 if pulled.contender == "shm" else 1):
                    store.push(nest, pulled.table, skip_unchanged=False)
        del nest
        for pulled in fanout:
            readers.pull(pulled, fan, out["fanout"], log)
        for pulled in _reader_memory_contenders(redis_server.url, mem.nbytes, redis_memory):
            readers.pull(pulled, mem, out["reader_memory"], log)


def _reader_memory_contenders(
    url: str, nbytes: int, measures: dict[str, Callable[[], int]]
) -> list[Pulled]:
    """The same bytes through varsync and as four hand-written keys, on one server."""
    import redis

    import varsync

    nest = nest_of(nbytes, 4)
    with varsync.connect(url, namespace="readers", timeout=300) as store:
        store.create_table(TABLE, nest)
        store.push(nest)
    with redis.Redis.from_url(url, socket_timeout=300) as hand:
        for name, leaf in nest.items():
            hand.set(f"hand:readers:{name}", leaf.tobytes())
    keys = {f"hand:readers:{name}": leaf.size for name, leaf in nest.items()}
    return [
        Pulled("redis", "varsync", f"{url}?namespace=readers", TABLE, measures),
        Pulled("redis-py", "redis-py", url, keys, measures),
    ]


class Children:
    """Child processes started together with the suite (so that they start while the
    servers do, before anything is timed), each reporting "up" once ready for commands."""

    def __init__(
        self,
        what: str,
        target: Callable[..., None],
        names: list[str],
        go: bool,
        environment: dict[str, str] | None = None,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.what = what
        self.commands = [context.Queue() for _ in names]
        self.results, self.go = context.Queue(), context.Event()
        self.children: list[Any] = []
        saved = {key: os.environ.get(key) for key in environment or {}}
        os.environ.update(environment or {})  # for the children, which copy it at start
        try:
            for i, name in enumerate(names):
                args = (name, self.commands[i], self.results) + ((self.go,) if go else ())
                child = context.Process(
                    target=target, args=args, name=f"bench-{what}-{name}", daemon=True
                )
                child.start()
                self.children.append(child)
        except BaseException:
            for child in self.children:  # those already started
                child.kill()
                child.join(10)
            raise
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def wait_up(self) -> None:
        for _ in self.children:
            message = self.next(300, f"{self.what} starting")
            if "up" not in message[:2]:
                raise RuntimeError(f"{self.what}: one did not start: {message}")

    def next(self, timeout: float, what: str) -> Any:
        return next_message(self.results, self.children, timeout, what)

    def request_stop(self) -> None:
        for command in self.commands:
            command.put(None)

    def stop(self) -> None:
        self.request_stop()
        stop_children(self.children, 60)

    def pull(
        self,
        pulled: Pulled,
        readers: Readers,
        record: list[dict[str, Any]],
        log: Callable[[str], None],
    ) -> None:
        """First every reader connects and fills its arrays once, all at once (untimed);
        then for each count: that many readers fill their arrays ``pulls`` times at once
        while the server's memory is sampled; one record per count."""
        name, nbytes = pulled.contender, readers.nbytes
        self._round(pulled, max(readers.counts), 0, {})
        for count in readers.counts:
            done, samplers = self._round(pulled, count, readers.pulls, pulled.measures)
            seconds = max(d[3] for d in done) - min(d[2] for d in done)
            delivered = count * readers.pulls * nbytes
            record.append(
                {
                    "contender": name,
                    "readers": count,
                    "pulls_each": readers.pulls,
                    "bytes": nbytes,
                    "seconds": seconds,
                    "aggregate_bytes_per_s": delivered / seconds,
                    "latencies": [t for d in done for t in d[4]],
                    "server_growth": {metric: s.growth for metric, s in samplers.items()},
                    "server_baseline": {metric: s.baseline for metric, s in samplers.items()},
                }
            )
            log(
                f"   {name}, {count} reader(s) of {nbytes / MB:.3g} MB: "
                f"{delivered / seconds / GB:.2f} GB/s in all, "
                + ", ".join(f"{m} +{s.growth / MB:.1f} MB" for m, s in samplers.items())
            )

    def _round(
        self, pulled: Pulled, count: int, pulls: int, measures: dict[str, Callable[[], int]]
    ) -> tuple[list[tuple], dict[str, Sampler]]:
        """``count`` readers get ready, then pull at once while ``measures`` are sampled
        (from the moment every reader is ready); their "done" messages, the samplers."""
        self.go.clear()
        for i in range(count):
            self.commands[i].put((pulled.kind, pulled.url, pulled.table, pulls))
        for _ in range(count):
            _check(self.next(600, f"{pulled.contender} readers getting ready"), "ready")
        with contextlib.ExitStack() as stack:
            samplers = {
                metric: stack.enter_context(
                    Sampler(measure, 0.005 if metric == "used_memory" else 0.002)
                )
                for metric, measure in measures.items()
            }
            self.go.set()
            done = [
                _check(self.next(900, f"{pulled.contender} readers pulling"), "done")
                for _ in range(count)
            ]
        return done, samplers


def reader_processes(count: int) -> Children:
    """``count`` reader processes (workers.fanout_reader)."""
    return Children("readers", workers.fanout_reader, [str(i) for i in range(count)], go=True)


def _check(message: tuple, expected: str) -> tuple:
    if message[0] != expected:
        raise RuntimeError(f"reader {message[1]} failed:\n{message[2]}")
    return message


# -- client memory ------------------------------------------------------------------------


PROBES = ["memory", "reverb", "redis", "shm"]


def probe_processes() -> Children:
    """One client-memory probe per backend (workers.memory_probe). glibc raises its mmap
    threshold after each large free and then keeps freed buffers in the heap: a warm-up
    would hide the next call's allocations in the baseline. A fixed threshold returns every
    buffer over 128 KiB to the system when freed."""
    return Children(
        "probes",
        workers.memory_probe,
        PROBES,
        go=False,
        environment={"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)},
    )


def run_client_memory(
    plan: Plan,
    probes: Children,
    reverb_address: str,
    redis_url: str,
    out: dict[str, Any],
    log: Callable[[str], None],
) -> None:
    import varsync_shm

    shm_name = f"bench-probe-{uuid.uuid4().hex[:6]}"
    where = {
        "memory": ("memory://probe", TABLE),
        "reverb": (f"reverb://{reverb_address}", "probe"),
        "redis": (redis_url, TABLE),
        "shm": (f"shm://{shm_name}", TABLE),
    }
    try:
        for i, group in enumerate(PROBES):
            probes.commands[i].put((*where[group], plan.probe_bytes))
        for _ in PROBES:
            group, figures = probes.next(600, "client memory probes")
            if "error" in figures:
                raise RuntimeError(f"the {group} memory probe failed:\n{figures['error']}")
            for name, peak in figures.items():
                contender, _, op = name.rpartition(" ")
                out["client_memory"].append(
                    {
                        "contender": contender or group,
                        "op": op,
                        "bytes": plan.probe_bytes,
                        "peak_above_baseline": peak,
                    }
                )
    finally:
        varsync_shm.remove_store(shm_name)
    log(
        "   "
        + ", ".join(
            f"{m['contender']} {m['op']} {m['peak_above_baseline'] / m['bytes']:.2f}x"
            for m in out["client_memory"]
        )
    )


# -- cold start (issue 15.5) -------------------------------------------------------------------

#: Modules a backend should import only if it uses them, and what each backend uses of them.
HEAVY = ("tensorflow", "reverb", "redis", "torch", "jax")
NEEDS = {"memory": (), "reverb": ("tensorflow", "reverb"), "redis": ("redis",), "shm": ()}
COLD_TABLE = "cold"
#: What a fresh ``python -c`` runs (argv: URL, table, bytes): its clock starts just before
#: ``import varsync`` (Python's own start-up is not counted; every import varsync causes
#: is) and stops when the pull returns; it prints one JSON line. memory:// holds nothing
#: across processes: there the child creates the table and pushes first (the nest is built
#: off the clock).
COLD_CHILD = """
import json, os, sys, time
url, table, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
started = time.perf_counter()
import varsync
imported = time.perf_counter()
store = varsync.connect(url, timeout=120)
connected = time.perf_counter()
built = 0.0
if url.startswith("memory://"):
    import numpy as np
    t0 = time.perf_counter()
    nest = {f"v{i}": np.ones(nbytes // 16, np.float32) for i in range(4)}
    built = time.perf_counter() - t0
    store.create_table(table, nest)
    store.push(nest, table)
pushed = time.perf_counter()
pulled = store.pull(table)
done = time.perf_counter()
print(json.dumps({
    "seconds": done - started - built, "import": imported - started,
    "connect": connected - imported, "create + push": pushed - connected - built,
    "pull": done - pushed, "bytes": sum(leaf.nbytes for leaf in pulled.values()),
    "heavy": sorted(name for name in HEAVY if name in sys.modules)}), flush=True)
store.close()
os._exit(0)  # measured and reported: skip TensorFlow's seconds of teardown at exit
""".replace("HEAVY", repr(HEAVY))
ROOT = Path(__file__).resolve().parent.parent


def run_cold_start(
    urls: dict[str, str], nbytes: int, samples: int, out: dict[str, Any], log: Callable[[str], None]
) -> None:
    """``urls``: {backend: URL of a store whose table ``COLD_TABLE`` holds ``nbytes`` in 4
    leaves} (memory://'s is a name only: its child fills a store of its own). ``samples``
    fresh processes each, taking turns between backends; the records go to
    ``out["cold_start"]``."""
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
    for _ in range(samples):
        for name, url in urls.items():
            records[name].append(_cold_sample(url, nbytes))
    for name, got in records.items():
        median = statistics.median(r["seconds"] for r in got)
        out["cold_start"].append(
            {"backend": name, "url": urls[name].split("?")[0], "bytes": nbytes, "samples": got}
        )
        log(
            f"   cold start {name}: median {median * 1e3:.0f} ms, imported "
            f"{', '.join(got[0]['heavy']) or 'none of ' + '/'.join(HEAVY)}"
        )


def _cold_sample(url: str, nbytes: int) -> dict[str, Any]:
    if url.startswith("memory://"):  # a store of its own each time
        url = f"memory://cold-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-c", COLD_CHILD, url, COLD_TABLE, str(nbytes)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"cold start of {url} failed ({done.returncode}):\n{done.stderr[-2000:]}"
        )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
