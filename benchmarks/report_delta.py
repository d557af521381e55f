"""RESULTS.md section 10: the delta group (delta.py, issue 16, "move only what changed"):
bytes moved against bytes changed, delta pulls and updates against a whole pull, and a
push where everything changed with and without change detection, each with its target.

Read from results.json's "delta" section, which ``--group delta`` writes (``make bench``
runs it in the modern environment) and a run of the other groups keeps."""

from __future__ import annotations

import statistics
from typing import Any

from .common import paired_ratio, size_label, summary
from .report_base import Stat, ratio_cell, table, time_cell

SECTION = "## 10. Delta sync (issue 16)"
TARGETED = ("redis", "shm")  # memory:// is shown for reference
ORDER = ("redis", "shm", "memory")
BYTES_LIMIT, TIME_LIMIT, PUSH_LIMIT = 1.2, 0.2, 1.05
BYTE_OPS = ("push", "pull_if_newer(held)", "update")
TIME_OPS = ("pull_if_newer(held)", "update")
WHOLE_PUSH = "push, skip_unchanged=False"
WHOLE_UPDATE = "update, delta_only=False"
HEADER = [
    "target",
    "backend (mode)",
    "operation",
    "delta",
    "against",
    "figure",
    "wanted",
    "verdict",
]
SOURCES = {
    "server": "the redis-server's own count (`INFO stats`: `total_net_input_bytes` + "
    "`total_net_output_bytes` around the call, less the two `INFO` calls' own "
    "bytes; the group's own server)",
    "shm counters": "the backend's counters in `details()` (`leaf_bytes_written` + "
    "`leaf_bytes_read`: bytes its partial pushes copied and its delta pulls "
    "read) plus the arrays of whole writes and reads",
    "protocol": "the arrays crossing the Backend protocol (handed to `write`/`write_leaves`, "
    "returned by `read`/`read_leaves`, leaves the reader holds excluded): on "
    "memory:// each written leaf is copied into the store and each read one is "
    "a view, which `update` copies; on shm:// without its counters, what the "
    "reader received",
}


class Delta:
    """Lookups over results.json's "delta" section."""

    def __init__(self, section: dict[str, Any]) -> None:
        self.raw = section
        self.records = {
            (r["stage"], r["backend"], r["op"]): r
            for r in section.get("records", [])
            if r["seconds"]
        }
        self.backends: dict[str, dict[str, Any]] = section.get("backends", {})
        self.skipped: dict[str, str] = section.get("skipped", {})

    def ran(self) -> list[str]:
        return [b for b in ORDER if b in self.backends and b not in self.skipped]

    def mode(self, backend: str) -> str:
        info = self.backends.get(backend, {})
        return "leaf versions" if info.get("supports_leaf_versions") else "whole (fallback)"

    def label(self, backend: str) -> str:
        return f"{backend}:// ({self.mode(backend)})"

    def bytes_ratio(self, stage: str, backend: str, op: str) -> Stat | None:
        r = self.records.get((stage, backend, op))
        if not r:
            return None
        return summary([m / c for m, c in zip(r["moved"], r["changed"]) if c])

    def moved(self, stage: str, backend: str, op: str, key: str = "moved") -> float | None:
        r = self.records.get((stage, backend, op))
        return statistics.median(r[key]) if r else None

    def stat(self, stage: str, backend: str, op: str) -> Stat | None:
        r = self.records.get((stage, backend, op))
        return summary(r["seconds"]) if r else None

    def time_ratio(self, stage: str, backend: str, op: str, other: str) -> Stat | None:
        a, b = self.records.get((stage, backend, op)), self.records.get((stage, backend, other))
        return paired_ratio(a["seconds"], b["seconds"]) if a and b else None


def _verdict(backend: str, s: Stat | None, limit: float) -> str:
    if s is None:
        return "not measured"
    if backend not in TARGETED:
        return "reference"
    return "**met**" if s["median"] <= limit else "**missed**"


