"""What every run must produce, checked by ``--smoke``: every case's groups with all their
contenders and operations, every poll, every reader stage and probe, no stage skipped or
failed, and every section of RESULTS.md with its target rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: (group, contender, operation) of every case; then what a target size adds.
EVERY_CASE = {
    ("memory", "memory", "push"),
    ("memory", "memory", "pull"),
    ("memory", "memory", "update"),
    ("memory", "np.copyto", "copy"),
    ("memory", "np.copyto fresh", "copy"),
    ("memory", "tf assign", "update"),
    ("reverb", "reverb", "push"),
    ("reverb", "reverb", "pull"),
    ("reverb", "reverb", "update"),
    ("reverb", "tf-agents", "push"),
    ("reverb", "tf-agents", "pull"),
    ("reverb", "tf-agents", "update"),
    ("reverb", "np.copyto", "copy"),
    ("redis", "redis", "push"),
    ("redis", "redis", "pull"),
    ("redis", "redis", "update"),
    ("redis", "redis-py", "push"),
    ("redis", "redis-py", "pull"),
    ("redis", "redis-py", "update"),
    ("redis", "np.copyto", "copy"),
    ("redis", "redis-py pipelined", "push"),
    ("redis", "tcp loopback", "transfer"),
    ("shm", "shm", "push"),
    ("shm", "shm", "pull"),
    ("shm", "shm", "update"),
    ("shm", "np.copyto", "copy"),
    ("shm", "tf assign", "update"),
}
FEW = {("reverb", "varsync drop-in", "push"), ("reverb", "varsync drop-in", "pull")}
MANY = {("reverb", "memory", "update")}
FIRST_PUSH = {("redis", "redis", "push, new table")}
AT_TARGETS = {
    ("redis", "np.copyto fresh", "copy"),
    ("shm", "shm", "pull + read"),
    ("shm", "shm", "update numpy"),
    ("shm", "shm", "push, new segment"),
    ("shm", "shm", "pull + read, new segment"),
}
POLLS = {
    ("memory", "pull_if_newer"),
    ("reverb", "pull_if_newer"),
    ("redis", "pull_if_newer"),
    ("shm", "pull_if_newer"),
}
CLIENT_MEMORY = {
    (c, op)
    for c in ("memory", "reverb", "tf-agents", "redis", "redis-py", "shm")
    for op in ("push", "pull")
}
SECTIONS = [
    "## Headline",
    "## Targets of issues 3, 4 and 5",
    "## 1. Throughput",
    "## 3. Many",
    "## 4. pull_if_newer",
    "## 5. Fan-out",
    "### Redis: server memory under readers",
    "## 6. Client memory",
    "## 7. Each backend",
    "### Reverb:",
    "### Redis:",
    "### shm://",
    "## What was run",
    "## Targets of issue 15",
    "### Redis: both hand-written pushes",
    "### Redis: where the time goes",
    "### Reverb: pull_if_newer with many tables",
    "### Cold start",
]
TARGET_ROWS = 12  # 2 + 2 + 1 Reverb, 2 + 1 + 1 + 1 Redis, 2 shm (two target sizes)
ISSUE_15_ITEMS = (
    "15.1 Reverb",
    "15.2 many variables",
    "15.3 Redis",
    "15.4 the wire",
    "15.5 cold start",
)
COLD_BACKENDS = ("memory", "reverb", "redis", "shm")


def wanted(case: dict[str, Any]) -> set[tuple[str, str, str]]:
    """The (group, contender, operation) a case should have timed."""
    ops = EVERY_CASE | (AT_TARGETS if case.get("targets") else set())
    ops |= (FEW if case["layout"] == "few" else MANY) if case["update"] else set()
    ops |= FIRST_PUSH if case.get("first_push") else set()
    if not case["update"]:
        ops = {(g, c, op) for g, c, op in ops if op != "update"}
    if case["nbytes"] > 10**9:  # no np.copyto into new arrays, no TCP floor: memory to spare
        ops = {(g, c, op) for g, c, op in ops if c not in ("np.copyto fresh", "tcp loopback")}
    return ops


#: (part, contender, operation) the framework group times, per part (frameworks.py).
FRAMEWORK_OPS = {
    "torch shm": {
        ("varsync shm://", "update(module)"),
        ("torch", "load_state_dict(copy)"),
        ("varsync shm://", "pull(like=module)"),
    },
    "torch shm, 1 thread": {
        ("varsync shm://", "update(module)"),
        ("torch", "load_state_dict(copy)"),
        ("varsync shm://", "pull(like=module)"),
    },
    "torch redis": {
        ("by hand", "push"),
        ("by hand", "pull"),
        ("varsync redis://", "push"),
        ("varsync redis://", "pull"),
    },
    "torchrl": set(),
    "jax shm": {
        ("varsync shm://", "pull(like=tree)"),
        ("jax", "device_put(numpy)"),
        ("jax", "device_put(numpy, unaligned)"),
    },
}
FRAMEWORK_ROWS = 4  # the issue's four targets, one row each


def missing_figures(
    results: dict[str, Any],
    markdown: str,
    groups: Sequence[str] = ("cross-backend", "frameworks", "delta"),
) -> list[str]:
    """Everything a run of ``groups`` should have produced and did not, in words; empty
    if complete. A group skipped because its frameworks do not import here is not
    missing."""
    skipped = set(results.get("groups_skipped", {})) | {
        g for g in ("cross-backend", "frameworks", "delta") if g not in groups
    }
    missing = [] if "frameworks" in skipped else missing_framework_figures(results, markdown)
    missing += [] if "delta" in skipped else missing_delta_figures(results, markdown)
    if "cross-backend" in skipped:
        return missing
    return missing + missing_cross_backend(results, markdown)


def missing_framework_figures(results: dict[str, Any], markdown: str) -> list[str]:
    """The framework group: each part timed every operation, or was skipped for a reason
    other than a failure (a framework that does not import here); its section and rows."""
    from .report_frameworks import SECTION

    section = results.get("frameworks")
    if not section:
        return ["frameworks: the group neither ran nor said why it was skipped"]
    missing = []
    have = {
        (r["part"], r["contender"], r["op"]) for r in section.get("records", []) if r["samples"]
    }
    for part, ops in FRAMEWORK_OPS.items():
        reason = section.get("skipped", {}).get(part)
        if reason is not None:
            if reason.startswith("failed"):
                missing.append(f"frameworks: {part} {reason}")
            continue
        missing += [
            f"frameworks: {part}: {c} {op}" for c, op in sorted(ops) if (part, c, op) not in have
        ]
    if SECTION not in markdown:
        missing.append(f"RESULTS.md: no section {SECTION!r}")
    rows = [line for line in markdown.splitlines() if line.startswith("| 14.8 ")]
    if len(rows) != FRAMEWORK_ROWS:
        missing.append(f"RESULTS.md: {len(rows)} framework target rows, expected {FRAMEWORK_ROWS}")
    return missing


#: (stage, operation) the delta group times on every backend it runs (delta.py).
DELTA_OPS = {
    (stage, op)
    for stage in ("frozen90", "one_of_50", "one_of_50_rotating")
    for op in ("push", "pull_if_newer(held)", "update", "pull", "update, delta_only=False")
}
DELTA_OPS |= {("all_changed", "push"), ("all_changed", "push, skip_unchanged=False")}
DELTA_BACKENDS = ("memory", "redis", "shm")
#: rows of section 10's target tables per backend: 16.1 three, 16.2 two, 16.3 five, 16.4 one
DELTA_ROWS = {"16.1": 3, "16.2": 2, "16.3": 5, "16.4": 1}


def missing_delta_figures(results: dict[str, Any], markdown: str) -> list[str]:
    """The delta group: every backend timed and counted every operation of every stage,
    or was skipped for a reason other than a failure; the detection timings; its section
    with a figure and a verdict in every target row."""
    from .report_delta import SECTION

    section = results.get("delta")
    if not section:
        return ["delta: the group neither ran nor said why it was skipped"]
    missing = []
    have = {
        (r["backend"], r["stage"], r["op"])
        for r in section.get("records", [])
        if r["seconds"] and len(r["moved"]) == len(r["seconds"])
    }
    ran = []
    for backend in DELTA_BACKENDS:
        reason = section.get("skipped", {}).get(backend)
        if reason is not None:
            if reason.startswith("failed"):
                missing.append(f"delta: {backend} {reason}")
            continue
        ran.append(backend)
        missing += [
            f"delta: {backend} {stage} {op}"
            for stage, op in sorted(DELTA_OPS)
            if (backend, stage, op) not in have
        ]
    cases = (section.get("detection") or {}).get("cases", [])
    if not cases or any(not c["seconds"] or c["found"] != c["expected"] for c in cases):
        missing.append("delta: changed_leaves timings missing or finding the wrong leaves")
    if SECTION not in markdown:
        missing.append(f"RESULTS.md: no section {SECTION!r}")
    for target, per_backend in DELTA_ROWS.items():
        rows = [line for line in markdown.splitlines() if line.startswith(f"| {target} |")]
        if len(rows) != per_backend * len(ran):
            missing.append(
                f"RESULTS.md: {len(rows)} rows of target {target}, expected "
                f"{per_backend * len(ran)}"
            )
        for row in rows:
            cells = [c.strip() for c in row.strip(" |").split("|")]
            if cells[5] == "–" or cells[-1] not in ("**met**", "**missed**", "reference"):
                missing.append(f"RESULTS.md: a delta target without a figure or verdict: {row}")
    return missing


def missing_cross_backend(results: dict[str, Any], markdown: str) -> list[str]:
    """The cross-backend group's figures."""
    missing = [f"stage: {s}" for s in results.get("skipped", [])]
    recorded: dict[str, set[tuple[str, str, str]]] = {}
    for r in results.get("sweep", []):
        if r["samples"]:
            recorded.setdefault(r["case"], set()).add((r["group"], r["contender"], r["op"]))
    polled: dict[str, set[tuple[str, str]]] = {}
    for r in results.get("polls", []):
        if r["samples"]:
            polled.setdefault(r["case"], set()).add((r["contender"], r.get("op", "pull_if_newer")))
    for case in results.get("cases", []):
        name = f"{case['layout']}_{case['nbytes']}"
        for group, contender, op in sorted(wanted(case) - recorded.get(name, set())):
            missing.append(f"{name}: {contender} {op} in the {group} group")
        polls = POLLS | ({("redis", "version")} if case.get("targets") else set())
        for contender, op in sorted(polls - polled.get(name, set())):
            missing.append(f"{name}: {contender} {op} polls")
    plan = results.get("plan", {})
    for key, contenders, counts in (
        ("fanout", ("reverb", "redis", "shm"), plan.get("fanout_readers", [])),
        ("reader_memory", ("redis", "redis-py"), plan.get("reader_memory", {}).get("counts", [])),
    ):
        have = {(f["contender"], f["readers"]) for f in results.get(key, [])}
        missing += [
            f"{key}: {c} with {n} readers" for c in contenders for n in counts if (c, n) not in have
        ]
    have = {(m["contender"], m["op"]) for m in results.get("client_memory", [])}
    missing += [f"client memory: {c} {op}" for c, op in sorted(CLIENT_MEMORY - have)]
    missing += [f"RESULTS.md: no section {s!r}" for s in SECTIONS if s not in markdown]
    rows = [
        line
        for line in markdown.splitlines()
        if line.startswith(("| 3 Reverb", "| 4 Redis", "| 5 shm"))
    ]
    if len(rows) < TARGET_ROWS:
        missing.append(f"RESULTS.md: {len(rows)} target rows, expected {TARGET_ROWS}")
    missing += [
        f"RESULTS.md: a target without a verdict: {row}"
        for row in rows
        if row.rstrip(" |").endswith("–")
    ]
    return missing + missing_issue_15(results, markdown)


def missing_issue_15(results: dict[str, Any], markdown: str) -> list[str]:
    """The stages issue 15 added and its table of targets: every item has rows, every row a
    figure for this run and a verdict."""
    missing = []
    if not (results.get("many_tables") or {}).get("samples"):
        missing.append("many tables: no pull_if_newer samples")
    have = {c["backend"] for c in results.get("cold_start", []) if c["samples"]}
    missing += [f"cold start: {name}" for name in COLD_BACKENDS if name not in have]
    for item in ISSUE_15_ITEMS:
        rows = [line for line in markdown.splitlines() if line.startswith(f"| {item} |")]
        if not rows:
            missing.append(f"RESULTS.md: no row of target {item}")
        for row in rows:
            cells = [c.strip() for c in row.strip(" |").split("|")]
            if cells[2] == "–" or cells[-1] in ("", "–"):
                missing.append(f"RESULTS.md: a target without a figure or verdict: {row}")
    return missing
