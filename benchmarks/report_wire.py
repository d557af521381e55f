"""RESULTS.md section 9's "where the time goes" (issue 15.4): the CPU accounting and py-spy
profile that ``wire_profile.py`` took in the Redis group at the cases that ask for it."""

from __future__ import annotations

import statistics
from typing import Any

from .common import seconds_text, size_label
from .report_base import Results, table
from .wire_profile import CATEGORIES, OTHER

CALLS = {
    ("redis", "push"): "varsync push",
    ("redis", "pull"): "varsync pull",
    ("tcp loopback", "transfer"): "raw TCP floor",
}
SHOWN = [name for name, _ in CATEGORIES] + [OTHER]


def _median(records: list[dict[str, float]], field: str) -> float:
    if field == "client":
        return statistics.median(r["client_user"] + r["client_kernel"] for r in records)
    return statistics.median(r[field] for r in records)


def _records(r: Results) -> list[dict[str, Any]]:
    order = list(CALLS)
    return sorted(
        (
            w
            for w in r.raw.get("wire_profile", [])
            if (w["contender"], w["op"]) in CALLS and w["cpu"]
        ),
        key=lambda w: (w["bytes"], order.index((w["contender"], w["op"]))),
    )


def wire_time_section(r: Results) -> list[str]:
    records = _records(r)
    if not records:
        return []
    cpu_rows = []
    for w in records:
        cpu = w["cpu"]
        wall = _median(cpu, "wall")

        def cell(field: str, cpu: list[dict[str, float]] = cpu, wall: float = wall) -> str:
            return f"{seconds_text(_median(cpu, field))} ({_share(_median(cpu, field), wall)})"

        cpu_rows.append(
            [
                size_label(w["bytes"]),
                CALLS[(w["contender"], w["op"])],
                f"{seconds_text(wall)} ({len(cpu)})",
                cell("thread"),
                cell("client"),
                _kernel_share(cpu, "client_user", "client_kernel"),
                cell("server"),
                _kernel_share(cpu, "server_user_ticks", "server_kernel_ticks"),
                f"{_median(cpu, 'client_faults'):.0f}",
                _share(max(0.0, wall - _median(cpu, "thread")), wall),
            ]
        )
    lines = [
        "### Redis: where the time goes",
        "",
        "Where the Redis group's timed varsync pushes and pulls and the raw TCP floor's "
        "transfers spent their time, at the sizes the cases name (`Case.profile`: the "
        "small pushes of 15.3 and the wire's targets of 15.4; "
        "`benchmarks/wire_profile.py`). **CPU**: around each timed sample, outside its "
        "clock, and divided by its calls: the CPU of the thread making the calls "
        "(`time.thread_time`), this process's CPU and minor page faults (`getrusage`: "
        "every thread, so the floor's receiver thread too, and any background thread "
        "of the libraries loaded; its split between user and kernel comes from clock "
        "ticks, so it is summed over the rounds) and the redis-server's CPU "
        "(`/proc/<pid>/schedstat` of its main thread, which does its work; the share "
        "of it in the kernel from its user and kernel ticks of "
        "`/proc/<pid>/stat`, 10 ms each, summed over the rounds): medians over the timed "
        "rounds (their count in brackets after the wall time), each also as a share of "
        "the wall time. The last column is the wall time the calling thread spent off "
        "CPU (wall minus its CPU): waiting for the server or the wire. A kernel share "
        "on the client is its socket calls: copying the "
        "bytes between the socket and the arrays, and faulting in the pages of arrays "
        "it has not written before (a pull's arrays are new, except that redis:// "
        "takes for those of 1 MiB or more the memory of an earlier pull's arrays "
        "nothing references any more, `reuse_pulled`; the floor receives into arrays "
        "written before, and sends from the nest).",
        "",
    ]
    lines += table(
        [
            "nest",
            "call",
            "wall (rounds)",
            "calling thread's CPU",
            "client process's CPU",
            "of it in the kernel",
            "redis-server CPU",
            "of it in the kernel",
            "client page faults",
            "calling thread off CPU",
        ],
        cpu_rows,
    )
    spy_rows, skipped = [], set()
    for w in records:
        spy = w.get("py_spy")
        if not spy:
            continue
        if "skipped" in spy:
            skipped.add(spy["skipped"])
            continue
        spy_rows.append(_spy_row(w, spy))
    if spy_rows:
        lines += [
            "**py-spy** (`py-spy record --nonblocking`, "
            f"{records[0]['py_spy'].get('rate', '')} samples a second) of this process "
            "during more of the same calls after the timed rounds (untimed; their count "
            "in brackets): of the samples taken in those calls, the share whose "
            "innermost frame of varsync's code is in each part (what runs below it is C: "
            "the socket call, the CRC, numpy's allocation). py-spy takes no sample of a "
            "thread waiting in the kernel, and fewer than its rate of one that runs "
            "(reading a running process's stack fails at times), so these are shares of "
            "the thread's time on CPU; how much of the wall time it was off CPU, "
            "waiting for the server or the wire, is the CPU table's last column.",
            "",
        ]
        lines += table(["nest", "call (profiled)", "samples", *SHOWN], spy_rows)
    for why in sorted(skipped):
        lines += [f"py-spy profile: not taken ({why}).", ""]
    lines += _reading(records)
    return lines