def _bytes_rows(d: Delta, stage: str, target: str) -> list[list[str]]:
    rows = []
    for backend in d.ran():
        for op in BYTE_OPS:
            s = d.bytes_ratio(stage, backend, op)
            moved, changed = d.moved(stage, backend, op), d.moved(stage, backend, op, "changed")
            rows.append(
                [
                    target,
                    d.label(backend),
                    f"{op}: bytes moved / changed",
                    size_label(moved) if moved is not None else "–",
                    size_label(changed) if changed is not None else "–",
                    ratio_cell(s),
                    f"≤ {BYTES_LIMIT}",
                    _verdict(backend, s, BYTES_LIMIT),
                ]
            )
    return rows


def _time_rows(d: Delta, stage: str, target: str) -> list[list[str]]:
    rows = []
    for backend in d.ran():
        for op in TIME_OPS:
            s = d.time_ratio(stage, backend, op, "pull")
            rows.append(
                [
                    target,
                    d.label(backend),
                    f"{op} / whole pull()",
                    time_cell(d.stat(stage, backend, op)),
                    time_cell(d.stat(stage, backend, "pull")),
                    ratio_cell(s),
                    f"≤ {TIME_LIMIT}",
                    _verdict(backend, s, TIME_LIMIT),
                ]
            )
    return rows


def _push_rows(d: Delta) -> list[list[str]]:
    rows = []
    for backend in d.ran():
        s = d.time_ratio("all_changed", backend, "push", WHOLE_PUSH)
        rows.append(
            [
                "16.4",
                d.label(backend),
                f"push (skip_unchanged on) / {WHOLE_PUSH}",
                time_cell(d.stat("all_changed", backend, "push")),
                time_cell(d.stat("all_changed", backend, WHOLE_PUSH)),
                ratio_cell(s),
                f"≤ {PUSH_LIMIT}",
                _verdict(backend, s, PUSH_LIMIT),
            ]
        )
    return rows


def _tally(rows: list[list[str]]) -> tuple[int, int, list[str]]:
    counted = [r for r in rows if r[-1] in ("**met**", "**missed**")]
    met = [r for r in counted if r[-1] == "**met**"]
    missed = [
        f"{r[0]} {r[1].split(' ')[0]} {r[2]} {r[5].split(' ')[0]}"
        for r in counted
        if r[-1] == "**missed**"
    ]
    return len(met), len(counted), missed


