"""The redis backend's URL and options, parsed and checked once into :class:`Settings`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from varsync.backend import (
    ConfigurationError,
    HostPort,
    parse_bool,
    parse_host_port,
    parse_int,
    parse_timeout,
    refuse_unknown,
)

OPTIONS = (
    "db",
    "username",
    "password",
    "prefix",
    "chunk_size",
    "keep",
    "connect_timeout",
    "socket_timeout",
    "retries",
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_password",
    "ssl_cert_reqs",
    "ssl_check_hostname",
    "replicas",
    "read_from",
    "recycle_from",
    "reuse_pulled",
)
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
READ_FROM = ("primary", "replica")
SECRET_OPTIONS = ("password", "ssl_password")
CERT_REQS = ("none", "optional", "required")  # redis-py's names for ssl_cert_reqs

# Larger chunks do not pull faster (1 GB on loopback, Redis 6.2, same rounds: 16 MiB 75 %
# of raw TCP, 4 MiB 73 %); 64 MiB pulled at 34 %, the server faulting in every reply's
# buffer (glibc maps blocks above 32 MiB fresh each time). See benchmarks/redis_pull.py.
DEFAULT_CHUNK = 4 << 20
#: Pushes from this size on overwrite the spare version's chunks in place (see the claim
#: script), below it they write fresh chunks. Measured on Redis 6.2 (libc malloc), same
#: rounds: at 10 and 100 MB in-place pushes took 1.00-1.08x per-leaf SETs where fresh
#: chunks took 0.82-0.89x (SETRANGE copies each chunk once more in the server, and the
#: allocator reuses freed chunks of that size), at 400 MB and 1 GB in place was the
#: faster (1 GB: 0.60x against 0.77x; 400 MB: 0.26-0.37x against 0.39-0.64x), where
#: fresh memory is faulted in page by page.
DEFAULT_RECYCLE_FROM = 256 << 20
MIN_CHUNK = 4 << 10
MAX_CHUNK = 256 << 20  # well below Redis's 512 MB proto-max-bulk-len
MAX_KEEP = 100
MAX_RETRIES = 100


@dataclass(frozen=True)
class Settings:
    """Everything the URL and the options say, checked."""

    tls: bool
    server: HostPort
    db: int
    username: str | None
    password: str | None = field(repr=False)
    prefix: str
    chunk_size: int
    keep: int
    retries: int
    recycle_from: int
    reuse_pulled: bool
    connect_timeout: float | None
    socket_timeout: float | None
    ssl: dict[str, Any] = field(repr=False)  # redis-py's ssl_* keyword arguments
    replicas: tuple[HostPort, ...] = ()  # given with ``replicas=``
    sentinels: tuple[HostPort, ...] = ()  # of a ``redis+sentinel://`` URL
    service: str = ""  # the primary's name the sentinels monitor
    read_from: str = "primary"
    cluster: tuple[HostPort, ...] = ()  # of a ``redis+cluster://`` URL: its seed nodes

    @property
    def address(self) -> str:
        """``redis://host:port/db`` (``rediss://`` for TLS), for messages: no secrets."""
        scheme = "rediss" if self.tls else "redis"
        if self.cluster:
            return f"{scheme}+cluster://{','.join(s.address for s in self.cluster)}"
        if self.sentinels:
            hosts = ",".join(s.address for s in self.sentinels)
            return f"{scheme}+sentinel://{hosts}/{self.service}/{self.db}"
        return f"{scheme}://{self.server.address}/{self.db}"

    def described(self) -> dict[str, Any]:
        """The settings for ``describe_options``, without secrets."""
        return {
            "server": self.address,
            "username": self.username,
            "tls": self.tls,
            "prefix": self.prefix,
            "chunk_size": self.chunk_size,
            "keep": self.keep,
            "recycle_from": self.recycle_from,
            "reuse_pulled": self.reuse_pulled,
            "connect_timeout": self.connect_timeout,
            "socket_timeout": self.socket_timeout,
            "retries": self.retries,
            "read_from": self.read_from,
            "replicas": [r.address for r in self.replicas],
            "cluster": [s.address for s in self.cluster],
        }


