"""What every section of RESULTS.md reads: lookups over the raw records of a run, and the
formatting of times, ratios and tables. Every figure is computed from the raw samples."""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import GB, paired_ratio, summary

Key = tuple[str, int, str, str]  # layout, bytes, contender, op
Stat = dict[str, float]
REDIS_BASELINES = (("redis-py", "push"), ("redis-py pipelined", "push"))  # issue 15.3
FLOOR = ("tcp loopback", "transfer")  # the raw TCP floor, in the Redis group (issue 15.4)
COLD_BACKENDS = ("memory", "reverb", "redis", "shm")


class Results:
    """Lookups over the raw records."""

    def __init__(self, results: dict[str, Any]) -> None:
        self.raw = results
        self.m = results["machine"]
        self.by_group: dict[tuple[str, int, str, str, str], list[float]] = {}
        self.pooled: dict[Key, list[float]] = defaultdict(list)
        for r in results.get("sweep", []):
            key = (r["layout"], r["bytes"], r["contender"], r["op"])
            self.by_group[(r["layout"], r["bytes"], r["group"], r["contender"], r["op"])] = r[
                "samples"
            ]
            self.pooled[key].extend(r["samples"])
        self.polls: dict[tuple[str, int, str], list[float]] = {}
        self.versions: dict[tuple[str, int, str], list[float]] = {}
        for r in results.get("polls", []):
            kind = self.versions if r.get("op") == "version" else self.polls
            kind[(r["layout"], r["bytes"], r["contender"])] = r["samples"]
        self.refusals = results.get("refusals", [])
        self.plan = results.get("plan", {})

    def sizes(self, layout: str) -> list[int]:
        return sorted({b for (lay, b, _, _) in self.pooled if lay == layout})

    def target_sizes(self) -> list[int]:
        """The sizes the backend issues' targets were measured at in this run."""
        return [n for n in self.plan.get("target_bytes", []) if n in self.sizes("few")]

    def stat(self, layout: str, nbytes: int, contender: str, op: str) -> Stat | None:
        samples = self.pooled.get((layout, nbytes, contender, op))
        return summary(samples) if samples else None

    def poll(self, layout: str, nbytes: int, contender: str) -> Stat | None:
        samples = self.polls.get((layout, nbytes, contender))
        return summary(samples) if samples else None

    def ratio(
        self, layout: str, nbytes: int, group: str, mine: tuple[str, str], other: tuple[str, str]
    ) -> Stat | None:
        a = self.by_group.get((layout, nbytes, group, *mine))
        b = self.by_group.get((layout, nbytes, group, *other))
        return paired_ratio(a, b) if a and b else None

    def push_pull(self, layout: str, nbytes: int, contender: str) -> list[float] | None:
        """push + pull of ``contender`` in the Reverb group, round by round."""
        push = self.by_group.get((layout, nbytes, "reverb", contender, "push"))
        pull = self.by_group.get((layout, nbytes, "reverb", contender, "pull"))
        return [a + b for a, b in zip(push, pull)] if push and pull else None

    def push_pull_ratio(self, layout: str, nbytes: int, contender: str = "reverb") -> Stat | None:
        """``contender``'s push+pull over TF-Agents' push+pull, round by round."""
        mine = self.push_pull(layout, nbytes, contender)
        theirs = self.push_pull(layout, nbytes, "tf-agents")
        return paired_ratio(mine, theirs) if mine and theirs else None

    def refusal(self, layout: str, nbytes: int, contender: str) -> str | None:
        for r in self.refusals:
            if r["layout"] == layout and r["bytes"] == nbytes and r["contender"] == contender:
                return str(r["reason"])
        return None

    def client_peak(self, contender: str, op: str) -> tuple[float, int] | None:
        """Peak above baseline during one ``op`` in a fresh process: (× payload, bytes)."""
        for m in self.raw.get("client_memory", []):
            if m["contender"] == contender and m["op"] == op:
                return m["peak_above_baseline"] / m["bytes"], int(m["peak_above_baseline"])
        return None

    def skipped(self, prefix: str) -> list[str]:
        return [s for s in self.raw.get("skipped", []) if s.startswith(prefix)]


def better_baseline(r: Results, n: int) -> tuple[str, str] | None:
    """The faster (by median, this run) of the two hand-written pushes at size ``n``."""
    medians = {
        b: statistics.median(s)
        for b in REDIS_BASELINES
        if (s := r.by_group.get(("few", n, "redis", *b)))
    }
    return min(medians, key=lambda b: medians[b]) if medians else None


def floor_share(r: Results, n: int, op: str) -> Stat | None:
    """Redis ``op``'s throughput as % of the loopback floor's, round by round."""
    mine = r.by_group.get(("few", n, "redis", "redis", op))
    floor = r.by_group.get(("few", n, "redis", *FLOOR))
    if not mine or not floor:
        return None
    return summary([100 * f / m for f, m in zip(floor, mine) if m > 0])


def cold_records(r: Results) -> dict[str, dict[str, Any]]:
    """The cold-start records by backend."""
    return {c["backend"]: c for c in r.raw.get("cold_start", [])}


# -- formatting ---------------------------------------------------------------------------


def num(x: float) -> str:
    """Three significant digits without exponents: 0.884, 21.4, 1110."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def time_cell(s: Stat | None) -> str:
    if not s:
        return "–"
    median = s["median"]
    scale, unit = (1, "s") if median >= 1 else (1e3, "ms") if median >= 1e-3 else (1e6, "µs")
    return f"{num(median * scale)} {unit} ({num(s['q1'] * scale)}–{num(s['q3'] * scale)})"


VIEWS = ("memory", "shm")  # backends whose pull returns views of stored bytes


def ratio_cell(s: Stat | None) -> str:
    return f"{s['median']:.2f} ({s['q1']:.2f}–{s['q3']:.2f})" if s else "–"


def rate(nbytes: int, s: Stat | None) -> str:
    return f"{nbytes / s['median'] / GB:.2f} GB/s" if s else "–"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "l") -> list[str]:
    rule = ["---" if i == 0 or align != "r" else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def refusal_word(reason: str | None) -> str:
    return "not run" if reason and reason.startswith("not run") else "refused"


def rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")