def _shares(spy: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """The samples taken in the calls, and each part's share of them."""
    samples: dict[str, int] = spy["samples"]
    taken = sum(samples.get(name, 0) for name in SHOWN)
    return taken, {name: samples.get(name, 0) / taken if taken else 0.0 for name in SHOWN}


def _spy_row(w: dict[str, Any], spy: dict[str, Any]) -> list[str]:
    taken, shares = _shares(spy)
    return [
        size_label(w["bytes"]),
        f"{CALLS[(w['contender'], w['op'])]} ({spy['calls']})",
        str(taken),
        *(f"{shares[name]:.0%}" for name in SHOWN),
    ]


def _kernel_share(cpu: list[dict[str, float]], user_field: str, kernel_field: str) -> str:
    """The kernel's share of CPU split by clock ticks, summed over the rounds."""
    user = sum(r[user_field] for r in cpu)
    kernel = sum(r[kernel_field] for r in cpu)
    return _share(kernel, user + kernel) if user + kernel > 0 else "– (no tick)"


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "–"


def _reading(records: list[dict[str, Any]]) -> list[str]:
    """One sentence per size, from the figures: each varsync call against the floor, its
    calling thread's time on and off CPU and py-spy's largest part of the time on CPU,
    and the redis-server's CPU."""
    by_size: dict[int, dict[tuple[str, str], dict[str, Any]]] = {}
    for w in records:
        by_size.setdefault(w["bytes"], {})[(w["contender"], w["op"])] = w
    lines = []
    for n, calls in sorted(by_size.items()):
        floor = calls.get(("tcp loopback", "transfer"))
        bits = []
        for key in (("redis", "push"), ("redis", "pull")):
            mine = calls.get(key)
            if mine is None:
                continue
            cpu = mine["cpu"]
            wall, thread = _median(cpu, "wall"), _median(cpu, "thread")
            text = (
                f"{CALLS[key]} {seconds_text(wall)}"
                + (f" ({wall / _median(floor['cpu'], 'wall'):.1f}× the floor's)" if floor else "")
                + f": its thread on CPU {_share(thread, wall)} of it"
            )
            spy = _largest_part(mine.get("py_spy"))
            if spy is not None:
                text += f" (most in {spy[0]}: {spy[1]:.0%} of the samples)"
            text += (
                f", off CPU {_share(max(0.0, wall - thread), wall)}; the redis-server "
                f"on CPU {_share(_median(cpu, 'server'), wall)} of it"
            )
            bits.append(text)
        if floor is not None:
            f_cpu = floor["cpu"]
            f_wall = _median(f_cpu, "wall")
            bits.append(
                f"the floor {seconds_text(f_wall)}, its process on CPU "
                f"{_share(_median(f_cpu, 'client'), f_wall)} of it (two threads), "
                f"{_kernel_share(f_cpu, 'client_user', 'client_kernel')} of that "
                "in the kernel"
            )
        if bits:
            lines.append(f"- **{size_label(n)}**: " + "; ".join(bits) + ".")
    return lines + [""] if lines else []


def _largest_part(spy: dict[str, Any] | None) -> tuple[str, float] | None:
    if not spy or "skipped" in spy:
        return None
    taken, shares = _shares(spy)
    if not taken:
        return None
    name = max(shares, key=lambda k: shares[k])
    return name, shares[name]
