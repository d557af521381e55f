"""Serving variables tables from an embedded Reverb server (extra ``reverb``).

    from varsync.reverb_server import serve

    with serve({"variables": {"w": np.zeros((64, 32), np.float32), "train_step": 0}}) as server:
        store = varsync.connect(server.url)          # reverb://localhost:<port>
        ...

Every table is configured the way TF-Agents' ``ReverbVariableContainer`` expects (Uniform
sampler, Fifo remover, ``MinSize(1)``, ``max_size=1``, ``max_times_sampled=0``, the
variables' specs as the signature), so TF-Agents' container can use it too.

Reverb 0.14 listens on every interface (``[::]:port``) and has no option to choose one,
and its gRPC service has no authentication: run it on a private network, behind a
firewall, or in a network namespace (``make test`` runs the tests in one whose only
interface is loopback).
"""

from __future__ import annotations

import collections.abc
import socket
from collections.abc import Mapping
from typing import Any

from varsync import ConfigurationError, SignatureError
from varsync import _nest as nest_lib
from varsync import _signature as sig

# Reverb and TensorFlow, or the error that names the extra to install.
from varsync._backends.reverb.engine import reverb, tf
from varsync._backends.reverb.tables import check_tf_nest_structure

__all__ = ["serve", "ReverbServer", "variables_table", "tensorflow_signature"]


def tensorflow_signature(signature: Any) -> Any:
    """A nest of ``tf.TensorSpec`` for a varsync signature or example nest (the form a
    Reverb table signature takes). Dict keys must be strings, as Reverb stores them."""
    specs = sig.signature_of(signature)
    check_tf_nest_structure(specs)
    if not nest_lib.flatten(specs):
        raise SignatureError(
            f"signature {specs!r} has no leaf; a Reverb item must hold data, so a "
            "variables table needs at least one array"
        )
    for path, _ in nest_lib.flatten_with_paths(specs):
        for kind, key in path:
            if kind == "key" and not isinstance(key, str):
                raise SignatureError(
                    f"dict key {key!r} at {nest_lib.format_path(path)} is not a str; "
                    "Reverb table signatures only hold str keys"
                )
    for path, spec in nest_lib.flatten_with_paths(specs):
        _tensorflow_dtype(spec, nest_lib.format_path(path))
    return nest_lib.map_structure(
        lambda spec: tf.TensorSpec(spec.shape, tf.as_dtype(spec.dtype)), specs
    )


def _tensorflow_dtype(spec: Any, where: str) -> Any:
    """The TensorFlow dtype of ``spec``'s, or ``SignatureError`` saying what to do where
    TensorFlow has none (float8_e4m3fnuz, float8_e5m2fnuz, float8_e4m3b11fnuz)."""
    try:
        return tf.as_dtype(spec.dtype)
    except TypeError:
        raise SignatureError(
            f"the leaf at {where} is {spec.dtype.name}, which TensorFlow {tf.__version__} "
            "has no dtype for, so a Reverb table signature cannot hold it (Reverb stores "
            "bfloat16, float8_e4m3fn and float8_e5m2); keep such tables in redis://, "
            "shm:// or memory://, or store the bits in a leaf of the same width "
            "(array.view(np.uint8)) and view them back after each pull"
        ) from None


def variables_table(name: str, signature: Any) -> reverb.Table:
    """A Reverb table that holds the latest value of a nest of variables."""
    return reverb.Table(
        name=name,
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        rate_limiter=reverb.rate_limiters.MinSize(1),
        max_size=1,
        max_times_sampled=0,
        signature=tensorflow_signature(signature),
    )


class ReverbServer:
    """A running Reverb server. ``url`` is what ``varsync.connect`` takes."""

    def __init__(self, server: reverb.Server, table_names: list[str]) -> None:
        self._server: reverb.Server | None = server
        self.port: int = server.port
        self.address = f"localhost:{self.port}"
        self.url = f"reverb://{self.address}"
        self.tables = table_names

    def checkpoint(self) -> str:
        """Write a checkpoint now; return its path (see ``serve(checkpoint_dir=...)``)."""
        return reverb.Client(self.address).checkpoint()

    def stop(self) -> None:
        """Stop serving. Safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    def __enter__(self) -> ReverbServer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<ReverbServer {self.url} tables={self.tables} {state}>"


def serve(
    tables: Mapping[str, Any],
    port: int = 0,
    checkpoint_dir: str | None = None,
) -> ReverbServer:
    """Start a Reverb server holding one variables table per entry of ``tables``
    (``{name: signature or example nest}``); ``port=0`` picks a free port.

    With ``checkpoint_dir``, the server restores the latest checkpoint found there at
    start and writes new ones there (``ReverbServer.checkpoint()``).
    """
    if not isinstance(tables, collections.abc.Mapping) or not tables:
        raise ConfigurationError(
            f"serve() needs a non-empty mapping {{table name: signature}}, got {tables!r}"
        )
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
        raise ConfigurationError(f"port must be an int in [0, 65535], got {port!r}")
    built = [variables_table(name, signature) for name, signature in tables.items()]
    checkpointer = None
    if checkpoint_dir is not None:
        checkpointer = reverb.checkpointers.DefaultCheckpointer(path=str(checkpoint_dir))
    server = reverb.Server(tables=built, port=port or _unserved_port(), checkpointer=checkpointer)
    _SERVED_PORTS.add(server.port)
    return ReverbServer(server, list(tables))


# Ports servers of this process listened on. ``port=0`` never picks one of them again: this
# process's TensorFlow-side Reverb clients of a stopped server are never released (Reverb
# 0.14's sample op keeps a reference; docs/reverb.md), and gRPC shares one connection per
# address among a process's clients, so a new server on an old port would be reached
# through the old, dead connection, in its reconnect backoff: a sample waited out its
# 20 s timeout that way once in a full test run.
_SERVED_PORTS: set[int] = set()


def _unserved_port() -> int:
    """A free TCP port no server of this process has listened on (Reverb binds every
    interface, IPv6 and IPv4, as this probe does where it can)."""
    family = socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
    for _ in range(100):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind(("", 0))
                port = probe.getsockname()[1]
        except OSError:  # no IPv6 here after all
            family = socket.AF_INET
            continue
        if port not in _SERVED_PORTS:
            return int(port)
    raise ConfigurationError("found no free TCP port this process has not served on")