def delta_section(raw: dict[str, Any]) -> list[str]:
    section = raw.get("delta")
    skipped_group = raw.get("groups_skipped", {}).get("delta")
    if not section:
        return [SECTION, "", f"Not run: {skipped_group}.", ""] if skipped_group else []
    d = Delta(section)
    m, plan, stages = section["machine"], section["plan"], section.get("stages", {})
    after = section.get("load_average_after")
    versions = ", ".join(f"{k} {v}" for k, v in section.get("versions", {}).items() if v != "?")
    redis_version = d.backends.get("redis", {}).get("server_version")
    lines = [
        SECTION,
        "",
        f"Measured by `python -m benchmarks.suite --group delta` on {m['started']} (machine "
        f"clock), in {section.get('seconds', 0):.0f} s: {m['cores']} cores, "
        f"{m['memory_gib']:.0f} GiB, Python {m['python']}, {versions}"
        + (f", redis-server {redis_version}" if redis_version else "")
        + ". "
        + _tree(section)
        + f" Load average {m['load_average'][0]:.1f} when the group started"
        + (f", {after[0]:.1f} when it ended" if after else "")
        + " (a shared, noisy machine).",
        "",
        "Modes: "
        + "; ".join(
            f"{b}:// `{d.backends[b].get('class')}.supports_leaf_versions = "
            f"{bool(d.backends[b].get('supports_leaf_versions'))}`: {d.mode(b)}"
            for b in ORDER
            if b in d.backends
        )
        + ". A backend without leaf versions runs the core's fallback (whole reads and "
        "writes), so its figures are those of whole transfers.",
        "",
        "A writer and two reader containers per backend, in one process; the three backends "
        "took turns in every round (their order rotated each round, the reader's calls "
        f"reversed every other round), {plan['warm']} untimed rounds then {plan['rounds']} "
        f"timed ones ({plan.get('push_rounds', plan['rounds'])} for `all_changed`). Per "
        "round: the leaves that change get new values (every element + 1, untimed), "
        "the writer pushes (skip_unchanged on, the default), then the reader's "
        "`pull_if_newer(v, held=nest)` (with the nest of its previous one), `update(targets)` "
        "(numpy arrays, which its previous update assigned), a whole `pull()` and, by a "
        "third container, `update(other_targets, delta_only=False)` (every leaf assigned: "
        "the pre-delta update), all of the same version. On memory:// and shm:// a whole "
        "`pull()` hands out read-only views of the stored bytes, without a copy, while an "
        "`update` copies what it assigns: there the update / whole pull ratio sets a copy "
        "against none, so update / `update(delta_only=False)` is given beside it. After the "
        "rounds the reader's nest and targets are checked equal to the writer's. "
        "Figures are medians over rounds with the interquartile range in "
        "brackets; a time ratio is taken round by round. Targets apply to redis:// and "
        "shm://; memory:// is shown for reference.",
        "",
        "Workloads: "
        + "; ".join(
            f"`{k}`: {s['title']}, {size_label(s['bytes'])} in "
            f"{s['leaves']} float32 leaves, "
            f"{size_label(s['changed_bytes'])} changed per push"
            for k, s in stages.items()
        )
        + ".",
        "",
        "Bytes moved: "
        + "; ".join(f"{b}:// {SOURCES.get(src, src)}" for b, src in _sources(stages).items())
        + ".",
        "",
    ]
    rows = {
        "16.1": _bytes_rows(d, "frozen90", "16.1"),
        "16.2": _time_rows(d, "frozen90", "16.2"),
        "16.3": _bytes_rows(d, "one_of_50", "16.3") + _time_rows(d, "one_of_50", "16.3"),
        "16.4": _push_rows(d),
    }
    titles = {
        "16.1": "16.1: 90 % of the bytes frozen, per push and per pull, bytes moved against "
        "bytes changed",
        "16.2": "16.2: the same nest, the reader's delta calls against a whole `pull()`",
        "16.3": "16.3: 1 of 50 leaves changed per push, the same measures",
        "16.4": "16.4: every leaf changed every push, the push with change detection against "
        "`skip_unchanged=False` (the pre-delta path: a plain whole write)",
    }
    every: list[list[str]] = []
    for key, found in rows.items():
        lines += [f"**{titles[key]}**", ""] + table(HEADER, found)
        lines += _whole_update(d, {"16.2": "frozen90", "16.3": "one_of_50"}.get(key))
        every += found
    met, counted, missed = _tally(every)
    lines += [
        f"Targets met (redis:// and shm://): {met} of {counted}"
        + (f". Missed: {', '.join(missed)}" if missed else "")
        + ".",
        "",
    ]
    lines += _detection(section, d)
    lines += _push_leaves_paths(section)
    if any(stage == "one_of_50_rotating" for stage, _, _ in d.records):
        lines += [
            "**Beyond the targets: 1 of 50 leaves changed per push, a different one "
            "each push.** The leaf that changed is hashed too when changed leaves hold "
            "at most a quarter of the push's bytes (`varsync/delta.py`), so the push "
            "after it stopped changing skips it. On shm:// a partial push refills a "
            "spare segment two versions old, so it copies the leaves of the last two "
            "pushes: twice the bytes changed when a different leaf changes each push "
            "(`varsync_shm/leaves.py`)." + _shm_full_copies(d),
            "",
        ]
        lines += table(
            HEADER,
            [
                ["16.3, rotating", *r[1:]]
                for r in _bytes_rows(d, "one_of_50_rotating", "")
                + _time_rows(d, "one_of_50_rotating", "")
            ],
        )
    lines += _detail(d)
    return lines


