"""RESULTS.md sections 1-4, the size sweep: throughput vs size, above 2 GiB, many small
arrays vs few large ones, and pull_if_newer when nothing changed; and two parts of section
9 (issue 15): Redis against both hand-written pushes and the raw TCP floor, and
pull_if_newer on a Reverb server of many tables."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .common import GB, LABELS, MB, machine_line, paired_ratio, seconds_text, size_label, summary
from .report_base import (
    FLOOR,
    REDIS_BASELINES,
    VIEWS,
    Results,
    Stat,
    floor_share,
    num,
    rate,
    ratio_cell,
    refusal_word,
    rel,
    table,
    time_cell,
)

CONTENDERS = [
    "memory",
    "reverb",
    "varsync drop-in",
    "tf-agents",
    "redis",
    "redis-py",
    "redis-py pipelined",
    "shm",
]
SPLIT_NOTE = (
    "varsync reads a table's version through Reverb's `server_info`, whose reply carries the "
    "signature of every table on the server, one `TensorSpec` per leaf. A {leaves}-leaf table "
    "on a server therefore slows `version`, `pull_if_newer`, `push` and `pull` on every table "
    "of that server (measured while building this suite: 0.23 ms per call with one 4-leaf "
    "table, 8.7 ms once a 500-leaf table is added). That is why each many-array case here "
    "has a Reverb server of its own."
)


def throughput_section(r: Results, images: dict[str, Path], out: Path) -> list[str]:
    sizes = r.sizes("few")
    if not sizes:
        return []
    head = ["", *map(size_label, sizes)]
    lines = ["## 1. Throughput vs size: 4 large float32 arrays", ""]
    if "throughput" in images:
        lines += [f"![Throughput vs nest size]({rel(images['throughput'], out.parent)})", ""]
    lines += [
        f"*{machine_line(r.m)}.* Each backend was timed in a group with its baselines "
        "(Reverb with TF-Agents' container on the same server and table, Redis with "
        "redis-py on the same server, every group with `np.copyto` of the same bytes into "
        "existing arrays); within a round the group's operations take turns, the first "
        "turn rotating from round to round. memory:// and shm:// pulls return read-only "
        "views of the stored bytes (no copy), so their pull is not a transfer: compare "
        "backends on update, which lands the bytes in `tf.Variable`s.",
        "",
    ]
    for op, title in (("push", "push"), ("pull", "pull"), ("update", "update into tf.Variables")):
        rows = []
        for name in CONTENDERS:
            cells = []
            for nbytes in sizes:
                s = r.stat("few", nbytes, name, op)
                reason = r.refusal("few", nbytes, name)
                cells.append(time_cell(s) if s else (refusal_word(reason) if reason else "–"))
            if any(c != "–" for c in cells):
                rows.append([LABELS[name]] + cells)
        lines += [f"**{title}**: median time (IQR)", ""] + table(head, rows)
    rows = []
    for name, op in (("np.copyto", "copy"), ("np.copyto fresh", "copy"), ("tf assign", "update")):
        rows.append([LABELS[name]] + [time_cell(r.stat("few", n, name, op)) for n in sizes])
    lines += ["**the physical reference**: median time (IQR)", ""] + table(head, rows)
    lines += [
        "**ratios**, median over rounds of (time / baseline's time in the same round), "
        "IQR in brackets; below 1 is faster than the baseline. `np.copyto` and "
        "`tf.Variable.assign` (from numpy, the floor of any update into TensorFlow "
        "variables) were timed in every group.",
        "",
    ]
    return lines + table(head, _ratio_rows(r, sizes))


def _ratio_rows(r: Results, sizes: list[int]) -> list[list[str]]:
    def row(label: str, group: str, mine: tuple[str, str], other: tuple[str, str]) -> list[str]:
        return [label] + [ratio_cell(r.ratio("few", n, group, mine, other)) for n in sizes]

    rows = [
        row(f"reverb / TF-Agents, {op}", "reverb", ("reverb", op), ("tf-agents", op))
        for op in ("push", "pull", "update")
    ]
    rows.append(
        ["reverb / TF-Agents, push+pull"] + [ratio_cell(r.push_pull_ratio("few", n)) for n in sizes]
    )
    rows.append(
        row(
            "drop-in / TF-Agents, pull",
            "reverb",
            ("varsync drop-in", "pull"),
            ("tf-agents", "pull"),
        )
    )
    rows.append(
        ["drop-in / TF-Agents, push+pull"]
        + [ratio_cell(r.push_pull_ratio("few", n, "varsync drop-in")) for n in sizes]
    )
    rows += [
        row(f"redis / redis-py, {op}", "redis", ("redis", op), ("redis-py", op))
        for op in ("push", "pull", "update")
    ]
    rows.append(
        row(
            "redis / redis-py pipelined, push",
            "redis",
            ("redis", "push"),
            ("redis-py pipelined", "push"),
        )
    )
    rows += [
        row(f"{name} push / np.copyto", name, (name, "push"), ("np.copyto", "copy"))
        for name in ("memory", "reverb", "redis", "shm")
    ]
    rows += [
        row(f"{name} update / tf.Variable.assign", name, (name, "update"), ("tf assign", "update"))
        for name in ("memory", "reverb", "redis", "shm")
    ]
    return rows


def big_section(r: Results) -> list[str]:
    bigs = [c for c in r.raw.get("cases", []) if c["nbytes"] > 2**31]
    skipped = [s for s in r.raw.get("skipped", []) if "GB" in s.split(":")[0]]
    if not bigs and not skipped:
        return []
    lines = ["## 2. Above 2 GiB", ""]
    for case in bigs:
        n = case["nbytes"]
        lines += [
            f"*{machine_line(r.m)}.* One nest of {size_label(n)} ({n / 2**30:.2f} GiB, "
            f"4 float32 arrays of {n / 4 / MB:.0f} MB), {case['rounds']} rounds; update "
            "into tf.Variables not timed at this size (memory).",
            "",
        ]
        rows = []
        for name in CONTENDERS + ["np.copyto", "np.copyto fresh"]:
            reason = r.refusal("few", n, name)
            if reason:
                rows.append([LABELS[name], reason, "", ""])
                continue
            op = "copy" if name.startswith("np.") else None
            push = r.stat("few", n, name, op or "push")
            if not push:
                continue
            pull = r.stat("few", n, name, "pull") if not op else None
            poll = r.poll("few", n, name)
            pull_text = ""
            if pull:
                how = "read-only views, no copy" if name in VIEWS else rate(n, pull)
                pull_text = f"{time_cell(pull)}, {how}"
            rows.append(
                [
                    LABELS[name],
                    f"{time_cell(push)}, {rate(n, push)}",
                    pull_text,
                    time_cell(poll) if poll else "",
                ]
            )
        lines += table(["", "push (or copy)", "pull", "pull_if_newer unchanged"], rows)
    for s in skipped:
        lines += [f"- {s}", ""]
    return lines


def many_section(r: Results) -> list[str]:
    sizes = r.sizes("many")
    if not sizes:
        return []
    leaves = next((c["leaves"] for c in r.raw.get("cases", []) if c["layout"] == "many"), 500)
    lines = [
        f"## 3. Many small arrays ({leaves} variables) vs few large ones (4)",
        "",
        f"*{machine_line(r.m)}.* The same total bytes split into {leaves} float32 "
        "vectors, as a policy network with many layers would be; per-array costs "
        "(requests, signature checks, assignments) show here.",
        "",
    ]
    rows = []
    ops_of = {"np.copyto": ["copy"], "tf assign": ["update"]}
    for name in CONTENDERS + ["np.copyto", "tf assign"]:
        for op in ops_of.get(name, ["push", "pull", "update"]):
            cells = []
            for n in sizes:
                few, many = r.stat("few", n, name, op), r.stat("many", n, name, op)
                cells += [time_cell(many), _times(many, few)]
            if any(c != "–" for c in cells):
                rows.append([f"{LABELS[name]} {op}"] + cells)
    notes = []
    for name in ["memory", "reverb", "redis", "shm"]:
        cells = []
        for n in sizes:
            few, many = r.poll("few", n, name), r.poll("many", n, name)
            cells += [time_cell(many), _times(many, few)]
            if name == "reverb" and few and many and many["median"] > 5 * few["median"]:
                notes.append(
                    f"On Reverb, learning that nothing changed costs "
                    f"{seconds_text(many['median'])} with {leaves} arrays against "
                    f"{seconds_text(few['median'])} with 4, at {size_label(n)}: "
                    + SPLIT_NOTE.format(leaves=leaves)
                )
        rows.append([f"{LABELS[name]} pull_if_newer unchanged"] + cells)
    head = [""]
    for n in sizes:
        head += [f"{size_label(n)}, {leaves} arrays", "vs 4 arrays"]
    lines += table(head, rows)
    for note in notes[:1]:
        lines += [note, ""]
    return lines


def _times(many: Stat | None, few: Stat | None) -> str:
    return f"{many['median'] / few['median']:.2f}×" if few and many else "–"


def poll_section(r: Results, images: dict[str, Path], out: Path) -> list[str]:
    sizes = sorted({b for (lay, b, _) in r.polls if lay == "few"})
    if not sizes:
        return []
    lines = ["## 4. pull_if_newer when nothing changed", ""]
    if "poll_latency" in images:
        picture = rel(images["poll_latency"], out.parent)
        lines += [f"![pull_if_newer latency vs size]({picture})", ""]
    lines += [
        f"*{machine_line(r.m)}.* Median (p90) of {r.plan.get('polls', '?')} calls "
        f"({r.plan.get('reverb_polls', '?')} on Reverb), each timed alone, after the "
        "size's rounds. TF-Agents' container has no version to compare: to learn the "
        "train step it pulls the whole nest (its pull time is shown).",
        "",
    ]
    rows = []
    for name in ["memory", "reverb", "redis", "shm"]:
        cells = []
        for n in sizes:
            s = r.poll("few", n, name)
            cells.append(f"{seconds_text(s['median'])} ({seconds_text(s['p90'])})" if s else "–")
        rows.append([LABELS[name]] + cells)
    pulls = [r.stat("few", n, "tf-agents", "pull") for n in sizes]
    rows.append(
        ["TF-Agents: a full pull"] + [seconds_text(s["median"]) if s else "–" for s in pulls]
    )
    return lines + table(["", *map(size_label, sizes)], rows)


def wire_section(r: Results) -> list[str]:
    rows = []
    for n in r.sizes("few"):

        def t(contender: str, op: str, n: int = n) -> str:
            return time_cell(_samples(r.by_group.get(("few", n, "redis", contender, op))))

        floor = _samples(r.by_group.get(("few", n, "redis", *FLOOR)))
        if floor is None:
            continue
        ratios = [
            paired_ratio(m, b)
            for m, b in (
                (
                    r.by_group.get(("few", n, "redis", "redis", "push")),
                    r.by_group.get(("few", n, "redis", *base)),
                )
                for base in REDIS_BASELINES
            )
            if m and b
        ]
        push, pull = floor_share(r, n, "push"), floor_share(r, n, "pull")
        rows.append(
            [
                size_label(n),
                t("redis", "push"),
                t("redis-py", "push"),
                t("redis-py pipelined", "push"),
                " / ".join(f"{s['median']:.2f}" for s in ratios) or "–",
                t("redis", "push, new table"),
                t("redis", "pull"),
                t("redis-py", "pull"),
                f"{time_cell(floor)}, {n / floor['median'] / GB:.2f} GB/s",
                f"{num(push['median'])} %" if push else "–",
                f"{num(pull['median'])} %" if pull else "–",
            ]
        )
    if not rows:
        return []
    return [
        "### Redis: both hand-written pushes and the wire's floor, same rounds",
        "",
        "Medians (IQR) over the Redis group's rounds. Hand-written push: one `SET` per "
        "leaf (`r.set(key, leaf.tobytes())`), and the same `SET`s in one redis-py "
        "pipeline (`transaction=False`, one round trip). The floor: the nest's bytes over "
        "a raw loopback TCP socket pair, `sendall` of each leaf's memory into a receiver "
        "thread's `recv_into` of a buffer allocated once, until every byte arrived; "
        "\"% of floor\" is the floor's time over varsync's, round by round. A new table's "
        "first push: once per round, into a table made (untimed) for it.",
        "",
    ] + table(
        [
            "nest",
            "varsync push",
            "per-leaf SETs",
            "pipelined SETs",
            "push / per-leaf, / pipelined",
            "first push, new table",
            "varsync pull",
            "hand GETs",
            "raw TCP floor",
            "push, % of floor",
            "pull, % of floor",
        ],
        rows,
    )


def many_tables_section(r: Results) -> list[str]:
    tables = r.raw.get("many_tables")
    if not tables:
        return []
    s = summary(tables["samples"])
    sweep = [p for (lay, _, c), p in r.polls.items() if lay == "few" and c == "reverb"]
    shown = (
        f"; on the sweep's server (a table of 4 leaves per size) "
        f"{seconds_text(statistics.median(sweep[0]))} at the smallest size"
        if sweep
        else ""
    )
    return [
        "### Reverb: pull_if_newer with many tables on the server",
        "",
        f"A Reverb server of its own holding {tables['tables']} tables of {tables['leaves']} "
        f"float32 leaves ({size_label(tables['table_bytes'])} each, every one pushed once); "
        f"{s['n']} calls of `pull_if_newer` unchanged on one of them, each timed alone: "
        f"median {seconds_text(s['median'])}, p90 {seconds_text(s['p90'])}, max "
        f"{seconds_text(s['max'])}{shown}.{_where_polls_go(tables)}",
        "",
    ]


def _where_polls_go(tables: dict[str, Any]) -> str:
    """Where a poll's time goes, server and client, against a server of one table."""
    cpu, one = tables.get("cpu"), tables.get("one_table")
    if not cpu or not one:
        return ""
    single = summary(one["samples"])
    return (
        f" Where it goes, CPU per call taken around all the calls: the Reverb servers' "
        f"process {seconds_text(cpu['server'])} (every thread), this process "
        f"{seconds_text(cpu['client'])} (every thread: gRPC's, and whatever else of the "
        "suite's ran meanwhile); the same calls on a server of one table (the sweep's "
        "smallest case, same stage) took "
        f"{seconds_text(single['median'])} (median), the server "
        f"{seconds_text(one['cpu']['server'])} and this process "
        f"{seconds_text(one['cpu']['client'])} of CPU. A version check asks for the "
        "table's count of inserts, which only Reverb's ServerInfo answers, and it answers "
        f"with every table's info, signature included ({tables['reply_bytes']:,} bytes "
        f"serialized here, {one['reply_bytes']:,} with one table): the server builds "
        "them all and the client receives them all on each call, a cost that grows with "
        "the tables on the server, not with the table polled, and that varsync cannot "
        "ask Reverb to skip."
    )


def _samples(values: list[float] | None) -> Stat | None:
    return summary(values) if values else None
