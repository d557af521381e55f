"""A JAX learner process and actor processes, over shm:// (or redis://, any URL).

The learner trains a small MLP, a pytree of ``jax.Array``s, with jitted SGD and pushes it
after every step (``store.push(state)``). Each actor is its own process, starting from
its own random parameters: before each "environment step" it asks for a newer version
with ``store.pull_if_newer(held, like=state)``, which returns the same pytree type with
``jax.Array`` leaves and moves bytes only when there is one. Every actor reports the
version and a hash of the parameters it got; the learner checks the versions increase
and each hash is the one of the parameters it pushed as that version.

    python examples/jax_learner_actors.py [--url shm://jax-demo] [--actors 2] [--steps 40]

Exits 0 when every actor saw only increasing versions with the learner's exact
parameters and ended on the last one.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import queue
import sys
import time
from typing import Any, List

import jax
import jax.numpy as jnp
import numpy as np

import varsync

TIMEOUT = 60.0  # bounds every wait, so a lost process fails the run instead of hanging it


def init(seed: int, sizes=(8, 64, 1)) -> dict:
    rng = np.random.default_rng(seed)
    layers = [
        {"w": jnp.asarray(rng.standard_normal((m, n), np.float32) / m**0.5), "b": jnp.zeros(n)}
        for m, n in zip(sizes[:-1], sizes[1:])
    ]
    return {"params": layers, "step": jnp.int32(0)}


@jax.jit
def forward(params: list, x: jax.Array) -> jax.Array:
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


@jax.jit
def sgd_step(state: dict, x: jax.Array, y: jax.Array):
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((forward(p, x) - y) ** 2))(state["params"])
    params = jax.tree.map(lambda p, g: p - 0.05 * g, state["params"], grads)
    return {"params": params, "step": state["step"] + 1}, loss


def digest(state: dict) -> str:
    """A hash of the exact bytes of every leaf."""
    h = hashlib.blake2b(digest_size=8)
    for leaf in jax.tree.leaves(state):
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()


def actor(name: str, url: str, start: int, steps: int, events: Any) -> None:
    """An actor process: pull only what is newer, act, report."""
    state = init(1 + int(name.split("-")[1]))  # not the learner's parameters, at first
    forward(state["params"], jnp.ones((1, 8)))  # compiled before the learner starts
    held, seen, skipped, error = start, [], 0, ""
    try:
        with varsync.connect(url, timeout=TIMEOUT) as store:
            events.put(("ready", name))
            deadline = time.monotonic() + TIMEOUT  # bounded even if the learner vanishes
            while int(state["step"]) < steps:
                newer = store.pull_if_newer(held, like=state)
                if newer is None:
                    skipped += 1
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"no version after {held} in {TIMEOUT:g} s")
                else:
                    held, state = newer
                    seen.append((held, digest(state)))
                    deadline = time.monotonic() + TIMEOUT
                forward(state["params"], jnp.ones((1, 8)))  # one environment step
                time.sleep(0.005)  # the environment's own time
    except Exception as exc:  # reported to the learner, which fails the run
        error = f"{type(exc).__name__}: {exc}"
    events.put(("done", name, seen, skipped, error))


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="shm://jax-demo")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    state = init(0)
    true_w = rng.standard_normal((8, 1), np.float32)
    batches = [rng.standard_normal((32, 8), np.float32) for _ in range(args.steps)]
    context = multiprocessing.get_context("spawn")
    events = context.Queue()
    with varsync.connect(args.url, timeout=TIMEOUT) as store:
        store.create_table("variables", state)
        start = store.version()  # tables outlive runs: this run's versions are the ones above
        actors = [
            context.Process(target=actor, args=(f"actor-{i}", args.url, start, args.steps, events),
                            daemon=True)
            for i in range(args.actors)
        ]
        for process in actors:
            process.start()
        sgd_step(state, batches[0], batches[0] @ true_w)  # compiled while the actors start
        results, ready, pushed, version = {}, 0, {}, start
        try:
            while ready < len(actors):  # train once the actors are connected (jax loads slowly)
                kind, *rest = events.get(timeout=TIMEOUT)
                ready += 1
                if kind == "done":
                    results[rest[0]] = rest[1:]
            for x in batches:
                state, loss = sgd_step(state, x, x @ true_w)
                version = store.push(state)
                pushed[version] = digest(state)
                time.sleep(0.02)  # the learner's other work
            print(f"learner pushed versions {start + 1}..{version} ({args.steps} SGD steps, "
                  f"loss {float(loss):.4f}, {store.table_info().nbytes} bytes each) to {args.url}")
            while len(results) < len(actors):
                kind, *rest = events.get(timeout=TIMEOUT)
                if kind == "done":
                    results[rest[0]] = rest[1:]
        except queue.Empty:
            print(f"learner: no word from {len(actors) - len(results)} actor(s) in {TIMEOUT:g} s")
        for process in actors:
            process.join(TIMEOUT)
            if process.is_alive():
                process.kill()
                process.join()

    ok = len(results) == len(actors) and all(p.exitcode == 0 for p in actors)
    for name, (seen, skipped, error) in sorted(results.items()):
        versions = [v for v, _ in seen]
        increasing = all(a < b for a, b in zip(versions, versions[1:]))
        exact = all(pushed.get(v) == h for v, h in seen)
        span = f"{versions[0]}..{versions[-1]}" if versions else "none"
        print(f"  {name}: {len(seen)} pulls, versions {span}, {skipped} polls skipped as "
              f"unchanged, {'increasing' if increasing else 'NOT INCREASING'}, "
              f"{'parameters exact' if exact else 'PARAMETERS DIFFER'}"
              + (f", ERROR {error}" if error else ""))
        ok &= increasing and exact and versions[-1:] == [version] and not error
    print("OK: every actor saw increasing versions with the learner's exact parameters"
          if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
