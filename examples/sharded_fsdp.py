"""FSDP2 trainer ranks push their own shards; readers sharded another way pull their part.

The trainer is ``--ranks`` processes on torch.distributed (gloo, CPU, loopback). They
shard a small MLP with FSDP2's ``fully_shard`` (each rank holds rows of every weight),
train it with AdamW, and after each optimizer step every rank pushes its local shards:
``parts_from_dtensors(model.state_dict())`` and ``push_shard``, no all-gather. The step
becomes one version once every rank's part has arrived.

Beside them, in this process, three readers: one unsharded (``update`` into arrays of its
own, fetching only what changed), and a group of two sharded by columns, as a
tensor-parallel rollout engine is (each ``pull_slices`` of its half of every leaf, with
``held=``: only what changed in its half). For the check alone, rank 0 saves each step's
full state dict (``full_tensor()``); at the end every version each reader got is compared
with it, bit for bit.

``--kill``: rank 1 dies at the last step before pushing its part: rank 0's push raises
``ShardTimeoutError`` naming rank 1, and no reader ever leaves the last whole version.

    python examples/sharded_fsdp.py [--url shm://fsdp-demo] [--ranks 2] [--steps 4] [--kill]
    python examples/sharded_fsdp.py --url redis://127.0.0.1:6379/0

Exits 0 when every reader saw only whole versions with the trainer's exact weights and
ended on the last one published.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np

import varsync

TIMEOUT = 60.0  # bounds every wait, so a lost process fails the run instead of hanging it
PUSH_TIMEOUT = 10.0  # a rank's push of a step, the others' parts included


def trainer(rank: int, world: int, port: int, url: str, steps: int, kill: bool, out: str) -> None:
    """One trainer rank: FSDP2 over gloo; after each optimizer step, push its shards."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 4),
    )  # fmt: skip
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def full_state() -> dict[str, np.ndarray]:  # every rank takes part (a collective)
        return {k: v.full_tensor().detach().numpy() for k, v in model.state_dict().items()}

    try:
        with varsync.connect(url, timeout=TIMEOUT) as store:
            store.create_sharded_table("policy", full_state(), world)
            for step in range(1, steps + 1):
                seed = torch.Generator().manual_seed(100 * step + rank)
                batch = torch.randn(64, 32, generator=seed)
                model(batch).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
                if kill and rank == 1 and step == steps:
                    os._exit(0)  # dies mid-version: the others' parts of this step are in
                parts = varsync.parts_from_dtensors(model.state_dict())  # local shards
                try:
                    version = store.push_shard(
                        "policy", parts, rank=rank, step=step, timeout=PUSH_TIMEOUT
                    )
                except varsync.ShardTimeoutError as error:
                    print(f"rank {rank}: step {step} not published, missing {error.missing}")
                    return
                full = full_state()  # for the check alone
                if rank == 0:
                    np.savez(Path(out) / f"version{version}.npz", **full)
                    print(f"rank 0: step {step} published as version {version}", flush=True)
    finally:
        if not kill:  # a rank that lost its peer leaves its group to the exit
            # every rank past its last collective before any tears the group down: rank 0
            # hosts the group's store, and leaving while a peer still used it aborted
            # rank 0 ("terminate called without an active exception") once in a few runs
            dist.barrier()
            dist.destroy_process_group()


