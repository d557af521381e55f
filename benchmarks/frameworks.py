"""The frameworks group: PyTorch and JAX values through varsync beside what
their users write without it, each pair taking turns in the same rounds.

The workload is a policy of ``tensors`` tensors (``tensors // 2`` square ``nn.Linear``
layers, weight and bias), ``nbytes`` in all (100 MB in ``make bench``: 25 layers of
1000 x 1000), and for JAX a pytree of the same arrays (``{"layer00": {"kernel", "bias"}}``).

- ``torch shm``: a learner container pushes the module once per round (untimed); the actor's
  ``store.update(model)`` of that new version against ``model.load_state_dict(copy)``, where
  ``copy`` is an in-memory state_dict (the floor of any update); ``pull(like=model)`` too.
- ``torch redis``: what people write by hand, ``torch.save`` to a BytesIO + one Redis SET
  (push), GET + ``torch.load`` + ``load_state_dict`` (pull; this path unpickles, with
  ``weights_only=True``, torch's default since 2.6) against varsync's ``push(module)`` and
  ``update(module)``, on the same redis-server.
- ``torchrl``: TorchRL's own ``SharedMemWeightSyncScheme`` and
  ``MultiProcessWeightSyncScheme`` against varsync's ``VarsyncWeightSyncScheme`` over shm://,
  unconfirmed and confirmed, the sender side here, the receivers in one spawned worker
  process (:func:`torchrl`): from ``send`` until the worker's policy holds the new weights.
  Skipped, with the reason, where torchrl does not import.
- ``jax shm``: the learner pushes the tree once per round (untimed); the actor's
  ``store.pull(like=tree)`` against ``jax.device_put`` of the same tree of numpy arrays, both
  until ``jax.block_until_ready``.

The learner and the actor are two containers in this process (but for ``torchrl``). Each
part runs where its framework imports and is recorded as skipped, with the reason, where it
does not: the TF environment (.venv) has neither torch nor jax, the modern one (NumPy 2)
has both.
"""

from __future__ import annotations

import gc
import io
import math
import os
import time
import uuid
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from typing import Any, Callable, cast

from .harness import MB, Group, Op, machine, run_group, size_label
from .servers import next_message, stop_children

TABLE = "variables"


@dataclass
class Frameworks:
    """A policy of ``tensors`` float32 tensors, ``nbytes`` in all; ``rounds`` timed rounds
    after ``warm`` untimed ones."""

    nbytes: int = 100 * MB
    tensors: int = 50
    rounds: int = 15
    warm: int = 2


Samples = dict[tuple[str, str], list[float]]


def unavailable() -> str | None:
    """Why the group cannot run here at all (neither framework imports), else None."""
    reasons = [r for r in (_import_problem("torch"), _import_problem("jax")) if r]
    return "; ".join(reasons) if len(reasons) == 2 else None


def _import_problem(*modules: str) -> str | None:
    for module in modules:
        try:
            __import__(module)
        except Exception as exc:
            return f"{module} does not import ({type(exc).__name__}: {exc})"
    return None


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "?"


def run(
    plan: Frameworks, out: dict[str, Any], log: Callable[[str], None], redis_url: Callable[[], str]
) -> None:
    """Every part the frameworks here allow, into ``out``; ``redis_url`` starts the
    redis-server on first use (the caller stops it)."""
    names = ("varsync", "varsync-shm", "torch", "torchrl", "jax", "jaxlib", "redis", "numpy")
    out.update(machine=machine(), plan=asdict(plan), records=[], skipped={})
    out["versions"] = {name: _version(name) for name in names}
    parts: list[tuple[str, tuple[str, ...], Callable[[], Samples]]] = [
        ("torch shm", ("torch", "varsync_shm"), lambda: torch_shm(plan)),
        ("torch shm, 1 thread", ("torch", "varsync_shm"), lambda: torch_shm(plan, threads=1)),
        ("torch redis", ("torch", "redis"), lambda: torch_redis(plan, redis_url())),
        ("torchrl", ("torch", "torchrl", "varsync_shm"), lambda: torchrl(plan)),
        ("jax shm", ("jax", "varsync_shm"), lambda: jax_shm(plan)),
    ]
    for part, modules, call in parts:
        reason = _import_problem(*modules)
        if reason:
            out["skipped"][part] = reason
            log(f"   {part}: skipped: {reason}")
            continue
        started = time.monotonic()
        for (contender, op), values in call().items():
            record = {"part": part, "contender": contender, "op": op, "samples": values}
            out["records"].append(record)
        log(f"   {part}: {size_label(plan.nbytes)}: {time.monotonic() - started:.0f} s")
        gc.collect()
    out["load_average_after"] = os.getloadavg()


