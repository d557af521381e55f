"""The cross-backend group: its plans, its servers and its stages, in order.

1. the size sweep (groups.py): every backend beside its baselines, 1 KB to 1 GB, 4 float32
   arrays, and 500 small arrays at 1 MB;
2. ``pull_if_newer`` on a Reverb server of 50 tables beside its ServerInfo floor;
3. fan-out and reader memory (readers.py).

Servers and reader processes start together, before anything is timed, and stop on the
way out (also on an error or Ctrl-C).
"""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import asdict, dataclass
from typing import Any, Callable

from . import groups, readers
from .groups import Case
from .harness import GB, KB, MB, signature_of, stage
from .servers import ReverbProcess, running_redis_server

MODULES = ("tensorflow", "reverb", "tf_agents")


@dataclass
class Plan:
    cases: list[Case]
    fanout: readers.Readers
    reader_memory: readers.Readers
    polls: int = 1000
    reverb_polls: int = 300
    tables: int = 50  # pull_if_newer on one of them, each of 20 leaves
    table_polls: int = 300


def full_plan() -> Plan:
    """``make bench``'s: about 12 minutes on 2 cores."""
    return Plan(
        cases=[
            Case(4, 1 * KB, 15, 20),
            Case(4, 10 * KB, 15, 20),
            Case(4, 100 * KB, 15, 10),
            Case(4, 1 * MB, 11, 3),
            Case(4, 10 * MB, 7),
            Case(4, 40 * MB, 9),
            Case(4, 100 * MB, 5),
            Case(4, 400 * MB, 4, first_push=True),
            Case(4, 1 * GB, 3, first_push=True),
            Case(500, 1 * MB, 11),
        ],
        fanout=readers.Readers(100 * MB, [1, 2, 4, 8], 3),
        reader_memory=readers.Readers(400 * MB, [4], 2),
    )


def quick_plan() -> Plan:
    return Plan(
        cases=[Case(4, 1 * KB, 3, 5), Case(4, 10 * MB, 3, first_push=True), Case(500, 1 * MB, 3)],
        fanout=readers.Readers(10 * MB, [1, 2], 2),
        reader_memory=readers.Readers(10 * MB, [2], 2),
        polls=200,
        reverb_polls=100,
        table_polls=100,
    )


def smoke_plan() -> Plan:
    return Plan(
        cases=[Case(4, 10 * KB, 2, first_push=True), Case(50, 100 * KB, 2)],
        fanout=readers.Readers(100 * KB, [1, 2], 1),
        reader_memory=readers.Readers(100 * KB, [2], 1),
        polls=20,
        reverb_polls=20,
        tables=5,
        table_polls=20,
    )


def unavailable(backends: list[str]) -> str | None:
    needed = [*MODULES] if "reverb" in backends else ["tensorflow"]
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        return f"{', '.join(missing)} not installed here (this group runs in the TF env, .venv)"
    return None


def run(
    plan: Plan,
    out: dict[str, Any],
    log: Callable[[str], None],
    backends: list[str],
    sizes: list[int] | None = None,
) -> None:
    """Every stage, into ``out``: "sweep" (one record per operation and size), "tables",
    "fanout", "reader_memory". ``backends``, ``sizes``: only these (a focused run)."""
    cases = [c for c in plan.cases if sizes is None or c.nbytes in sizes]
    out.update({"plan": asdict(plan) | {"cases": [asdict(c) for c in cases]}, "sweep": []})
    whole = sizes is None and set(backends) == set(groups.GROUPS)
    timings = out.setdefault("stage_seconds", {})
    with contextlib.ExitStack() as stack:
        servers: dict[str, dict[str, Any]] = {}
        if "reverb" in backends:
            servers = {c.name: {c.name: signature_of(c.nbytes, c.leaves)} for c in cases}
            if whole:
                servers["fanout"] = {"fanout": signature_of(plan.fanout.nbytes, 4)}
                many = {f"t{i:02d}": signature_of(80 * KB, 20) for i in range(plan.tables)}
                servers["tables"] = many
        reverb = ReverbProcess(servers) if servers else None
        if reverb is not None:
            stack.callback(reverb.stop)
        processes = readers.ReaderProcesses(max(plan.fanout.counts)) if whole else None
        if processes is not None:
            stack.callback(processes.stop)
        redis_server = stack.enter_context(running_redis_server())
        pid, addresses = reverb.wait() if reverb is not None else (0, {})
        if processes is not None:
            processes.wait_up()
        ctx = groups.Context(redis_server.url, addresses, plan.polls, plan.reverb_polls)
        with stage("the size sweep", log, timings):
            for case in cases:
                groups.sweep_case(ctx, case, backends, out["sweep"], log)
        if "tables" in addresses:
            with stage(f"pull_if_newer with {plan.tables} Reverb tables", log, timings):
                names = sorted(servers["tables"])
                out["tables"] = groups.many_tables(addresses["tables"], names, plan.table_polls)
        if processes is not None:
            with stage("fan-out and reader memory", log, timings):
                fan, mem = plan.fanout, plan.reader_memory
                out.update(readers.run(processes, (pid, addresses["fanout"]), fan, mem, log))