def parse_settings(
    url: str, timeout: float | None, namespace: str, options: dict[str, Any]
) -> Settings:
    """The settings from ``url`` (with credentials; no query string) and ``options``
    (keyword arguments and the query string's). ``timeout`` is the default of
    ``connect_timeout`` and ``socket_timeout``; ``namespace`` is checked as text."""
    refuse_unknown(options, OPTIONS, "redis")
    options = dict(options)
    scheme = url.partition("://")[0].lower()
    sentinels: tuple[HostPort, ...] = ()
    cluster: tuple[HostPort, ...] = ()
    service = ""
    if scheme in CLUSTER_SCHEMES:
        credentials, hosts, path = _split_hosts(url)
        cluster = parse_addresses(hosts, "the cluster's nodes", default_port=6379)
        if path.strip("/") not in ("", "0"):
            raise ConfigurationError(
                f"the URL {scheme}://{hosts}/{path} names database {path.strip('/')!r}; "
                "a Redis Cluster has database 0 only"
            )
        url = _one_server_url(scheme, credentials, cluster[0], "")
    elif scheme in SENTINEL_SCHEMES:
        credentials, hosts, path = _split_hosts(url)
        sentinels = parse_addresses(hosts, "the sentinels", default_port=26379)
        service, _, path = path.partition("/")
        if not service:
            raise ConfigurationError(
                f"the URL {scheme}://{hosts}/ names no service; expected e.g. "
                "redis+sentinel://localhost:26379/mymaster/0 (the name of "
                "'sentinel monitor <name> ...')"
            )
        service = unquote(service)
        url = _one_server_url(scheme, credentials, sentinels[0], path)
    parts = urlsplit(url)
    tls = parts.scheme.lower() == "rediss"
    server = parse_host_port(
        url, default_host="localhost", default_port=6379, example="redis://localhost:6379/0"
    )
    replicas = parse_addresses(options.pop("replicas", ""), "replicas", default_port=6379)
    if replicas and sentinels:
        raise ConfigurationError(
            "replicas= lists replicas by address, but a redis+sentinel:// URL asks the "
            "sentinels for them; give read_from=replica instead"
        )
    read_from = options.pop("read_from", "replica" if replicas else "primary")
    if read_from not in READ_FROM:
        raise ConfigurationError(f"read_from={read_from!r} is not one of {', '.join(READ_FROM)}")
    if cluster and (replicas or read_from == "replica"):
        raise ConfigurationError(
            "a redis+cluster:// container reads from each table's primary: replicas= and "
            "read_from=replica are for one primary's replicas (redis:// or "
            "redis+sentinel://)"
        )
    if read_from == "replica" and not (replicas or sentinels):
        raise ConfigurationError(
            "read_from=replica needs replicas=host:port[,host:port...] or a redis+sentinel:// URL"
        )
    db = _database(parts.path, options.pop("db", None))
    if cluster and db != 0:
        raise ConfigurationError(f"db={db}: a Redis Cluster has database 0 only")
    username = options.pop("username", None)
    if username is None and parts.username:
        username = unquote(parts.username)
    password = options.pop("password", None)
    if password is None and parts.password is not None:
        password = unquote(parts.password)
    prefix = options.pop("prefix", "varsync")
    if not isinstance(prefix, str) or not prefix:
        raise ConfigurationError("prefix must be a non-empty string (default: varsync)")
    if cluster and ("{" in prefix or "}" in prefix):
        raise ConfigurationError(
            f"prefix {prefix!r} holds a brace; in a Redis Cluster the keys of a table share "
            "a hash tag, {table name}, that a brace in the prefix would take the place of"
        )
    chunk_size = parse_int(
        options.pop("chunk_size", DEFAULT_CHUNK),
        "chunk_size",
        minimum=MIN_CHUNK,
        maximum=MAX_CHUNK,
    )
    keep = parse_int(options.pop("keep", 1), "keep", minimum=0, maximum=MAX_KEEP)
    retries = parse_int(options.pop("retries", 0), "retries", minimum=0, maximum=MAX_RETRIES)
    recycle_from = parse_int(
        options.pop("recycle_from", DEFAULT_RECYCLE_FROM), "recycle_from", minimum=0, maximum=2**62
    )
    reuse_pulled = parse_bool(options.pop("reuse_pulled", True), "reuse_pulled")
    connect_timeout = _socket_timeout("connect_timeout", options.pop("connect_timeout", timeout))
    socket_timeout = _socket_timeout("socket_timeout", options.pop("socket_timeout", timeout))
    ssl = {k: options.pop(k) for k in list(options) if k.startswith("ssl_")}
    if ssl and not tls:
        raise ConfigurationError(
            f"TLS options {sorted(ssl)} need a rediss:// URL, not {parts.scheme}://"
        )
    if "ssl_check_hostname" in ssl:
        ssl["ssl_check_hostname"] = parse_bool(ssl["ssl_check_hostname"], "ssl_check_hostname")
    if isinstance(ssl.get("ssl_cert_reqs"), str) and ssl["ssl_cert_reqs"] not in CERT_REQS:
        raise ConfigurationError(
            f"ssl_cert_reqs={ssl['ssl_cert_reqs']!r} is not one of {', '.join(CERT_REQS)}"
        )
    _check_text(
        {
            "host": server.host,
            "username": username,
            "password": password,
            "prefix": prefix,
            "namespace": namespace,
            **ssl,
        }
    )
    return Settings(
        tls=tls,
        server=server,
        db=db,
        username=username,
        password=password,
        prefix=prefix,
        chunk_size=chunk_size,
        keep=keep,
        retries=retries,
        recycle_from=recycle_from,
        reuse_pulled=reuse_pulled,
        connect_timeout=connect_timeout,
        socket_timeout=socket_timeout,
        ssl=ssl,
        replicas=replicas,
        sentinels=sentinels,
        service=service,
        read_from=read_from,
        cluster=cluster,
    )


