"""RESULTS.md sections 5 and 6, the stages with processes of their own: fan-out to reader
processes, and client memory per push and pull; and section 9's cold starts (issue 15.5)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .common import GB, LABELS, MB, machine_line, seconds_text, size_label, summary
from .report_base import COLD_BACKENDS, Results, cold_records, rel, table, time_cell

BACKENDS = ["reverb", "redis", "redis-py", "shm"]


def fanout_section(r: Results, images: dict[str, Path], out: Path) -> list[str]:
    fan = r.raw.get("fanout", [])
    skipped = r.skipped("fan-out")
    if not fan:
        return (["## 5. Fan-out", ""] + [f"- {s}" for s in skipped] + [""]) if skipped else []
    payload = fan[0]["bytes"]
    lines = ["## 5. Fan-out: reader processes pulling one table", ""]
    if "fanout" in images:
        lines += [f"![Fan-out scaling]({rel(images['fanout'], out.parent)})", ""]
    lines += [
        f"*{machine_line(r.m)}.* On a Reverb server and a redis-server of their own, 1 "
        f"to {max(f['readers'] for f in fan)} reader processes (started once, connected "
        "and warmed before timing) each `update` their own numpy arrays from the same "
        f"{size_label(payload)} table {fan[0]['pulls_each']} times, all at once. "
        "Aggregate = bytes delivered to all readers / wall time from the first start to "
        "the last finish. Server memory: the largest rise during the pulls, sampled every "
        "2 ms — the server process's resident memory (Reverb, Redis), Redis's own "
        "`used_memory`, and for shm:// (no server) the bytes its table holds in /dev/shm. "
        "memory:// lives in one process and has no fan-out. With "
        f"{r.m['cores']} cores shared by the server and every reader, more readers than "
        "cores take turns: aggregate throughput cannot scale past that here.",
        "",
    ]
    lines += readers_table(fan)
    return lines + [f"- {s}" for s in skipped] + ([""] if skipped else [])


def readers_table(records: list[dict[str, Any]]) -> list[str]:
    """One row per contender and reader count: aggregate, one fill, server memory growth."""
    rows = []
    for f in sorted(records, key=lambda f: (BACKENDS.index(f["contender"]), f["readers"])):
        payload = f["bytes"]
        growth = "; ".join(
            f"{k} +{v / MB:.1f} MB ({v / payload:.2f}×)" for k, v in f["server_growth"].items()
        )
        rows.append(
            [
                LABELS[f["contender"]],
                str(f["readers"]),
                f"{f['aggregate_bytes_per_s'] / GB:.2f} GB/s",
                time_cell(summary(f["latencies"])),
                growth,
            ]
        )
    return table(
        [
            "backend",
            "readers",
            "aggregate",
            "one update, median (IQR)",
            "server memory growth (× payload)",
        ],
        rows,
    )


def reader_memory_section(r: Results) -> list[str]:
    """Part of section 5: redis-server under varsync readers beside hand-written ones."""
    records = r.raw.get("reader_memory", [])
    if not records:
        return []
    return [
        "### Redis: server memory under readers, varsync vs hand-written",
        "",
        "The same table pulled through varsync and, as four keys, with `GET` by "
        "hand-written redis-py readers, on the fan-out's redis-server; sampled as in the "
        "fan-out.",
        "",
    ] + readers_table(records)


def memory_section(r: Results, images: dict[str, Path], out: Path) -> list[str]:
    records = r.raw.get("client_memory", [])
    if not records:
        skipped = r.skipped("client memory")
        return (["## 6. Client memory", ""] + [f"- {s}" for s in skipped] + [""]) if skipped else []
    payload = records[0]["bytes"]
    lines = ["## 6. Client memory per push and pull", ""]
    if "client_memory" in images:
        lines += [f"![Client memory]({rel(images['client_memory'], out.parent)})", ""]
    lines += [
        f"*{machine_line(r.m)}.* A fresh process per backend builds a "
        f"{size_label(payload)} nest (4 float32 arrays), connects and pushes once "
        "(warm-up); then for one push, and one pull whose result is kept: the peak "
        "resident memory (`VmHWM`, reset through `/proc/self/clear_refs`) minus the "
        "resident memory just before. glibc's mmap threshold is fixed at 128 KiB in these "
        "processes (`MALLOC_MMAP_THRESHOLD_`), so that buffers freed by the warm-up go back "
        "to the system instead of hiding the next call's allocations. A pull that returns "
        "new arrays cannot use less than 1×; memory:// and shm:// pulls return views of "
        "stored bytes. For shm://, resident memory counts the pages of the shared segment "
        "the process maps: its push writes one whole segment (1×), which lives in "
        "/dev/shm, not in a private copy.",
        "",
    ]
    rows = []
    for contender in ["memory", "reverb", "tf-agents", "redis", "redis-py", "shm"]:
        cells = []
        for op in ("push", "pull"):
            peak = r.client_peak(contender, op)
            cells.append(f"{peak[0]:.2f}× ({peak[1] / MB:.0f} MB)" if peak else "–")
        if any(c != "–" for c in cells):
            rows.append([LABELS[contender]] + cells)
    return lines + table(["", "push", "pull (result kept)"], rows)


def cold_start_section(r: Results) -> list[str]:
    from .readers import NEEDS

    records = cold_records(r)
    if not records:
        return []
    rows = []
    for name in COLD_BACKENDS:
        c = records.get(name)
        if not c:
            continue
        got = c["samples"]

        def part(key: str, got: list[dict[str, Any]] = got) -> str:
            return seconds_text(statistics.median(s[key] for s in got))

        heavy = sorted({m for s in got for m in s["heavy"]})
        rows.append(
            [
                f"{name}://",
                time_cell(summary([s["seconds"] for s in got])),
                part("import"),
                part("connect"),
                part("create + push") if name == "memory" else "–",
                part("pull"),
                ", ".join(heavy) or "none",
                ", ".join(NEEDS[name]) or "none",
            ]
        )
    first = next(iter(records.values()))
    return [
        "### Cold start: a new process's first connect + pull",
        "",
        f"Each sample a fresh `python -c` of readers.py's `COLD_CHILD` "
        f"({len(first['samples'])} "
        "per backend, taking turns), its clock started just before `import varsync` "
        "(Python's start-up excluded, the backend's imports included) and stopped when "
        f"`pull` of a {size_label(first['bytes'])} table (4 float32 arrays, filled by the "
        "suite) returned. memory:// keeps nothing across processes: its process creates "
        "the table and pushes before it pulls (building the nest is not counted). "
        "Heavy modules: which of tensorflow, reverb, redis, torch, jax were in "
        "`sys.modules` after the pull.",
        "",
    ] + table(
        [
            "backend",
            "total, median (IQR)",
            "import varsync",
            "connect",
            "create + push",
            "pull",
            "heavy modules imported",
            "what it uses",
        ],
        rows,
    )
