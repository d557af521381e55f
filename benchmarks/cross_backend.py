"""Every varsync backend beside its baselines, in one run (issue 7); what the backend
issues set targets on (3, 4, 5) is measured in the same groups.

- the size sweep (sweep.py) from 1 KB to 1 GB, with 40 MB and 400 MB (the targets'
  sizes), plus one size above 2 GiB: ``push``, ``pull``, ``update`` into ``tf.Variable``s
  and ``pull_if_newer`` when nothing changed, for memory://, reverb://, redis:// and
  shm://, beside TF-Agents' ReverbVariableContainer on the same Reverb server,
  hand-written redis-py SET/GET on the same redis-server, and ``np.copyto`` of the same
  bytes (the physical reference);
- the same at two sizes with 500 small variables instead of 4 large ones;
- issue 15: ``pull_if_newer`` on a Reverb server holding 50 tables of 20 leaves, a new
  process's first connect + pull per backend (readers.py), and the many-variable update
  into a PyTorch module beside TF-Agents' into tf.Variables (:func:`torch_many`);
- reader processes (readers.py): fan-out to 8 readers, redis-server's memory under four
  varsync readers vs four hand-written ones, and client memory.

Run by ``benchmarks/suite.py``; the servers are started here and stopped on the way out.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .common import GB, KB, leaf_names, nest_of, signature_of, size_label, stage, summary
from .plan import Case, Plan
from .readers import (
    COLD_TABLE,
    Children,
    probe_processes,
    reader_processes,
    run_client_memory,
    run_cold_start,
    run_readers,
)
from .servers import ReverbProcess, running_redis_server
from .sweep import Sweep, poller, time_polls

RECORDS = (
    "sweep",
    "polls",
    "refusals",
    "fanout",
    "reader_memory",
    "client_memory",
    "cases",
    "skipped",
    "cold_start",
)
TABLE_BYTES = 80 * KB  # each of the many tables' nest (20 leaves of 1000 float32)
#: The Python of an environment with torch beside Reverb (torch_rounds.py); by default
#: the one ``make bench`` makes.
TORCH_PYTHON = os.environ.get("VARSYNC_BENCH_TORCH_PYTHON") or str(
    Path(__file__).resolve().parent.parent / ".venv-torch" / "bin" / "python"
)
TORCH_START_SECONDS = 300.0  # for its TensorFlow and torch imports and the warm-up
TORCH_ROUND_SECONDS = 60.0


def run(
    plan: Plan, out: dict[str, Any], log: Callable[[str], None], time_left: Callable[[], float]
) -> None:
    """Start every server and child process at once (their start-up, TensorFlow's import
    in most, overlaps), wait until all are up, then run every stage the time left allows;
    stop them all on the way out."""
    for key in RECORDS:
        out.setdefault(key, [])
    children: list[Any] = []  # ReverbProcess or Children: stopped together at the end

    def started(child: Any) -> Any:
        children.append(child)
        return child

    with contextlib.ExitStack() as stack:
        stack.callback(stop_all, children)
        tables = {
            "probe": signature_of(plan.probe_bytes, 4),
            COLD_TABLE: signature_of(plan.cold_bytes, 4),
        }
        # a server each, as a TF-Agents program's variable container has: Reverb answers
        # every table's info to each version check (issue 15.1's 50 tables measure that)
        servers = {
            case.name: {case.name: signature_of(case.nbytes, case.leaves)}
            for case in plan.cases + ([plan.big] if plan.big else [])
        }
        servers["tables"] = {
            name: signature_of(TABLE_BYTES, plan.table_leaves) for name in leaf_names(plan.tables)
        }  # issue 15.1: 50 tables
        reverb = started(ReverbProcess({"sweep": tables, **servers}))
        fanout = started(ReverbProcess({"fanout": {"fanout": signature_of(plan.fanout.nbytes, 4)}}))
        readers = started(reader_processes(max(plan.fanout.counts + plan.reader_memory.counts)))
        probes = started(probe_processes())
        redis_server = stack.enter_context(running_redis_server())
        with stage("starting servers and child processes", log, out["stage_seconds"]):
            import_clients()
            pid, addresses = reverb.wait()
            fanout.wait()
            readers.wait_up()
            probes.wait_up()
        _measure(
            plan,
            out,
            log,
            time_left,
            pid,
            addresses,
            fanout,
            readers,
            probes,
            redis_server.url,
            redis_server.pid,
        )


def stop_all(children: list[Any]) -> None:
    """Ask every child to stop, then wait for each: they stop at the same time."""
    for child in children:
        child.request_stop()
    for child in children:
        child.stop()


def import_clients() -> None:
    """What the sweep's groups import, imported while the children start."""