def in_rounds(turns: list[list[Op]], plan: Frameworks, before: Callable[[], Any]) -> Samples:
    """The harness's rounds, with ``before`` (untimed: the learner's push of a new
    version) at the start of each."""
    ops = [op for turn in turns for op in turn]
    return run_group(Group("frameworks", ops, warm=plan.warm, before=before), plan.rounds)


# -- the workload -----------------------------------------------------------------------


def layer_width(plan: Frameworks) -> int:
    """The width of the square layers whose weights and biases make ``plan.nbytes``."""
    layers = max(1, plan.tensors // 2)
    floats = plan.nbytes / 4 / layers  # width**2 + width per layer
    return max(1, int((-1 + math.sqrt(1 + 4 * floats)) / 2))


def policy(plan: Frameworks, seed: int) -> Any:
    """An ``nn.Sequential`` of ``tensors // 2`` square Linear layers, float32, on the CPU."""
    import torch

    torch.manual_seed(seed)
    width = layer_width(plan)
    with torch.no_grad():
        return torch.nn.Sequential(
            *[torch.nn.Linear(width, width) for _ in range(max(1, plan.tensors // 2))]
        )


def _same(a: Any, b: Any) -> None:
    import torch

    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        if not torch.equal(x, y):
            raise RuntimeError(f"the actor's {name} differs from the learner's after the rounds")


def torch_shm(plan: Frameworks, threads: int | None = None) -> Samples:
    """``threads``: torch's intra-op threads for this part (default: torch's own choice,
    one per core); ``load_state_dict``'s ``copy_`` splits large tensors over them, which on
    a loaded machine waits for descheduled threads."""
    import torch

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _torch_shm(plan)
    finally:
        torch.set_num_threads(previous)


def _torch_shm(plan: Frameworks) -> Samples:
    import varsync
    import varsync_shm

    learner, actor = policy(plan, 0), policy(plan, 1)
    copy = {k: v.clone() for k, v in learner.state_dict().items()}  # the in-memory copy
    name = f"bench-torch-{uuid.uuid4().hex[:6]}"
    pusher = varsync.connect(f"shm://{name}")
    reader = varsync.connect(f"shm://{name}")
    try:
        pusher.create_table(TABLE, learner)
        turns: list[list[Op]] = [
            [("varsync shm://", "update(module)", lambda: reader.update(actor, delta_only=False))],
            [("torch", "load_state_dict(copy)", lambda: actor.load_state_dict(copy))],
            [("varsync shm://", "pull(like=module)", lambda: reader.pull(like=actor))],
        ]
        # whole pushes and updates: the same module is pushed every round (what moving only
        # the changed leaves saves is the delta group's)
        samples = in_rounds(turns, plan, lambda: pusher.push(learner, skip_unchanged=False))
        reader.update(actor)
        _same(learner, actor)
        return samples
    finally:
        reader.close()
        pusher.close()
        varsync_shm.remove_store(name)


def torch_redis(plan: Frameworks, url: str) -> Samples:
    import redis
    import torch

    import varsync

    learner, actor = policy(plan, 0), policy(plan, 1)
    namespace = f"bench-torch-{uuid.uuid4().hex[:6]}"
    pusher = varsync.connect(url, namespace=namespace, timeout=300)
    reader = varsync.connect(url, namespace=namespace, timeout=300)
    hand = redis.Redis.from_url(url, socket_timeout=300)
    key = f"{namespace}:by-hand"

    def hand_push() -> None:
        buffer = io.BytesIO()
        torch.save(learner.state_dict(), buffer)
        hand.set(key, buffer.getvalue())

    def hand_pull() -> None:
        raw = cast(bytes, hand.get(key))
        state = torch.load(io.BytesIO(raw), weights_only=True)  # unpickles
        actor.load_state_dict(state)

    try:
        pusher.create_table(TABLE, learner)
        turns: list[list[Op]] = [
            [("by hand", "push", hand_push), ("by hand", "pull", hand_pull)],
            [
                ("varsync redis://", "push", lambda: pusher.push(learner, skip_unchanged=False)),
                ("varsync redis://", "pull", lambda: reader.update(actor, delta_only=False)),
            ],
        ]
        # Three warm rounds: from the third push on, redis:// overwrites a spare version.
        samples = in_rounds(turns, replace(plan, warm=max(plan.warm, 3)), lambda: None)
        _same(learner, actor)
        return samples
    finally:
        reader.close()
        pusher.close()
        hand.flushall()
        hand.close()


TORCHRL_WAIT = 120.0  # seconds, the bound of every wait on the worker


def torchrl(plan: Frameworks) -> Samples:
    """TorchRL's weight sync as its multi-process collectors drive it, without the
    collector: each scheme's sender here (``send(trainer_policy)`` per round, what
    ``collector.update_policy_weights_`` calls), its receiver in one spawned worker, each
    with a policy of its own. Timed: from ``send`` until the worker's policy holds the new
    weights. TorchRL's ``send`` (sync=True) returns on the worker's acknowledgement;
    varsync's unconfirmed scheme returns once the push is stored, then the trainer waits
    for the worker's answer (timed apart); its confirmed one (``num_workers=1``) returns
    once the worker applied the version and said so in the reader registry."""
    import torch
    from torchrl import weight_update  # type: ignore[import-not-found, unused-ignore]

    import varsync_shm
    from varsync.integrations.torchrl import VarsyncWeightSyncScheme

    ctx = torch.multiprocessing.get_context("spawn")  # as TorchRL's collectors start workers
    trainer = policy(plan, 0)
    name = f"bench-torchrl-{uuid.uuid4().hex[:6]}"
    cpu = [torch.device("cpu")]
    schemes: dict[str, Any] = {
        "torchrl SharedMem": weight_update.SharedMemWeightSyncScheme(),
        "torchrl MultiProcess": weight_update.MultiProcessWeightSyncScheme(),
        "varsync shm://": VarsyncWeightSyncScheme(
            f"shm://{name}", "policy", background=False, timeout=TORCHRL_WAIT
        ),
        "varsync shm://, confirmed": VarsyncWeightSyncScheme(
            f"shm://{name}-confirmed", "policy", timeout=TORCHRL_WAIT
        ),
    }
    schemes["torchrl SharedMem"].init_on_sender(
        model_id="policy", model=policy(plan, 2), devices=cpu, ctx=ctx
    )
    schemes["torchrl MultiProcess"].init_on_sender(
        model_id="policy", model=policy(plan, 2), devices=cpu, ctx=ctx
    )
    schemes["varsync shm://"].init_on_sender(model_id="policy", model=trainer)
    schemes["varsync shm://, confirmed"].init_on_sender(
        model_id="policy", model=trainer, num_workers=1
    )
    commands, replies = ctx.Queue(), ctx.Queue()
    args = (schemes, plan, commands, replies)
    worker = ctx.Process(target=_torchrl_worker, name="torchrl-receivers", daemon=True, args=args)
    try:
        worker.start()
        for scheme in schemes.values():
            scheme.connect()  # the buffers, the weights or the first push

        def reply() -> Any:
            return next_message(replies, [worker], TORCHRL_WAIT, "the torchrl worker")

        if reply() != "ready":
            raise RuntimeError("the worker did not start")

        def send(contender: str) -> Op:
            return (contender, "send", lambda: schemes[contender].send(trainer))

        def train_step() -> None:  # untimed: new weights for every round
            with torch.no_grad():
                for p in trainer.parameters():
                    p.add_(1.0)

        turns: list[list[Op]] = [
            [send("torchrl SharedMem")],
            [send("torchrl MultiProcess")],
            [send("varsync shm://"), ("varsync shm://", "until the worker applied", reply)],
            [send("varsync shm://, confirmed")],
        ]
        samples = in_rounds(turns, plan, train_step)
        for contender in schemes:
            commands.put(("digest", contender))
            if reply() != _digest(trainer):
                raise RuntimeError(f"the worker's policy under {contender} is not the trainer's")
        return samples
    finally:
        if worker.is_alive():
            commands.put(("stop", None))
        stop_children([worker], 30)
        for scheme in schemes.values():
            scheme.shutdown()
        for q in (commands, replies):
            q.close()
            q.cancel_join_thread()
        varsync_shm.remove_store(name)
        varsync_shm.remove_store(f"{name}-confirmed")


def _digest(module: Any) -> list[float]:
    return [float(t.double().sum()) for t in module.state_dict().values()]


def _torchrl_worker(schemes: dict[str, Any], plan: Frameworks, commands: Any, replies: Any) -> None:
    """A collector's worker, reduced to its weight sync: the receiver of each scheme.
    varsync's unconfirmed scheme applies in ``receive`` here, and the worker answers its
    version; the others apply in their own threads. ``commands``: ("digest", contender):
    answer that policy's per-tensor sums; ("stop", None)."""
    import queue

    applying = []  # the schemes whose receive() this loop calls
    models = {contender: policy(plan, 1) for contender in schemes}  # schemes hold weakrefs
    for contender, scheme in schemes.items():
        scheme.init_on_receiver(model_id="policy", model=models[contender], worker_idx=0)
        scheme.connect(worker_idx=0)
        if type(scheme).__name__ == "VarsyncWeightSyncScheme" and not scheme.background:
            applying.append(scheme)
    replies.put("ready")
    deadline = time.monotonic() + 3600
    try:
        while time.monotonic() < deadline:
            for scheme in applying:
                if scheme.receive(timeout=0.2) is not None:
                    replies.put(scheme.version)
            try:
                command, contender = commands.get(timeout=0.0 if applying else 1.0)
            except queue.Empty:
                continue
            if command == "digest":
                replies.put(_digest(models[contender]))
            elif command == "stop":
                break
    finally:
        for scheme in schemes.values():
            scheme.shutdown()


def jax_tree(plan: Frameworks) -> dict[str, dict[str, Any]]:
    """The policy's arrays as numpy, in a pytree: {"layer00": {"kernel", "bias"}, ...}."""
    import numpy as np

    rng = np.random.default_rng(0)
    width = layer_width(plan)
    return {
        f"layer{i:02d}": {
            "kernel": rng.standard_normal((width, width), dtype=np.float32),
            "bias": rng.standard_normal(width, dtype=np.float32),
        }
        for i in range(max(1, plan.tensors // 2))
    }


def placed(array: Any, offset: int) -> Any:
    """A copy of ``array`` starting ``offset`` bytes past a 64-byte boundary."""
    import numpy as np

    raw = np.empty(array.nbytes + 64 + offset, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    np.copyto(out, array)
    return out


def jax_shm(plan: Frameworks) -> Samples:
    import jax
    import numpy as np

    import varsync
    import varsync_shm

    # What device_put takes, twice: 64-byte aligned, which JAX on the CPU wraps without a
    # copy (as it does the aligned views pull returns), and 16 bytes off, as numpy's own
    # large arrays often are, which it copies.
    arrays = jax.tree_util.tree_map(lambda a: placed(a, 0), jax_tree(plan))
    unaligned = jax.tree_util.tree_map(lambda a: placed(a, 16), arrays)
    tree = jax.block_until_ready(jax.device_put(jax.tree_util.tree_map(np.copy, arrays)))
    name = f"bench-jax-{uuid.uuid4().hex[:6]}"
    pusher = varsync.connect(f"shm://{name}")
    reader = varsync.connect(f"shm://{name}")
    try:
        pusher.create_table(TABLE, tree)
        ready = jax.block_until_ready
        turns: list[list[Op]] = [
            [("varsync shm://", "pull(like=tree)", lambda: ready(reader.pull(like=tree)))],
            [("jax", "device_put(numpy)", lambda: ready(jax.device_put(arrays)))],
            [("jax", "device_put(numpy, unaligned)", lambda: ready(jax.device_put(unaligned)))],
        ]
        samples = in_rounds(turns, plan, lambda: pusher.push(tree, skip_unchanged=False))
        pulled = reader.pull(like=tree)
        for path, leaf in jax.tree_util.tree_leaves_with_path(arrays):
            got = pulled
            for step in path:
                got = got[step.key]
            if not np.array_equal(np.asarray(got), leaf):
                raise RuntimeError(f"the pulled tree differs at {jax.tree_util.keystr(path)}")
        return samples
    finally:
        reader.close()
        pusher.close()
        varsync_shm.remove_store(name)
