"""varsync's built-in backends, registered through the same hook as any plugin."""

from __future__ import annotations

from varsync._hookspecs import Registry, hookimpl

__all__ = ["varsync_register_backends"]


@hookimpl
def varsync_register_backends(registry: Registry) -> None:
    registry.add(
        "memory",
        "varsync._backends.memory:MemoryBackend",
        description="in-process store shared by the containers of one process",
    )
    registry.add(
        "reverb",
        "varsync._backends.reverb:ReverbBackend",
        requires=["reverb", "tensorflow"],
        extra="reverb",
        description="tables of a Reverb server, interchangeable with TF-Agents' container",
    )
    schemes = {
        "redis": "tables in a Redis server, atomically versioned (redis://host:port/db)",
        "rediss": "the redis backend over TLS (rediss://host:port/db)",
    }
    for scheme in ("redis+cluster", "rediss+cluster"):
        schemes[scheme] = (
            "the redis backend on a Redis Cluster, each table on its slot's "
            f"primary ({scheme}://host:port[,host:port])"
        )
    for scheme in ("redis+sentinel", "rediss+sentinel"):
        schemes[scheme] = (
            "the redis backend, its primary and replicas found by Sentinel "
            f"({scheme}://host:port[,host:port]/service[/db])"
        )
    for scheme, description in schemes.items():
        registry.add(
            scheme,
            "varsync._backends.redis:RedisBackend",
            requires=["redis"],
            extra="redis",
            description=description,
        )