def _measure(
    plan: Plan,
    out: dict[str, Any],
    log: Callable[[str], None],
    time_left: Callable[[], float],
    reverb_pid: int,
    reverb: dict[str, str],
    fanout: ReverbProcess,
    readers: Children,
    probes: Children,
    redis_url: str,
    redis_pid: int | None = None,
) -> None:
    """The stages, once everything is up. ``reverb``: the sweep's Reverb servers by name
    ("sweep" with the probe's and the cold start's tables, and one per case)."""
    import redis

    with redis.Redis.from_url(redis_url) as admin:
        redis_version = admin.info("server")["redis_version"]
    out["versions"] = {
        shown: _version(name)
        for shown, name in (
            ("varsync", "varsync"),
            ("varsync-shm", "varsync-shm"),
            ("dm-reverb", "dm-reverb"),
            ("tensorflow-cpu", "tensorflow-cpu"),
            ("tf-agents", "tf-agents"),
            ("redis-py", "redis"),
            ("numpy", "numpy"),
        )
    }
    out["versions"]["redis-server"] = redis_version
    log(
        f"   Reverb servers (pid {reverb_pid}) at {', '.join(reverb.values())}; "
        f"redis-server {redis_version} at {redis_url}"
    )
    sweep = Sweep(plan, reverb, redis_url, out, log, redis_pid)
    with stage("size sweep", log, out["stage_seconds"]):
        for case in plan.cases:
            sweep.run_case(case)
    few = [case for case in plan.cases if case.layout == "few"]
    # beside the many tables: a server of one table, the smallest case's (pushed by now)
    smallest = (reverb[few[0].name], few[0].name) if few else None
    # Issue 15's two stages first: short, and its table of targets needs them.
    stages: list[tuple[str, float, Callable[[], None]]] = [
        (
            f"Reverb, {plan.tables} tables",
            20,
            lambda: many_tables(plan, reverb["tables"], out, reverb_pid, smallest),
        ),
        (
            "cold start",
            8 * plan.cold_samples,
            lambda: cold_start(plan, reverb["sweep"], redis_url, out, log),
        ),
    ]
    many = next((case for case in plan.cases if case.layout == "many"), None)
    if many is not None:
        stages.append(
            (
                "update into a PyTorch module, many variables",
                60,
                lambda: torch_many(many, reverb[many.name], out, log),
            )
        )
    big = plan.big
    if big is not None:
        stages.append(
            (f"{size_label(big.nbytes)} (above 2 GiB)", 130, lambda: big_case(sweep, big, out, log))
        )
    stages += [
        ("fan-out and reader memory", 120, lambda: run_readers(plan, readers, fanout, out, log)),
        (
            "client memory",
            45,
            lambda: run_client_memory(plan, probes, reverb["sweep"], redis_url, out, log),
        ),
    ]
    for name, needs, call in stages:
        if time_left() < needs:
            out["skipped"].append(
                f"{name}: not run, {time_left():.0f} s of the time budget "
                f"left and it needs about {needs:.0f} s"
            )
            log(f"   skipped {name} (time budget)")
            continue
        try:
            with stage(name, log, out["stage_seconds"]):
                call()
        except Exception:
            out["skipped"].append(f"{name}: failed: {traceback.format_exc().splitlines()[-1]}")
            log(f"   {name} FAILED:\n{traceback.format_exc()}")


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "?"


