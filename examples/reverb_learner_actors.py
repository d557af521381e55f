"""One learner process, several actor processes, an embedded Reverb server: the main job.

The learner serves a Reverb server (``varsync.reverb_server.serve``), trains a small two-layer
MLP and pushes its variables every few steps. Each actor is its own process: before each
"environment step" it calls ``pull_if_newer`` and moves bytes only when a newer version
exists. The log shows versions pushed, the version each actor acts with, bytes moved and
polls skipped as unchanged.

    python examples/reverb_learner_actors.py [--actors 3] [--seconds 15]

Exits 0 when every actor ended on the learner's last version with exactly its values.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import sys
import time
from typing import Any, Dict, List

import numpy as np

import varsync
from learner_actors import forward, init_mlp, sgd_step  # the same toy MLP as the memory demo


def actor(name: str, url: str, events: Any, stop: Any) -> None:
    """An actor process: pull only what is newer, act, report."""
    stats = {"version": 0, "pulls": 0, "skipped": 0, "bytes": 0, "steps": 0, "error": ""}
    checksum = 0.0
    try:
        with varsync.connect(url, timeout=30) as store:
            events.put(("log", f"{name} connected to {url}"))
            store.wait_for(0, timeout=60)
            params = None
            deadline = time.monotonic() + 120  # bounded even if the learner vanishes
            while time.monotonic() < deadline:
                finished = stop.is_set()
                newer = store.pull_if_newer(stats["version"])
                if newer is None:
                    stats["skipped"] += 1
                else:
                    stats["version"], params = newer
                    stats["pulls"] += 1
                    stats["bytes"] += sum(a.nbytes for a in varsync.flatten(params))
                    events.put(("log", f"{name} now acts with version {stats['version']:3d} "
                                       f"(train_step {int(params['train_step'])})"))
                if finished:
                    break
                forward(params["policy_variables"], np.ones((1, 8), np.float32))  # one env step
                stats["steps"] += 1
                time.sleep(0.01)  # the environment's own time
            checksum = float(sum(np.sum(a, dtype=np.float64) for a in varsync.flatten(params)))
    except varsync.VarsyncError as exc:
        stats["error"] = f"{type(exc).__name__}: {exc}"
    events.put(("done", name, stats, checksum))


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0, help="how long the learner trains")
    parser.add_argument("--push-every", type=int, default=25)
    args = parser.parse_args(argv)

    from varsync.reverb_server import serve

    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:6.2f}s] {line}", flush=True)

    rng = np.random.default_rng(0)
    params = init_mlp(rng)
    example = {"policy_variables": params, "train_step": np.int64(0)}
    context = multiprocessing.get_context("spawn")
    events, stop = context.Queue(), context.Event()
    with serve({"variables": example}) as server, varsync.connect(server.url, timeout=30) as store:
        log(f"learner serves {server.url} (Reverb listens on every interface; see docs/reverb.md)")
        print(store.table_info(), flush=True)
        actors = [
            context.Process(target=actor, args=(f"actor-{i}", server.url, events, stop), daemon=True)
            for i in range(args.actors)
        ]
        for process in actors:
            process.start()

        true_w = rng.standard_normal((8, 1)).astype(np.float32)
        step, version = 0, 0
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            x = rng.standard_normal((32, 8)).astype(np.float32)
            loss = sgd_step(params, x, x @ true_w)
            step += 1
            if step % args.push_every == 0:
                version = store.push({"policy_variables": params, "train_step": np.int64(step)})
                log(f"learner  pushed version {version:3d} (train_step {step:4d}, loss {loss:.4f})")
            try:
                while True:
                    kind, *rest = events.get_nowait()
                    if kind == "log":
                        log(rest[0])
            except queue.Empty:
                pass
            time.sleep(0.01)
        version = store.push({"policy_variables": params, "train_step": np.int64(step)})
        log(f"learner  pushed final version {version} (train_step {step}); stopping actors")
        final_checksum = float(sum(np.sum(a, dtype=np.float64) for a in varsync.flatten(store.pull())))
        stop.set()

        results: Dict[str, Any] = {}
        give_up = time.monotonic() + 60
        while len(results) < len(actors) and time.monotonic() < give_up:
            try:
                kind, *rest = events.get(timeout=1)
            except queue.Empty:
                continue
            if kind == "log":
                log(rest[0])
            else:
                results[rest[0]] = (rest[1], rest[2])
        for process in actors:
            process.join(10)
            if process.is_alive():
                process.kill()

        nbytes = store.table_info().nbytes
        print(f"\nsummary: learner pushed {version} versions of {nbytes} bytes", flush=True)
        ok = len(results) == len(actors)
        for name in sorted(results):
            stats, checksum = results[name]
            print(f"  {name}: holds version {stats['version']}, {stats['pulls']} pulls "
                  f"({stats['bytes'] / 1e6:.2f} MB moved), {stats['skipped']} polls skipped as "
                  f"unchanged, {stats['steps']} env steps"
                  + (f", ERROR {stats['error']}" if stats["error"] else ""))
            ok &= stats["version"] == version and checksum == final_checksum and not stats["error"]
        print("OK: every actor ends on the last version" if ok else "FAILED", flush=True)
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