def _push_leaves_paths(section: dict[str, Any]) -> list[str]:
    """``push_leaves`` of many paths beside a whole push of the same table (memory://)."""
    found = section.get("push_leaves_paths")
    if not found:
        return []
    some, whole = (summary(found["seconds"][op]) for op in ("push_leaves", WHOLE_PUSH))
    ratios = [
        a / b
        for a, b in zip(found["seconds"]["push_leaves"], found["seconds"][WHOLE_PUSH])
        if b > 0
    ]
    ratio = summary(ratios)
    return [
        f"**`push_leaves` of {found['paths']:,} paths into a {found['leaves']:,}-leaf table** "
        f"(memory://, {found['leaf_bytes']}-byte leaves, {len(ratios)} rounds, the two calls "
        f"in turn): `push_leaves` {some['median'] * 1e3:.1f} ms "
        f"[{some['q1'] * 1e3:.1f}-{some['q3'] * 1e3:.1f}], a whole push of the same table "
        f"{whole['median'] * 1e3:.1f} ms [{whole['q1'] * 1e3:.1f}-{whole['q3'] * 1e3:.1f}], "
        f"{ratio['median']:.2f}x [{ratio['q1']:.2f}-{ratio['q3']:.2f}]. Each path is a dict "
        "lookup in an index of the signature made once per call (before: one walk of the "
        "whole signature per path, 11.8 s for these 2,000 paths).",
        "",
    ]


def _whole_update(d: Delta, stage: str | None) -> list[str]:
    if stage is None:
        return []
    parts = [
        f"{b}:// {ratio_cell(s)}"
        for b in d.ran()
        if (s := d.time_ratio(stage, b, "update", WHOLE_UPDATE))
    ]
    return (
        [
            "`update` (delta) against `update(delta_only=False)` (every leaf assigned), "
            "round by round: " + "; ".join(parts) + ".",
            "",
        ]
        if parts
        else []
    )


def _shm_full_copies(d: Delta) -> str:
    s = d.bytes_ratio("one_of_50_rotating", "shm", "push")
    if not s or s["median"] < 3:
        return ""
    return (
        f" On shm:// a push here copied {s['median']:.0f}× the bytes changed: a partial "
        "push refills a free spare segment, and with none free (readers hold every "
        "retired version; here the reader's held nest, whose leaves are views into the "
        "segments where each last changed) it fills a new file, copying every leaf "
        "(`varsync_shm/leaves.py`)."
    )


def _sources(stages: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for info in stages.values():
        for backend, source in info.get("bytes_source", {}).items():
            found.setdefault(backend, source)
    return {b: found[b] for b in ORDER if b in found}


def _tree(section: dict[str, Any]) -> str:
    tree = section.get("tree") or {}
    if not tree.get("commit"):
        return ""
    modified = tree.get("modified") or []
    return f"The library as in the working tree on commit {tree['commit']}" + (
        f", with uncommitted changes to {', '.join(modified)}." if modified else ", unmodified."
    )


def _detection(section: dict[str, Any], d: Delta) -> list[str]:
    det = section.get("detection")
    if not det:
        return []
    pushes = {b: s for b in d.ran() if (s := d.stat("all_changed", b, WHOLE_PUSH))}
    parts = []
    for c in det["cases"]:
        s = summary(c["seconds"])
        share = ", ".join(
            f"{100 * s['median'] / p['median']:.2g} % of a whole push on {b}://"
            for b, p in pushes.items()
        )
        parts.append(
            f"{c['case']}: {time_cell(s)} ({c['found']} of {det['leaves']} leaves "
            f"found changed, {c['expected']} expected" + (f"; {share}" if share else "") + ")"
        )
    return [
        f"Change detection alone (`varsync.delta.changed_leaves` on the "
        f"{size_label(det['bytes'])} nest of {det['leaves']} leaves, against the record "
        "of a push of it): " + "; ".join(parts) + ".",
        "",
    ]


def _detail(d: Delta) -> list[str]:
    rows = []
    for (stage, backend, op), r in d.records.items():
        rows.append(
            [
                stage,
                f"{backend}://",
                op,
                time_cell(summary(r["seconds"])),
                size_label(statistics.median(r["moved"])),
                size_label(statistics.median(r["protocol"])),
                size_label(statistics.median(r["changed"])),
            ]
        )
    lines = [
        "Every call timed (median and interquartile range over rounds; bytes are "
        'medians; "protocol" counts the arrays crossing the Backend protocol on every '
        "backend):",
        "",
    ]
    lines += table(
        ["workload", "backend", "call", "time", "bytes moved", "protocol bytes", "bytes changed"],
        sorted(rows),
    )
    lines += [f"- {backend}://: not run: {reason}." for backend, reason in d.skipped.items()]
    return lines + [""]