def columns(spec: varsync.Spec, which: int) -> tuple[tuple[int, int], ...]:
    """Half ``which`` of a leaf's last dimension, the rest whole."""
    ranges = [(0, int(n)) for n in spec.shape]
    n = ranges[-1][1]
    ranges[-1] = (0, n // 2) if which == 0 else (n // 2, n)
    return tuple(ranges)


def read_all(url: str, which: int | None, stop: threading.Event, seen: list) -> None:
    """A reader: every version it can get until ``stop``, each with a copy of what it
    holds then. ``which`` ``None``: unsharded (``update``); 0 or 1: a column half
    (``pull_slices(held=)``)."""
    try:
        with varsync.connect(url, timeout=TIMEOUT) as reader:
            version, held, into = 0, None, None
            while not stop.is_set():
                try:
                    version = reader.wait_for(version, "policy", timeout=0.2)
                except (varsync.PullTimeoutError, varsync.TableNotFoundError):
                    continue
                signature = reader.signature("policy")
                if which is None:
                    if into is None:
                        into = {k: np.zeros(s.shape, s.dtype) for k, s in signature.items()}
                    version = reader.update(into, "policy")
                    seen.append((version, {k: v.copy() for k, v in into.items()}))
                else:
                    halves = {k: columns(s, which) for k, s in signature.items()}
                    version, arrays = held = reader.pull_slices("policy", halves, held=held)
                    seen.append((version, dict(arrays)))
    except Exception as exc:  # to the check, which fails the run
        seen.append((-1, repr(exc)))


def same(got: Any, full: dict[str, np.ndarray], which: int | None) -> bool:
    """Whether a reader's arrays are, bit for bit, the trainer's (or their column half)."""
    for key, array in full.items():
        if which is not None:
            start, stop = columns(varsync.Spec(array.shape, array.dtype), which)[-1]
            array = array[..., start:stop]
        if np.asarray(got[key]).tobytes() != np.ascontiguousarray(array).tobytes():
            return False
    return True


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=f"shm://fsdp-demo-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--kill", action="store_true", help="rank 1 dies at the last step")
    args = parser.parse_args(argv)
    last = args.steps - 1 if args.kill else args.steps
    stop = threading.Event()
    names = ["unsharded", "columns 0", "columns 1"]
    seen: dict[str, list] = {name: [] for name in names}
    readers = [
        threading.Thread(target=read_all, args=(args.url, which, stop, seen[name]))
        for name, which in zip(names, (None, 0, 1))
    ]
    with tempfile.TemporaryDirectory() as out:
        for reader in readers:
            reader.start()
        context = multiprocessing.get_context("spawn")
        port = free_port()
        ranks = [
            context.Process(
                target=trainer,
                args=(r, args.ranks, port, args.url, args.steps, args.kill, out),
            )
            for r in range(args.ranks)
        ]
        for rank in ranks:
            rank.start()
        for rank in ranks:
            rank.join(TIMEOUT * 2)
        codes = [rank.exitcode for rank in ranks]
        with varsync.connect(args.url, timeout=TIMEOUT) as store:
            final = store.version("policy")
            for _ in range(100):  # the readers reach the last version, or the check fails
                if all(s and s[-1][0] in (final, -1) for s in seen.values()):
                    break
                stop.wait(0.1)
        stop.set()
        for reader in readers:
            reader.join(TIMEOUT)
        wanted = {v: dict(np.load(Path(out) / f"version{v}.npz")) for v in range(1, last + 1)}
    failures = [f"trainer exit codes {codes}"] if any(c != 0 for c in codes) else []
    if final != last:
        failures.append(f"the table is at version {final}, not {last}")
    for name, which in zip(names, (None, 0, 1)):
        versions = [v for v, _ in seen[name]]
        bad = [v for v, got in seen[name] if v not in wanted or not same(got, wanted[v], which)]
        exact = "weights exact" if not bad else f"NOT exact at versions {bad}"
        span = f"{versions[0]}..{versions[-1]}" if versions else "none"
        print(f"reader {name}: {len(versions)} versions, {span}, {exact}")
        if bad or not versions or versions[-1] != last or versions != sorted(versions):
            failures.append(f"reader {name}")
    if args.url.startswith("shm://"):
        import varsync_shm

        varsync_shm.remove_store(args.url[len("shm://") :].split("?")[0])
    if failures:
        print("FAILED:", "; ".join(failures))
        return 1
    print(f"OK: every reader saw only whole versions, exact, and ended on version {last}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
