"""Element deltas end to end on a real model (``python -m benchmarks.element_sync``,
modern environment; ``make bench-elements``).

The Llama-like decoder of :mod:`benchmarks.elements` (random init, fp32 master weights,
~168 M parameters, 337 MB in bf16) is trained with AdamW on synthetic tokens at RL-like
learning rates (3e-7, 1e-6, 1e-5); after every optimizer step the learner pushes the bf16 cast
of its weights to two tables of one store: ``patched`` (element deltas on, the default)
and ``whole`` (``element_deltas=False``: every changed leaf whole, the sync before element
deltas). A reader then takes each new version twice per table: ``pull_if_newer(held=)``
and ``update`` into bf16 torch tensors. Last, pushes where every element changed
(random bits), the tables taking turns, for the encoder's give-up cost. They go to a
third table too, ``twin``: pushed like ``patched`` at every step (so its store holds
what ``patched``'s holds), then given the random bits with ``element_deltas=False``.
``patched`` / ``twin`` is what giving up costs against a whole push of the same table;
``patched`` / ``whole`` adds what the store's memory does (a ``whole`` table recycles a
retired version's chunks, a patched one has none to recycle for its first two whole
pushes: docs/delta.md). Element deltas are turned on for ``patched`` and ``twin`` on
every backend (shm:// and memory:// default to off).

Bytes moved: on redis:// the server's own ``INFO stats`` (bytes in plus out); on
memory:// and shm://, the bytes crossing the backend protocol (arrays and patches
handed to a write, returned by a read). Every pulled and updated value is checked bit
for bit against the pushed one. Times are single calls on a shared 2-core machine: read
the medians of the ratios printed at the end, not one row.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from varsync import _elements as elements

from .delta import Meter, ServerBytes, fresh_store
from .elements import Config, bf16_leaves, build_model
from .harness import MB, machine

TABLES = ("patched", "whole")
TWIN = "twin"  # pushed as patched is, then given the random bits whole


class Moved:
    """Bytes moved since the last :meth:`take`: the server's count or the protocol's."""

    def __init__(self, server: ServerBytes | None, meters: list[Meter]) -> None:
        self.server, self.meters = server, meters
        self.last = self._now()

    def _now(self) -> int:
        if self.server is not None:
            return self.server.reading()
        return sum(m.total for m in self.meters)

    def take(self) -> int:
        now = self._now()
        moved = now - self.last - (self.server.overhead if self.server else 0)
        self.last = self._now() if self.server else now
        return moved


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def _same(got: dict[str, Any], want: dict[str, np.ndarray]) -> None:
    import torch

    for key, array in want.items():
        value = got[key]
        if isinstance(value, torch.Tensor):
            value = value.view(torch.int16).numpy()
        if np.asarray(value).view(np.uint16).tobytes() != array.view(np.uint16).tobytes():
            raise AssertionError(f"{key}: the reader does not hold the pushed value bit for bit")


def sync_steps(
    url: str,
    server: ServerBytes | None,
    config: Config,
    lr: float,
    steps: int,
    log: Callable,
    rounds: int,
    phase: int = 0,
) -> list[dict[str, Any]]:
    """Train ``steps`` steps at ``lr``, syncing each through both tables; one row per step
    and table; then ``rounds`` pushes of random bits (:func:`everything_changed`, its
    order turned by ``phase``)."""
    import torch

    import varsync

    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(1)
    pushed = bf16_leaves(model)
    writer, reader = varsync.connect(url, timeout=600), varsync.connect(url, timeout=600)
    rows: list[dict[str, Any]] = []
    try:
        pushes = Meter(writer.backend)
        moved = Moved(server, [pushes, Meter(reader.backend)])
        held: dict[str, tuple[int, Any]] = {}
        targets = {
            t: {k: torch.empty(v.shape, dtype=torch.bfloat16) for k, v in pushed.items()}
            for t in TABLES
        }
        for table in (*TABLES, TWIN):
            writer.create_table(table, pushed)
            writer.configure_table(table, element_deltas=table != "whole")  # on shm too
            writer.push(pushed, table)
        for table in TABLES:
            held[table] = reader.pull_if_newer(0, table)  # type: ignore[assignment]
            reader.update(targets[table], table)
        for step in range(1, steps + 1):
            tokens = torch.randint(0, config.vocab, (1, config.tokens + 1), generator=generator)
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            current = bf16_leaves(model)
            total = sum(v.size for v in current.values())
            changed = sum(elements.changed_count(pushed[k], v) for k, v in current.items())
            for table in TABLES if step % 2 else TABLES[::-1]:
                row: dict[str, Any] = {"lr": lr, "step": step, "table": table}
                row.update(share=changed / total, changed=changed, whole=2 * total)
                moved.take()
                patched = table == "patched"
                row["push_s"], _ = _timed(
                    partial(writer.push, current, table, element_deltas=patched)
                )
                row["push_B"] = moved.take()
                row["pull_s"], got = _timed(
                    partial(reader.pull_if_newer, held[table][0], table, held=held[table][1])
                )
                row["pull_B"] = moved.take()
                row["update_s"], _ = _timed(partial(reader.update, targets[table], table))
                row["update_B"] = moved.take()
                held[table] = got
                _same(got[1], current)
                _same(targets[table], current)
                log(row)
                rows.append(row)
            writer.push(current, TWIN)
            pushed = current
        rows += everything_changed(writer, pushes, pushed, log, rounds, lr, phase)
    finally:
        writer.close()
        reader.close()
    return rows


def everything_changed(
    writer: Any,
    pushes: Meter,
    pushed: dict[str, np.ndarray],
    log: Callable,
    rounds: int,
    lr: float,
    phase: int,
) -> list[dict]:
    """Pushes where every element changed after the steps at ``lr``, the three tables
    taking turns: each first in one round of three, the order of the first round turned
    by ``phase`` (the first two rounds are the ones that differ): the give-up cost. Each
    row has the push's time and its ``client_s``, the time outside the backend's calls
    (``pushes`` times them): what the encoder and the container add to the store's
    write."""
    rng = np.random.default_rng(2)
    rows = []
    tables = (*TABLES, TWIN)
    for number in range(rounds):
        bits = {
            k: rng.integers(0, 1 << 16, v.size, np.uint16).view(v.dtype).reshape(v.shape)
            for k, v in pushed.items()
        }
        turn = (number + phase) % len(tables)
        for table in tables[turn:] + tables[:turn]:
            push = partial(writer.push, bits, table, element_deltas=table == "patched")
            inside = pushes.seconds
            seconds, _ = _timed(push)
            client = seconds - (pushes.seconds - inside)
            row = {"lr": "random bits", "after": lr, "step": number + 1, "table": table}
            row["push_s"], row["client_s"] = seconds, client
            log(row)
            rows.append(row)
    return rows


def text(row: dict[str, Any]) -> str:
    if "share" not in row:
        return f"| {row['lr']} | {row['step']} | {row['table']} | every element | " + (
            f"push {row['push_s'] * 1e3:.0f} ms, outside the store {row['client_s'] * 1e3:.1f} ms |"
        )
    ideal = row["changed"] * (2 + 4)
    target = "yes" if row["push_B"] <= 1.3 * ideal + MB else "NO"
    return (
        f"| {row['lr']:g} | {row['step']} | {row['table']} | {row['share']:.2%} | "
        f"push {row['push_B'] / MB:.1f} MB {row['push_s'] * 1e3:.0f} ms | "
        f"pull_if_newer {row['pull_B'] / MB:.1f} MB {row['pull_s'] * 1e3:.0f} ms | "
        f"update {row['update_B'] / MB:.1f} MB {row['update_s'] * 1e3:.0f} ms | "
        f"{target if row['table'] == 'patched' and row['share'] <= 0.05 else ''} |"
    )


def _pairs(rows: list[dict[str, Any]], against: str) -> list[tuple[dict, dict]]:
    """The rows of ``patched`` and ``against`` of the same step (learning rate, the
    rate a random-bits round followed, step number)."""
    steps: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for row in rows:
        steps.setdefault((row["lr"], row.get("after"), row["step"]), {})[row["table"]] = row
    return [(s["patched"], s[against]) for s in steps.values() if "patched" in s and against in s]


def ratios(rows: list[dict[str, Any]], against: str = "whole") -> dict[str, float]:
    """Medians over the steps of patched / ``against``, per measure."""
    out: dict[str, float] = {}
    pairs = _pairs(rows, against)
    for key in ("push_B", "push_s", "pull_B", "pull_s", "update_B", "update_s"):
        values = [mine[key] / other[key] for mine, other in pairs if key in mine and other.get(key)]
        if values:
            out[key] = statistics.median(values)
    return out


def give_up_cost(rows: list[dict[str, Any]]) -> tuple[float, float, float]:
    """Over the random-bits rounds in ``rows``, medians of the time ``patched`` and
    ``twin`` spent outside the store's calls, and of the difference as a share of
    ``twin``'s push (what giving up adds to a whole push from the same store state)."""
    pairs = _pairs(rows, TWIN)
    if not pairs:
        return math.nan, math.nan, math.nan
    return (
        statistics.median(mine["client_s"] for mine, _ in pairs),
        statistics.median(twin["client_s"] for _, twin in pairs),
        statistics.median(
            (mine["client_s"] - twin["client_s"]) / twin["push_s"] for mine, twin in pairs
        ),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rates", default="3e-7,1e-6,1e-5", help="AdamW learning rates")
    parser.add_argument("--rounds", type=int, default=6, help="pushes of random bits")
    parser.add_argument("--layers", type=int, default=8)
    # redis first: a memory:// store lives as long as the process (GBs here), which the
    # later sections would share the machine with
    parser.add_argument("--backends", default="redis,memory,shm")
    parser.add_argument("--smoke", action="store_true", help="a tiny model: checks, no figures")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    config = Config(layers=args.layers)
    if args.smoke:
        config = Config(vocab=256, hidden=64, layers=1, heads=2, mlp=128, tokens=16)
    about = machine()
    params = sum(p.numel() for p in build_model(config).parameters())
    print(f"machine: {about['cpu']}, {about['cores']} cores, load {about['load_average']}")
    print(f"model: {config}, {params / 1e6:.0f} M parameters, {2 * params / MB:.0f} MB in bf16")
    for name in args.backends.split(","):
        with fresh_store(name, "bench-elements") as (url, server):
            print(f"\n### {name} ({'server INFO stats' if server else 'protocol bytes'})\n")
            print("| lr | step | table | changed | push | pull_if_newer | update | 1.3x |")
            print("|---|---|---|---|---|---|---|---|")
            rows: list[dict[str, Any]] = []
            for phase, rate in enumerate(args.rates.split(",")):
                rows += sync_steps(
                    url,
                    server,
                    config,
                    float(rate),
                    args.steps,
                    lambda r: print(text(r)),
                    args.rounds,
                    phase,
                )
            trained = [r for r in rows if "share" in r]
            given_up = [r for r in rows if "share" not in r]
            first_two = [r for r in given_up if r["step"] <= 2]
            medians = ratios(trained)
            print("\npatched / whole, medians over the steps: " + ", ".join(
                f"{k} {v:.3f}" for k, v in medians.items()
            ))  # fmt: skip
            print(
                "every element changed, push patched / twin (the same table's history, "
                f"whole): {ratios(given_up, TWIN)['push_s']:.3f} over every round, "
                f"{ratios(first_two, TWIN)['push_s']:.3f} over the first two; patched / "
                f"whole: {ratios(given_up)['push_s']:.3f}, "
                f"{ratios(first_two)['push_s']:.3f} over the first two"
            )
            for label, chosen in (("every round", given_up), ("the first two", first_two)):
                mine, twin, share = give_up_cost(chosen)
                print(
                    f"every element changed, outside the store ({label}): patched "
                    f"{mine * 1e3:.1f} ms, twin {twin * 1e3:.1f} ms; the difference is "
                    f"{share:+.1%} of twin's push"
                )
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
