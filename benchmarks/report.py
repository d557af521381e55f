"""RESULTS.md from the raw results (the one report path: suite.py calls :func:`render`).

Every time is a median over rounds with its interquartile range; every ratio is the
median over rounds of (time / its baseline's time in the same round). The targets are
named by what they measure; a target whose baseline is a measured floor (a call the
operation cannot avoid) is stated as a ratio to that floor.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from .harness import (
    GB,
    MB,
    paired_ratio,
    ratio_text,
    seconds_text,
    size_label,
    spread_text,
    summary,
)

LABELS = {
    "memory": "varsync memory://",
    "reverb": "varsync reverb://",
    "redis": "varsync redis://",
    "shm": "varsync shm://",
    "varsync drop-in": "varsync.compat.tf_agents drop-in (tf.Variables)",
    "tf-agents": "TF-Agents ReverbVariableContainer",
    "redis-py SETs": "redis-py, a SET per leaf",
    "redis-py pipelined SETs": "redis-py, SETs in one pipeline",
    "redis-py MULTI/EXEC": "redis-py, atomic MULTI/EXEC of chunks + version",
    "tcp loopback": "raw loopback TCP (the wire's floor)",
    "np.copyto": "np.copyto into existing arrays",
    "tf assign": "tf.Variable.assign from numpy",
}


def label(contender: str) -> str:
    return LABELS.get(contender, contender)


@dataclass
class Target:
    """``key``'s time / ``base``'s in the same rounds ≤ ``limit`` (None: recorded), in
    ``group`` at sizes ``low``..``high`` of ``leaves`` arrays; keys are "contender|op"."""

    what: str
    group: str
    key: str
    base: str
    limit: float | None
    low: int = 0
    high: int = 10 * GB
    leaves: int = 4


_TARGETS = [  # what, group, key, baseline, limit, low, high, leaves
    ("Reverb push+pull vs TF-Agents'", "reverb", "reverb|push+pull", "tf-agents|push+pull", 1.0,
     0, MB),
    ("Reverb push+pull vs TF-Agents'", "reverb", "reverb|push+pull", "tf-agents|push+pull", 0.75,
     10 * MB),
    ("Reverb drop-in push+pull vs TF-Agents'", "reverb", "varsync drop-in|push+pull",
     "tf-agents|push+pull", 1.0, 0, MB),
    ("Reverb drop-in push+pull vs TF-Agents'", "reverb", "varsync drop-in|push+pull",
     "tf-agents|push+pull", 0.75, 10 * MB),
    ("Reverb update of 500 variables vs TF-Agents'", "reverb", "reverb|update", "tf-agents|update",
     1.0, 0, 10 * GB, 500),
    ("Redis push vs the atomic hand-written publish (MULTI/EXEC)", "redis", "redis|push",
     "redis-py MULTI/EXEC|push", 1.0, 0, 100 * MB),
    ("Redis push vs the atomic hand-written publish (MULTI/EXEC)", "redis", "redis|push",
     "redis-py MULTI/EXEC|push", 0.5, 400 * MB),
    ("Redis push vs pipelined SETs (not atomic)", "redis", "redis|push",
     "redis-py pipelined SETs|push", None),
    ("Redis pull vs hand-written GETs", "redis", "redis|pull", "redis-py SETs|pull", 0.5, 10 * MB),
    ("Redis push vs the wire's floor, raw loopback TCP", "redis", "redis|push",
     "tcp loopback|transfer", 2.0, 100 * MB),
    ("Redis pull vs the wire's floor, raw loopback TCP", "redis", "redis|pull",
     "tcp loopback|transfer", 2.0, 100 * MB),
    ("Redis first push of a new table vs its floor, an atomic publish into new keys", "redis",
     "redis|push, new table", "redis-py MULTI/EXEC|push, new keys", 1.0),
    ("shm pull + read vs np.copyto", "shm", "shm|pull + read", "np.copyto|copy", 2.0, 10 * MB),
    *[(f"{b}:// update vs its floor, tf.Variable.assign", b, f"{b}|update", "tf assign|update",
       None, 100 * MB) for b in ("memory", "reverb", "redis", "shm")],
]  # fmt: skip
TARGETS = [Target(*row) for row in _TARGETS]  # type: ignore[arg-type]
POLL_LIMITS = {"reverb": 2e-3, "redis": 1e-3}  # pull_if_newer unchanged, median, any size
TABLES_LIMIT = 1.2  # pull_if_newer on one of many Reverb tables / server_info, its floor
FRAMEWORK_TARGETS = [  # part, (contender, op), baseline, limit
    ("torch shm", ("varsync shm://", "update(module)"), ("torch", "load_state_dict(copy)"), 1.3),
    ("torch shm, 1 thread", ("varsync shm://", "update(module)"),
     ("torch", "load_state_dict(copy)"), 1.3),
    ("torch redis", ("varsync redis://", "push+pull"), ("by hand", "push+pull"), 0.5),
    ("torchrl", ("varsync shm://", "send+apply"), ("torchrl SharedMem", "send"), 1.0),
    ("jax shm", ("varsync shm://", "pull(like=tree)"), ("jax", "device_put(numpy)"), 1.3),
]  # fmt: skip


def verdict(value: float, limit: float | None, spread: dict[str, float] | None = None) -> str:
    if limit is None:
        return "recorded"
    text = "**met**" if value <= limit else "**missed**"
    if spread and spread["q1"] <= limit <= spread["q3"]:
        text += " (the IQR straddles it)"
    return text


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *["| " + " | ".join(r) + " |" for r in rows],
        "",
    ]


def sweep_index(results: dict[str, Any]) -> dict[tuple[str, int, int, str, str], dict[str, Any]]:
    records = results.get("cross-backend", {}).get("sweep", [])
    return {(r["group"], r["leaves"], r["bytes"], r["contender"], r["op"]): r for r in records}


def size_columns(index: dict[Any, Any], leaves: int) -> list[int]:
    return sorted({k[2] for k in index if k[1] == leaves})


# -- sections -------------------------------------------------------------------------


def header(results: dict[str, Any]) -> list[str]:
    m = results["machine"]
    lines = [
        "# varsync benchmarks",
        "",
        "Rendered by `python -m benchmarks.suite` ([how to run and read it]"
        f"(../docs/benchmarks.md)) "
        f"on {m['started']}, commit {m['tree']['commit']}"
        + (
            f" (library files modified: {', '.join(m['tree']['modified'])})"
            if m["tree"]["modified"]
            else ""
        )
        + f". **Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gib']:.0f} GiB**, "
        f"{m['platform']}; Python {m['python']}, numpy {m['numpy']}.",
        "",
        f"Load average (start → end): {loads(results)} (a shared machine: single times swing "
        "by tens of percent). Times are medians "
        "over rounds (IQR in brackets); ratios are medians over rounds of the within-round "
        "ratio against a baseline timed in the same rounds; below 1 is faster. Raw samples: "
        "`benchmarks/out/results.json` (not in git).",
        "",
    ]
    fresh = results.get("fresh_memory")
    if fresh:
        lines += [
            f"**Fresh memory**: writing {size_label(fresh['nbytes'])} into new arrays ran at "
            f"{fresh['again']:.2f} GB/s into pages just freed, {fresh['after_idle']:.2f} GB/s "
            "after 5 s idle: every pull into new arrays and a server's first write pays this.",
            "",
        ]
    for group, reason in results.get("skipped", {}).items():
        lines += [f"*Group {group} not run here: {reason}.*", ""]
    return lines


def loads(results: dict[str, Any]) -> str:
    """Each group's load average when it started and ended (its run's, when merged)."""
    groups = [(g, results[g]) for g in ("cross-backend", "frameworks", "delta") if g in results]
    return "; ".join(
        f"{g} ({r['machine']['started']}) {r['machine']['load_average'][0]:.1f} → "
        + (f"{r['load_average_end'][0]:.1f}" if "load_average_end" in r else "?")
        for g, r in groups
    )


def targets(results: dict[str, Any]) -> list[str]:
    index = sweep_index(results)
    rows = []
    for t in TARGETS:
        for nbytes in size_columns(index, t.leaves):
            (c, op), (bc, bop) = t.key.split("|"), t.base.split("|")
            mine = index.get((t.group, t.leaves, nbytes, c, op))
            base = index.get((t.group, t.leaves, nbytes, bc, bop))
            if not (t.low <= nbytes <= t.high and mine and base):
                continue
            r = paired_ratio(mine["samples"], base["samples"])
            where = f"{size_label(nbytes)}" + (f", {t.leaves} arrays" if t.leaves != 4 else "")
            rows.append(target_row(t.what, where, r, t.limit))
    polls = [r for k, r in index.items() if k[4] == "pull_if_newer" and k[0] in POLL_LIMITS]
    for group, limit in POLL_LIMITS.items():
        medians = [summary(r["samples"])["median"] for r in polls if r["group"] == group]
        if medians:
            what = f"{label(group)}: pull_if_newer unchanged < {seconds_text(limit)}, every size"
            span = f"{seconds_text(min(medians))}–{seconds_text(max(medians))}"
            rows.append([what, f"{len(medians)} sizes", span, verdict(max(medians), limit)])
    tables = results.get("cross-backend", {}).get("tables")
    if tables:
        r = paired_ratio(tables["pull_if_newer"], tables["server_info"])
        what = "Reverb pull_if_newer, one of many tables, vs its floor, a ServerInfo request"
        where = f"{results['cross-backend']['plan']['tables']} tables"
        rows.append(target_row(what, where, r, TABLES_LIMIT))
    rows += framework_targets(results.get("frameworks", {}))
    rows += delta_targets(results.get("delta", {}))
    met = sum(r[-1].startswith("**met") for r in rows)
    limited = sum(not r[-1].startswith("recorded") for r in rows)
    return [
        "## Targets",
        "",
        f"Met: {met} of {limited} with a limit. A verdict is this run's median against the "
        "limit, as it came out.",
        "",
        *table(["target", "where", "this run", "verdict"], rows),
    ]


def sweep(results: dict[str, Any]) -> list[str]:
    index = sweep_index(results)
    if not index:
        return []
    lines = [
        "## 1. Every backend beside its baselines, by size",
        "",
        "![Throughput vs nest size](../docs/img/throughput.png)",
        "",
        "4 float32 arrays (×500: 500 small ones), random values. Each backend ran in a group "
        "with its baselines, taking turns within every round (`np.copyto` and "
        "`tf.Variable.assign` are shown from the memory:// group). memory:// and shm:// pulls "
        "return views (no copy): compare backends on update (the bytes land in tf.Variables).",
        "",
    ]
    layouts = sorted({k[1] for k in index}, key=lambda lv: (lv != 4, lv))
    columns = [(lv, n) for lv in layouts for n in size_columns(index, lv)]
    names = [size_label(n) + ("" if lv == 4 else f" ×{lv}") for lv, n in columns]
    order = list(LABELS)
    for op in ("push", "pull", "update", "push, new table", "push, new keys"):
        keys = {(k[0], k[3]) for k in index if k[4] == op}
        keys = {(g, c) for g, c in keys if c not in ("np.copyto", "tf assign") or g == "memory"}
        rows = [
            [label(c), *[cell(index.get((g, lv, n, c, op)), spread_text) for lv, n in columns]]
            for g, c in sorted(keys, key=lambda k: (order.index(k[1]) if k[1] in order else 99, k))
        ]
        if rows:
            lines += [f"**{op}**: median time (IQR)", "", *table(["", *names], rows)]
    pairs = {(k[0], k[3], k[4], tuple(b)) for k, r in index.items() for b in r["baselines"]}
    rows = []
    for group, contender, op, (base, base_op) in sorted(pairs):
        cells = []
        for lv, n in columns:
            mine, other = (
                index.get((group, lv, n, contender, op)),
                index.get((group, lv, n, base, base_op)),
            )
            cells.append(
                ratio_text(paired_ratio(mine["samples"], other["samples"]))
                if mine and other
                else "–"
            )
        if set(cells) != {"–"}:
            rows.append([f"{label(contender)} {op} / {label(base)} {base_op}", *cells])
    return lines + [
        "**Ratios** against the baselines, round by round: median (IQR)",
        "",
        *table(["", *names], rows),
    ]


def median_p90(s: dict[str, float]) -> str:
    return f"{seconds_text(s['median'])} ({seconds_text(s['p90'])})"


def cell(record: dict[str, Any] | None, text: Callable[[dict[str, float]], str]) -> str:
    return text(summary(record["samples"])) if record else "–"


def polls(results: dict[str, Any]) -> list[str]:
    index = sweep_index(results)
    keys = sorted({k[0] for k in index if k[4] == "pull_if_newer"}, key=list(LABELS).index)
    if not keys:
        return []
    sizes = size_columns(index, 4)
    rows = []
    for group in keys:
        records = [index.get((group, 4, n, group, "pull_if_newer")) for n in sizes]
        rows.append([label(group), *[cell(r, median_p90) for r in records]])
    full = [index.get(("reverb", 4, n, "tf-agents", "pull")) for n in sizes]
    rows.append(
        ["TF-Agents: a full pull", *[cell(r, lambda s: seconds_text(s["median"])) for r in full]]
    )
    lines = [
        "## 2. pull_if_newer when nothing changed",
        "",
        "![pull_if_newer latency vs size](../docs/img/poll_latency.png)",
        "",
        "Median (p90) of calls timed one by one after the size's rounds. TF-Agents' container has "
        "no version to compare: to learn the train step it pulls the whole nest.",
        "",
        *table(["", *[size_label(n) for n in sizes]], rows),
    ]
    tables = results.get("cross-backend", {}).get("tables")
    if tables:
        mine, floor = summary(tables["pull_if_newer"]), summary(tables["server_info"])
        lines += [
            f"**Many Reverb tables**: on a server of {results['cross-backend']['plan']['tables']} "
            f"tables of 20 leaves, pull_if_newer unchanged took {spread_text(mine)}, each call "
            "followed by the raw ServerInfo request every Reverb version check makes (its "
            f"reply holds every table's info): {spread_text(floor)}; ratio "
            f"{ratio_text(paired_ratio(tables['pull_if_newer'], tables['server_info']))}.",
            "",
        ]
    return lines


def readers(results: dict[str, Any]) -> list[str]:
    group = results.get("cross-backend", {})
    if not group.get("fanout"):
        return []

    def rows(records: list[dict[str, Any]]) -> list[list[str]]:
        return [
            [
                label(r["contender"]),
                str(r["readers"]),
                f"{r['aggregate_bytes_per_s'] / GB:.2f} GB/s",
            ]
            + [spread_text(summary(r["latencies"])), growth(r)]
            for r in records
        ]

    def growth(r: dict[str, Any]) -> str:
        each = r["server_growth"].items()
        return "; ".join(f"{m} +{g / MB:.1f} MB ({g / r['bytes']:.2f}×)" for m, g in each)

    head = ["backend", "readers", "aggregate", "one update (IQR)", "server memory growth"]
    return [
        "## 3. Fan-out: reader processes pulling one table",
        "",
        "![Fan-out scaling](../docs/img/fanout.png)",
        "",
        "Reader processes each `update` their own arrays from one "
        f"{size_label(group['fanout'][0]['bytes'])} table, all at once, on servers of their "
        "own. Aggregate: bytes delivered to all readers over the wall time. With 2 cores "
        "shared by the server and the readers it cannot scale past them.",
        "",
        *table(head, rows(group["fanout"])),
        "**Redis server memory under readers, varsync vs hand-written `GET`s**",
        "",
        *table(head, rows(group.get("reader_memory", []))),
    ]


def framework_records(fw: dict[str, Any]) -> dict[tuple[str, str, str], list[float]]:
    index = {(r["part"], r["contender"], r["op"]): r["samples"] for r in fw.get("records", [])}
    for part, contender, a, b, name in (
        ("torch redis", "varsync redis://", "push", "pull", "push+pull"),
        ("torch redis", "by hand", "push", "pull", "push+pull"),
        ("torchrl", "varsync shm://", "send", "until the worker applied", "send+apply"),
    ):
        if (part, contender, a) in index and (part, contender, b) in index:
            index[(part, contender, name)] = [
                x + y for x, y in zip(index[(part, contender, a)], index[(part, contender, b)])
            ]
    return index


def framework_targets(fw: dict[str, Any]) -> list[list[str]]:
    index, rows = framework_records(fw), []
    for part, key, base, limit in FRAMEWORK_TARGETS:
        if (part, *key) in index and (part, *base) in index:
            r = paired_ratio(index[(part, *key)], index[(part, *base)])
            what = f"{part}: {key[0]} {key[1]} vs {base[0]} {base[1]}"
            rows.append(target_row(what, size_label(fw["plan"]["nbytes"]), r, limit))
    return rows


def target_row(what: str, where: str, ratio: dict[str, float], limit: float | None) -> list[str]:
    bound = "" if limit is None else f" ≤ {limit:g}"
    return [what + bound, where, ratio_text(ratio), verdict(ratio["median"], limit, ratio)]


def frameworks(results: dict[str, Any]) -> list[str]:
    fw = results.get("frameworks")
    if not fw:
        return []
    index = framework_records(fw)
    rows = [
        [part, contender, op, spread_text(summary(s))] for (part, contender, op), s in index.items()
    ]
    versions = ", ".join(f"{k} {v}" for k, v in fw.get("versions", {}).items())
    lines = [
        "## 4. PyTorch and JAX",
        "",
        "![PyTorch and JAX through varsync](../docs/img/frameworks.png)",
        "",
        f"A policy of {fw['plan']['tensors']} float32 tensors, {size_label(fw['plan']['nbytes'])}, "
        f"{fw['plan']['rounds']} rounds ({fw['machine']['started']}, load "
        f"{fw['machine']['load_average'][0]:.1f} → {fw.get('load_average_after', [0])[0]:.1f}; "
        f"{versions}).",
        "",
        *table(["part", "contender", "operation", "median (IQR)"], rows),
    ]
    lines += [f"*{part} skipped: {why}*" for part, why in fw.get("skipped", {}).items()]
    return lines + [""]


def delta_rows(dl: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(r["stage"], r["backend"], r["op"]): r for r in dl.get("records", []) if r["seconds"]}


def delta_targets(dl: dict[str, Any]) -> list[list[str]]:
    index, rows = delta_rows(dl), []
    for (stage, backend, op), r in index.items():
        if backend == "memory" or stage == "one_of_50_rotating":
            continue  # for reference only
        where, pull = f"{backend}, {stage}", index.get((stage, backend, "pull"))
        if op in ("pull_if_newer(held)", "update") and stage != "all_changed":
            moved = summary([m / c for m, c in zip(r["moved"], r["changed"]) if c])
            rows.append(target_row(f"delta {op}: bytes moved / changed", where, moved, 1.2))
            if pull:
                ratio = paired_ratio(r["seconds"], pull["seconds"])
                rows.append(target_row(f"delta {op}: time / a whole pull", where, ratio, 0.2))
        whole = index.get((stage, backend, "push, skip_unchanged=False"))
        if stage == "all_changed" and op == "push" and whole:
            ratio = paired_ratio(r["seconds"], whole["seconds"])
            what = "delta push, every leaf changed / a whole write"
            rows.append(target_row(what, where, ratio, 1.05))
    return rows


def delta(results: dict[str, Any]) -> list[str]:
    dl = results.get("delta")
    if not dl:
        return []
    index = delta_rows(dl)
    lines = [
        "## 5. Delta sync: moving only the leaves that changed",
        "",
        "memory://, redis:// and shm:// taking turns in the same rounds "
        f"({dl['machine']['started']}, load {dl['machine']['load_average'][0]:.1f} → "
        f"{dl.get('load_average_after', [0])[0]:.1f}). "
        "Bytes moved: the redis-server's own counters, shm://'s, else the arrays crossing the "
        "Backend protocol.",
        "",
    ]
    for stage, info in dl.get("stages", {}).items():
        rows = []
        for (s, backend, op), r in index.items():
            if s != stage:
                continue
            moved = statistics.median(r["moved"])
            per_changed = summary([m / c for m, c in zip(r["moved"], r["changed"]) if c])
            pull = index.get((stage, backend, "pull"))
            vs_pull = (
                ratio_text(paired_ratio(r["seconds"], pull["seconds"]))
                if pull and op != "pull"
                else "–"
            )
            rows.append(
                [
                    label(backend),
                    op,
                    spread_text(summary(r["seconds"])),
                    size_label(moved),
                    ratio_text(per_changed),
                    vs_pull,
                ]
            )
        lines += [
            f"**{info['title']}** ({size_label(info['bytes'])} in {info['leaves']} leaves, "
            f"{size_label(info['changed_bytes'])} changed per push)",
            "",
            *table(
                [
                    "backend",
                    "operation",
                    "time",
                    "bytes moved",
                    "/ bytes changed",
                    "time / whole pull",
                ],
                rows,
            ),
        ]
    return lines + [f"*{b} skipped: {why}*" for b, why in dl.get("skipped", {}).items()]


def footer(results: dict[str, Any]) -> list[str]:
    stages = ", ".join(f"{name} {s:.0f} s" for name, s in results.get("stage_seconds", {}).items())
    return [
        "## What was run",
        "",
        f"{stages}; {results.get('seconds', 0) / 60:.1f} minutes in all.",
        "",
    ]


def render(results: dict[str, Any]) -> str:
    """RESULTS.md, every section the results hold (the pictures are docs/img/'s)."""
    parts = (header, targets, sweep, polls, readers, frameworks, delta, footer)
    return "\n".join(line for part in parts for line in part(results))


def missing(results: dict[str, Any], markdown: str) -> list[str]:
    """What a smoke run checks: every group that ran has its section and figures."""
    problems = []
    sections = {
        "cross-backend": ("## 1.", "## 2.", "## 3."),
        "frameworks": ("## 4.",),
        "delta": ("## 5.",),
    }
    for group, heads in sections.items():
        if group in results and group not in results.get("skipped", {}):
            problems += [f"{group}: no section {h}" for h in heads if h not in markdown]
    if "cross-backend" in results and "MULTI/EXEC" not in markdown:
        problems.append("cross-backend: the atomic MULTI/EXEC baseline is missing")
    if "nan" in markdown.replace("nanos", ""):
        problems.append("a figure is nan")
    return problems