def available_memory() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def many_tables(
    plan: Plan,
    address: str,
    out: dict[str, Any],
    server_pid: int,
    one: tuple[str, str] | None = None,
) -> None:
    """Issue 15.1: ``pull_if_newer`` unchanged on one of the tables of a Reverb server that
    holds ``plan.tables`` of ``plan.table_leaves`` leaves each (every table pushed once);
    with the CPU each call cost the servers' process and this one, and the same beside it
    on ``one`` (address, table): a server of a single table (the sweep's smallest case)."""
    import varsync

    names = leaf_names(plan.tables)
    nest = nest_of(TABLE_BYTES, plan.table_leaves)
    with varsync.connect(f"reverb://{address}", timeout=300) as store:
        for name in names:
            store.push(nest, name)
        samples, cpu = _polls_with_cpu(poller(store, names[0]), plan.reverb_polls, server_pid)
    out["many_tables"] = {
        "tables": plan.tables,
        "leaves": plan.table_leaves,
        "table_bytes": TABLE_BYTES,
        "samples": samples,
        "cpu": cpu,
        "reply_bytes": _server_info_bytes(address),
    }
    if one is not None:
        with varsync.connect(f"reverb://{one[0]}", timeout=300) as store:
            single, cpu = _polls_with_cpu(poller(store, one[1]), plan.reverb_polls, server_pid)
        out["many_tables"]["one_table"] = {
            "samples": single,
            "cpu": cpu,
            "reply_bytes": _server_info_bytes(one[0]),
        }


def _polls_with_cpu(
    poll: Callable[[], Any], count: int, server_pid: int
) -> tuple[list[float], dict[str, float]]:
    """``time_polls``, and the CPU seconds per call of the Reverb servers' process (every
    thread) and of this one (every thread: gRPC's own included), taken around them all."""
    poll()  # the held version is read here, outside the count
    server, client = _process_cpu(server_pid), time.process_time()
    samples = time_polls(poll, count, "reverb")
    return samples, {
        "server": (_process_cpu(server_pid) - server) / count,
        "client": (time.process_time() - client) / count,
    }


def _process_cpu(pid: int) -> float:
    """CPU seconds of every thread of process ``pid`` so far (``/proc/<pid>/task/*/schedstat``,
    nanoseconds): a thread that ended meanwhile is missed, none does in a server."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the listing and the read
    return total / 1e9


def _server_info_bytes(address: str) -> int:
    """The size of a Reverb server's ServerInfo reply, its table infos serialized (what
    varsync's version check asks for; Reverb has no request for one table's)."""
    import reverb

    return sum(len(blob) for blob in reverb.Client(address)._client.ServerInfo(0))


def cold_start(
    plan: Plan, reverb: str, redis_url: str, out: dict[str, Any], log: Callable[[str], None]
) -> None:
    """Issue 15.5: fill a table of ``plan.cold_bytes`` on each backend that keeps it across
    processes, then time fresh processes' first connect + pull of it (readers.py)."""
    import varsync
    import varsync_shm

    tag = uuid.uuid4().hex[:6]
    urls = {
        "memory": "memory://cold",
        "reverb": f"reverb://{reverb}",
        "redis": f"{redis_url}?namespace=bench-cold-{tag}",
        "shm": f"shm://bench-cold-{tag}",
    }
    nest = nest_of(plan.cold_bytes, 4)
    try:
        for name in ("reverb", "redis", "shm"):
            with varsync.connect(urls[name], timeout=300) as store:
                if name != "reverb":  # Reverb's tables are the server's
                    store.create_table(COLD_TABLE, nest)
                store.push(nest, COLD_TABLE)
        del nest
        run_cold_start(urls, plan.cold_bytes, plan.cold_samples, out, log)
    finally:
        varsync_shm.remove_store(f"bench-cold-{tag}")


