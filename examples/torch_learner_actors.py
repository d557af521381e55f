"""A PyTorch learner process and actor processes, over shm:// (or redis://, any URL).

The learner trains a small ``torch.nn.Module`` with SGD and pushes it after every step
(``store.push(model)``: its ``state_dict``). Each actor is its own process with its own
model, initialised differently: it waits for a newer version (``wait_for``) and copies
it into its model in place (``store.update(model)``). Every actor reports the version and
a hash of its weights after each update; the learner checks the versions increase and
each hash is the one of the weights it pushed as that version.

    python examples/torch_learner_actors.py [--url shm://torch-demo] [--actors 2] [--steps 40]
    python examples/torch_learner_actors.py --url redis://127.0.0.1:6379/0

Exits 0 when every actor saw only increasing versions with the learner's exact weights
and ended on the last one.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import queue
import sys
import time
from typing import Any, List

import torch

import varsync

TIMEOUT = 60.0  # bounds every wait, so a lost process fails the run instead of hanging it


class Policy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))  # pushed with the weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def digest(model: torch.nn.Module) -> str:
    """A hash of the exact bytes of every tensor of the model's state_dict."""
    h = hashlib.blake2b(digest_size=8)
    for tensor in model.state_dict().values():
        h.update(tensor.detach().numpy().tobytes())
    return h.hexdigest()


def actor(name: str, url: str, start: int, steps: int, events: Any) -> None:
    """An actor process: update its own model in place whenever a newer version exists."""
    torch.manual_seed(1 + int(name.split("-")[1]))  # weights unlike the learner's, at first
    model, seen, error = Policy(), [], ""
    try:
        with varsync.connect(url, timeout=TIMEOUT) as store:
            events.put(("ready", name))
            held = start
            while int(model.step) < steps:
                store.wait_for(held, timeout=TIMEOUT)  # PullTimeoutError if the learner is gone
                held = store.update(model)
                seen.append((held, digest(model)))
                with torch.no_grad():
                    model(torch.ones(1, 8))  # act with it: one environment step
    except Exception as exc:  # reported to the learner, which fails the run
        error = f"{type(exc).__name__}: {exc}"
    events.put(("done", name, seen, error))


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="shm://torch-demo")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = Policy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    true_w = torch.randn(8, 1)
    context = multiprocessing.get_context("spawn")
    events = context.Queue()
    with varsync.connect(args.url, timeout=TIMEOUT) as store:
        store.create_table("variables", model)
        start = store.version()  # tables outlive runs: this run's versions are the ones above
        actors = [
            context.Process(target=actor, args=(f"actor-{i}", args.url, start, args.steps, events),
                            daemon=True)
            for i in range(args.actors)
        ]
        for process in actors:
            process.start()
        results, ready, pushed, version = {}, 0, {}, start
        try:
            while ready < len(actors):  # train once the actors are connected (torch loads slowly)
                kind, *rest = events.get(timeout=TIMEOUT)
                ready += 1
                if kind == "done":
                    results[rest[0]] = rest[1:]
            for step in range(1, args.steps + 1):
                x = torch.randn(32, 8)
                loss = torch.nn.functional.mse_loss(model(x), x @ true_w)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                model.step.fill_(step)
                version = store.push(model)
                pushed[version] = digest(model)
                time.sleep(0.02)  # the learner's other work
            print(f"learner pushed versions {start + 1}..{version} ({args.steps} SGD steps, "
                  f"loss {loss.item():.4f}, {store.table_info().nbytes} bytes each) to {args.url}")
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
    for name, (seen, error) in sorted(results.items()):
        versions = [v for v, _ in seen]
        increasing = all(a < b for a, b in zip(versions, versions[1:]))
        exact = all(pushed.get(v) == h for v, h in seen)
        span = f"{versions[0]}..{versions[-1]}" if versions else "none"
        print(f"  {name}: {len(seen)} updates, versions {span}, "
              f"{'increasing' if increasing else 'NOT INCREASING'}, "
              f"{'weights exact' if exact else 'WEIGHTS DIFFER'}"
              + (f", ERROR {error}" if error else ""))
        ok &= increasing and exact and versions[-1:] == [version] and not error
    print("OK: every actor saw increasing versions with the learner's exact weights"
          if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
