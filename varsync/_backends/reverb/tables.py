"""What varsync reads from a Reverb table's info (``schema_pb2.TableInfo``): whether the
table can hold variables, its version and insert count, and its worker's age."""

from __future__ import annotations

from typing import Any

from varsync import MissingSignatureError, SignatureError
from varsync import _nest as nest_lib
from varsync._backends.reverb.engine import tf
from varsync.backend import TableConfigurationError

__all__ = [
    "HOW_TO_CONFIGURE",
    "check_tf_nest_structure",
    "check_table_info",
    "insert_count",
    "version_of",
    "age_seconds",
    "LABEL_FRACTION",
    "label_of",
    "labelled_version",
]

HOW_TO_CONFIGURE = (
    "varsync.reverb_server.serve({name: signature}) builds such a server; by hand: "
    "reverb.Table(name, sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(), "
    "rate_limiter=reverb.rate_limiters.MinSize(1), max_size=1, max_times_sampled=0, "
    "signature=<nest of tf.TensorSpec>)"
)


def check_tf_nest_structure(signature: Any, path: nest_lib.Path = ()) -> None:
    """Raise ``SignatureError`` if ``signature`` holds a node ``tf.nest`` cannot keep: an
    ordered mapping (a PyTorch ``state_dict``, a JAX ``OrderedDict``), whose order
    ``tf.nest`` would replace by sorted keys, or an empty node (JAX's ``None``), which
    ``tf.nest`` takes for a leaf. A Reverb table signature is a ``tf.nest`` structure."""
    where = nest_lib.format_path(path)
    if isinstance(signature, nest_lib.Ordered):
        raise SignatureError(
            f"the mapping at {where} keeps its own key order (a PyTorch state_dict or an "
            "OrderedDict of JAX arrays), and a Reverb table signature is a tf.nest "
            "structure, which sorts every mapping's keys; serve a plain dict there "
            "(dict(model.state_dict())), or use redis:// or shm://, which keep the order"
        )
    if signature is nest_lib.EMPTY:
        raise SignatureError(
            f"the node at {where} is None in a JAX pytree (a node without leaves), which a "
            "Reverb table signature (a tf.nest structure) cannot hold; drop it, or use "
            "redis:// or shm://"
        )
    if nest_lib.is_nested(signature):
        for entry, child in nest_lib.children(signature):
            check_tf_nest_structure(child, path + (entry,))


def check_table_info(name: str, info: Any, address: str, signature: Any) -> None:
    """Raise if the server's table (``info``, a ``schema_pb2.TableInfo``; ``signature``,
    its decoded signature or ``None``) cannot hold variables the way TF-Agents' do."""
    where = f"Reverb table {name!r} at {address}"
    if info.max_size != 1:
        raise TableConfigurationError(
            f"{where} has max_size={info.max_size}; a variables table holds exactly the "
            f"latest value, so max_size must be 1. {HOW_TO_CONFIGURE}"
        )
    if info.max_times_sampled != 0:
        raise TableConfigurationError(
            f"{where} has max_times_sampled={info.max_times_sampled}; items would vanish "
            f"after being pulled, so it must be 0 (unlimited). {HOW_TO_CONFIGURE}"
        )
    limiter = info.rate_limiter_info
    if limiter.min_size_to_sample != 1 or limiter.max_diff < 1e300:
        raise TableConfigurationError(
            f"{where} has a rate limiter that can block pulls (min_size_to_sample="
            f"{limiter.min_size_to_sample}, max_diff={limiter.max_diff}); use MinSize(1). "
            f"{HOW_TO_CONFIGURE}"
        )
    if signature is None or not tf.nest.flatten(signature):
        raise MissingSignatureError(
            f"{where} has no signature (or one without leaves); varsync (like TF-Agents) "
            f"needs the variables' specs as the table signature. {HOW_TO_CONFIGURE}"
        )


def insert_count(info: Any) -> int:
    """The table's count of completed inserts since the server started (or was restored)."""
    return int(info.rate_limiter_info.insert_stats.completed)


def version_of(info: Any) -> int:
    """The table's version: its insert count; an empty table is version 0 whatever the
    count says (a reset() clears both)."""
    return insert_count(info) if info.current_size > 0 else 0


#: What a varsync push adds to the version it expects, as the item's priority: TF-Agents
#: writes 1.0, and with ``max_size=1`` the sampler never looks at priorities, so an item
#: whose priority has this fraction was labelled by a varsync writer.
LABEL_FRACTION = 0.25


def label_of(version: int) -> float:
    """The priority of a push that expects to be ``version`` (exact in a float64 up to
    2**51 versions)."""
    return version + LABEL_FRACTION


def labelled_version(priority: float) -> int:
    """The version a sampled item's priority says its writer expected, or -1 for an
    item no varsync writer labelled (TF-Agents', another writer's).

    A writer expects the count it read before pushing, plus one. Its insert lands at that
    count or later (later only when another writer pushed in between: both are then
    told ``ConcurrentPushError``), never earlier: so a label equal to the count read
    before the sample (at most the sampled insert's number) names that insert exactly,
    but for a raced push, which may be a newer value under the older number, as
    docs/guarantees.md allows."""
    whole = int(priority)
    return whole if priority - whole == LABEL_FRACTION and whole > 0 else -1


def age_seconds(info: Any) -> float:
    """How long the table's worker has run, in seconds (to whole milliseconds)."""
    worker = info.table_worker_time
    busy_and_idle = (  # every state the worker can be in, so the sum is its age
        worker.running_ms
        + worker.sleeping_ms
        + worker.sampling_ms
        + worker.inserting_ms
        + worker.waiting_for_sampling_ms
        + worker.waiting_for_inserts_ms
    )
    return busy_and_idle / 1000.0