def torch_many(case: Case, address: str, out: dict[str, Any], log: Callable[[str], None]) -> None:
    """Issue 15.2 for PyTorch modules: round by round, TF-Agents' ``update`` of ``case``'s
    table into tf.Variables here, then varsync's ``update`` of it into a PyTorch module in
    a torch_rounds.py process (:data:`TORCH_PYTHON`: no environment holds both TF-Agents
    and torch), from the same Reverb server and from a memory:// store of that process.
    Recorded as skipped, with the reason, where that environment is missing."""
    import tensorflow as tf
    from tf_agents.experimental.distributed.reverb_variable_container import (
        ReverbVariableContainer,
    )

    import varsync

    if not os.access(TORCH_PYTHON, os.X_OK):
        # not a failed stage: an environment this machine was not given (make test's)
        out.setdefault("unavailable", {})["torch_many"] = (
            f"the update into a PyTorch module (15.2), as {TORCH_PYTHON} is missing: "
            "`make bench` makes it (TensorFlow, dm-reverb and torch, without TF-Agents)"
        )
        return
    nest = nest_of(case.nbytes, case.leaves)
    with varsync.connect(f"reverb://{address}", timeout=300) as store:
        store.push(nest, case.name)  # the values torch_rounds.py checks its module against
    tfa = ReverbVariableContainer(address, table_names=(case.name,))
    variables = {name: tf.Variable(np.zeros_like(value)) for name, value in nest.items()}
    child = subprocess.Popen(
        [
            TORCH_PYTHON,
            "-m",
            "benchmarks.torch_rounds",
            address,
            case.name,
            str(case.nbytes),
            str(case.leaves),
        ],
        cwd=Path(__file__).resolve().parent.parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        ready = _answer(child, TORCH_START_SECONDS)["ready"]
        for _ in range(3):
            tfa.update(variables, case.name)
        if any(not np.array_equal(variables[name].numpy(), nest[name]) for name in nest):
            raise AssertionError("TF-Agents' update did not assign the table's values")
        samples: dict[str, list[float]] = {"tf-agents": [], "reverb": [], "memory": []}
        for _ in range(3 * case.rounds):  # short rounds: three times the sweep's
            started = time.perf_counter()
            tfa.update(variables, case.name)
            samples["tf-agents"].append(time.perf_counter() - started)
            _tell(child, b"go")
            for name, seconds in _answer(child, TORCH_ROUND_SECONDS).items():
                samples[name].append(seconds)
        _tell(child, b"end")
        checked = _answer(child, TORCH_ROUND_SECONDS)["end"]
    finally:
        with contextlib.suppress(OSError):
            _tell(child, b"")  # the end of its stdin: it stops (if it has not)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    out["torch_many"] = {
        "case": case.name,
        "nbytes": case.nbytes,
        "leaves": case.leaves,
        "versions": ready,
        "checked": checked,
        "samples": samples,
    }
    log(
        f"   PyTorch update of {case.leaves} variables, {size_label(case.nbytes)}: "
        + ", ".join(
            f"{name} {1e3 * summary(times)['median']:.1f} ms" for name, times in samples.items()
        )
    )


def _tell(child: Any, word: bytes) -> None:
    """Send torch_rounds.py one command line; ``b""`` closes its stdin."""
    if not word:
        child.stdin.close()
        return
    child.stdin.write(word + b"\n")
    child.stdin.flush()


def _answer(child: Any, seconds: float) -> dict[str, Any]:
    """torch_rounds.py's next message, within ``seconds``; its error raised here."""
    deadline = time.monotonic() + seconds
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([child.stdout], [], [], left)[0]:
            raise TimeoutError(f"torch_rounds.py said nothing for {seconds:.0f} s")
        more = os.read(child.stdout.fileno(), 1 << 16)
        if not more:
            raise RuntimeError(f"torch_rounds.py ended (exit {child.wait()}) mid-run")
        line += more
    message: dict[str, Any] = json.loads(line)
    if "error" in message:
        raise RuntimeError(f"torch_rounds.py failed:\n{message['error']}")
    return message


def big_case(sweep: Sweep, case: Case, out: dict[str, Any], log: Callable[[str], None]) -> None:
    # Client: the nest, the copy target and one pulled value; redis-server: up to three
    # versions (the current one, `keep=1` previous, the one being pushed).
    needed = 6.5 * case.nbytes
    if available_memory() < needed:
        out["skipped"].append(
            f"{size_label(case.nbytes)}: not run, "
            f"{available_memory() / GB:.1f} GB of memory available and it "
            f"needs about {needed / GB:.0f} GB"
        )
        log("   skipped the run above 2 GiB (memory)")
        return
    sweep.run_case(case)