def _split_hosts(url: str) -> tuple[str, str, str]:
    """A many-host URL's (``redis+sentinel://``, ``redis+cluster://``) credentials, its
    ``host:port[,host:port...]`` and its path after the first ``/``."""
    netloc, _, path = url.partition("://")[2].partition("/")
    credentials, _, hosts = netloc.rpartition("@")
    return credentials, hosts, path


def _one_server_url(scheme: str, credentials: str, server: HostPort, path: str) -> str:
    """The plain ``redis://`` (``rediss://``) URL of ``server`` with the many-host URL's
    credentials and ``path``, which the rest of the parsing reads."""
    userinfo = credentials + "@" if credentials else ""
    return f"{scheme.partition('+')[0]}://{userinfo}{server.address}/{path}"


def parse_addresses(value: Any, what: str, default_port: int) -> tuple[HostPort, ...]:
    """``host:port[,host:port...]`` (or a list of such strings) as addresses."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    addresses = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigurationError(f"{what}: {item!r} is not a host:port string")
        if item.strip():
            addresses.append(
                parse_host_port(
                    f"redis://{item.strip()}",
                    default_port=default_port,
                    example=f"{what}=10.0.0.2:{default_port},10.0.0.3:{default_port}",
                )
            )
    if what == "the sentinels" and not addresses:
        raise ConfigurationError(
            "the URL names no sentinel; expected e.g. redis+sentinel://localhost:26379/mymaster/0"
        )
    if what == "the cluster's nodes" and not addresses:
        raise ConfigurationError(
            "the URL names no node of the cluster; expected e.g. "
            "redis+cluster://10.0.0.2:7000,10.0.0.3:7000 (any of its nodes)"
        )
    return tuple(addresses)


def _database(path: str, option: Any) -> int:
    from_path = path.strip("/")
    db = parse_int(from_path, "db", minimum=0) if from_path else 0
    if option is not None:
        chosen = parse_int(option, "db", minimum=0)
        if from_path and chosen != db:
            raise ConfigurationError(
                f"the URL names database {db} and the db option {chosen}; give one"
            )
        db = chosen
    return db


def _socket_timeout(name: str, value: Any) -> float | None:
    """Seconds for a socket operation; at least 0.1 (0 would make the socket
    non-blocking), ``None`` for no bound."""
    seconds = parse_timeout(value, name)
    return None if seconds is None else max(seconds, 0.1)


def _check_text(options: Mapping[str, Any]) -> None:
    """Refuse text that cannot go to the server (UTF-8, host names as IDNA), such as a
    lone surrogate from ``os.fsdecode``, before redis-py fails on it mid-call. Secrets
    are never shown."""
    for name, value in options.items():
        if not isinstance(value, str):
            continue
        try:
            value.encode("idna" if name == "host" else "utf-8")
        except UnicodeError:
            shown = "(not shown)" if name in SECRET_OPTIONS else repr(value)
            expected = "a host name or address" if name == "host" else "text encodable as UTF-8"
            raise ConfigurationError(
                f"the redis {name} {shown} is not {expected} (a lone surrogate, or a "
                f"label over 63 characters?); give the {name} as proper text"
            ) from None
