"""One learner, several actors: the job varsync does, on the embedded memory backend.

The learner trains a small two-layer MLP (numpy, a toy regression) and publishes its
variables every few steps. Each actor runs "environment steps"; before each one it asks
for a newer version with ``pull_if_newer`` and only moves bytes when there is one. The log
shows the versions pushed, what each actor holds, bytes moved and polls skipped.

    python examples/learner_actors.py [--url memory://demo] [--actors 3] [--seconds 6]

Exits 0 when every actor ends on the learner's last version with the exact values.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, List

import numpy as np

import varsync


def init_mlp(rng: np.random.Generator, sizes=(8, 64, 64, 1)) -> Dict[str, List[np.ndarray]]:
    weights, biases = [], []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        weights.append((rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32))
        biases.append(np.zeros(fan_out, np.float32))
    return {"weights": weights, "biases": biases}


def forward(params, x):
    hidden = [x]
    for i, (w, b) in enumerate(zip(params["weights"], params["biases"])):
        x = x @ w + b
        if i < len(params["weights"]) - 1:
            x = np.maximum(x, 0)
        hidden.append(x)
    return x, hidden


def sgd_step(params, x, y, lr=1e-2) -> float:
    out, hidden = forward(params, x)
    grad = 2 * (out - y) / len(x)
    for i in reversed(range(len(params["weights"]))):
        w = params["weights"][i]
        params["weights"][i] = w - lr * hidden[i].T @ grad
        params["biases"][i] = params["biases"][i] - lr * grad.sum(0)
        if i:
            grad = (grad @ w.T) * (hidden[i] > 0)
    return float(np.mean((out - y) ** 2))


@dataclass
class ActorStats:
    version: int = 0
    pulls: int = 0
    skipped: int = 0
    bytes_moved: int = 0
    steps: int = 0
    error: str = ""


def learner(store: varsync.VariableContainer, seconds: float, push_every: int, log) -> dict:
    rng = np.random.default_rng(0)
    params = init_mlp(rng)
    true_w = rng.standard_normal((8, 1)).astype(np.float32)
    step, version, pushed = 0, 0, []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        x = rng.standard_normal((32, 8)).astype(np.float32)
        loss = sgd_step(params, x, x @ true_w)
        step += 1
        if step % push_every == 0:
            values = {"policy_variables": params, "train_step": np.int64(step)}
            version = store.push(values)
            pushed = [np.copy(a) for a in varsync.flatten(values)]  # sgd_step replaces params
            log(f"learner  pushed version {version:3d} (train_step {step:4d}, loss {loss:.4f})")
        time.sleep(0.01)  # the learner's other work: sampling replay, logging, ...
    return {"version": version, "flat_values": pushed}


def actor(name: str, store: varsync.VariableContainer, stop: threading.Event, stats: ActorStats, log) -> None:
    try:
        store.wait_for(0, timeout=10)  # the first version
        params = None
        while True:
            finished = stop.is_set()
            newer = store.pull_if_newer(stats.version)
            if newer is None:
                stats.skipped += 1
            else:
                stats.version, params = newer
                stats.pulls += 1
                stats.bytes_moved += sum(a.nbytes for a in varsync.flatten(params))
                log(f"{name} now acts with version {stats.version:3d} "
                    f"(train_step {int(params['train_step'])})")
            if finished:
                return
            obs = np.ones((1, 8), np.float32)
            forward(params["policy_variables"], obs)  # one environment step
            stats.steps += 1
            time.sleep(0.005)
    except varsync.VarsyncError as exc:
        stats.error = f"{type(exc).__name__}: {exc}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="varsync URL (default: VARSYNC_URL or memory://default)")
    parser.add_argument("--actors", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--push-every", type=int, default=20)
    args = parser.parse_args(argv)

    started = time.monotonic()
    lock = threading.Lock()

    def log(line: str) -> None:
        with lock:
            print(f"[{time.monotonic() - started:6.2f}s] {line}", flush=True)

    with varsync.connect(args.url) as store:
        example = {"policy_variables": init_mlp(np.random.default_rng(1)), "train_step": np.int64(0)}
        store.create_table("variables", example)
        log(f"table 'variables' on {store!r}:")
        print(store.table_info("variables"), flush=True)
        stop = threading.Event()
        stats = {f"actor-{i}": ActorStats() for i in range(args.actors)}
        threads = [
            threading.Thread(target=actor, args=(name, store, stop, s, log)) for name, s in stats.items()
        ]
        for thread in threads:
            thread.start()
        final = learner(store, args.seconds, args.push_every, log)
        stop.set()
        for thread in threads:
            thread.join(30)

        print("\nsummary", flush=True)
        print(f"  learner pushed {final['version']} versions "
              f"of {store.table_info('variables').nbytes} bytes each")
        ok = final["version"] > 0
        latest = store.pull()
        for name, s in stats.items():
            print(f"  {name}: holds version {s.version}, {s.pulls} pulls "
                  f"({s.bytes_moved / 1e6:.2f} MB moved), {s.skipped} polls skipped as unchanged, "
                  f"{s.steps} env steps{', ERROR ' + s.error if s.error else ''}")
            ok &= s.version == final["version"] and not s.error
        for got, want in zip(varsync.flatten(latest), final["flat_values"]):
            ok &= np.array_equal(got, want)
        print("OK: every actor ends on the last version" if ok else "FAILED", flush=True)
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
