"""Issue 15's targets checked against this run, beside the previous run's figures, and
RESULTS.md section 9: Redis against both hand-written baselines and the wire's floor, the
Reverb server of many tables, and cold starts.

``target_rows`` computes every figure of the targets' table from a run's results; the
suite keeps the previous run's (``previous_figures``, read from the results.json there
when a run starts) in this run's results.json under "previous", so that the table shows
both and a regression shows, also when RESULTS.md is regenerated later from results.json.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .common import GB, MB, paired_ratio, seconds_text, size_label, summary
from .report_base import Results, Stat, num, table, time_cell

SECTION = "## Targets of issue 15, this run and the previous one"
DETAIL = "## 9. Issue 15: Redis against the wire, many Reverb tables, cold start"
REDIS_BASELINES = (("redis-py", "push"), ("redis-py pipelined", "push"))
FLOOR = ("tcp loopback", "transfer")
COLD_BACKENDS = ("memory", "reverb", "redis", "shm")


@dataclass
class Row:
    """One target: ``figure`` (median, q1, q3) against ``limit`` (at most, or with
    ``at_least`` at least); ``text``, for a figure that is words, not a number."""

    key: str  # stable across runs: the previous run's figure is found by it
    item: str
    target: str
    limit: float = 0.0
    figure: Optional[Stat] = None
    unit: str = "×"  # "×", "%" or "s"
    at_least: bool = False
    text: str = ""
    ok: Optional[bool] = None  # for a row of words
    basis: str = ""  # what the figure is a ratio to, when that can change between runs

    def met(self) -> Optional[bool]:
        if self.figure is None or self.limit != self.limit:  # words, or NaN: measured only
            return self.ok
        median = self.figure["median"]
        return median >= self.limit if self.at_least else median <= self.limit

    def cell(self, figure: Optional[Stat] = None, text: str = "") -> str:
        s = figure if figure is not None else self.figure
        if s is None:
            return text or self.text or "–"
        if self.unit == "s":
            return (f"{seconds_text(s['median'])} (IQR {seconds_text(s['q1'])}–"
                    f"{seconds_text(s['q3'])}; p90 {seconds_text(s.get('p90', s['q3']))})")
        if self.unit == "%":
            return f"{s['median']:.0f} % ({s['q1']:.0f}–{s['q3']:.0f})"
        return f"{s['median']:.2f} ({s['q1']:.2f}–{s['q3']:.2f})"

    def verdict(self) -> str:
        met = self.met()
        if met is None:
            return "recorded"
        word = "**met**" if met else "**missed**"
        s = self.figure
        if s is not None and min(s["q1"], s["q3"]) <= self.limit <= max(s["q1"], s["q3"]):
            word += " (the IQR straddles the target)"
        return word


def better_baseline(r: Results, n: int) -> Optional[Tuple[str, str]]:
    """The faster (by median, this run) of the two hand-written pushes at size ``n``."""
    medians = {b: statistics.median(s) for b in REDIS_BASELINES
               if (s := r.by_group.get(("few", n, "redis", *b)))}
    return min(medians, key=lambda b: medians[b]) if medians else None


def floor_share(r: Results, n: int, op: str) -> Optional[Stat]:
    """Redis ``op``'s throughput as % of the loopback floor's, round by round."""
    mine = r.by_group.get(("few", n, "redis", "redis", op))
    floor = r.by_group.get(("few", n, "redis", *FLOOR))
    if not mine or not floor:
        return None
    return summary([100 * f / m for f, m in zip(floor, mine) if m > 0])


def target_rows(r: Results) -> List[Row]:
    sizes = [n for n in r.sizes("few") if n < 2**31]
    return (_reverb_rows(r, sizes) + _many_rows(r) + _redis_rows(r, sizes) + _wire_rows(r, sizes)
            + _cold_rows(r))


def _reverb_rows(r: Results, sizes: List[int]) -> List[Row]:
    rows = []
    for path, contender in (("numpy", "reverb"), ("drop-in", "varsync drop-in")):
        for n in sizes:
            limit = 1.0 if n < 10 * MB else 0.75
            label = size_label(n)
            both = r.push_pull_ratio("few", n, contender)
            pull = r.ratio("few", n, "reverb", (contender, "pull"), ("tf-agents", "pull"))
            rows += [Row(f"reverb {path} push+pull {n}", "15.1 Reverb",
                         f"{path}: push+pull ≤ {limit:.2f} × TF-Agents', {label}", limit, both),
                     Row(f"reverb {path} pull {n}", "15.1 Reverb",
                         f"{path}: pull ≤ {limit:.2f} × TF-Agents', {label}", limit, pull)]
    tables = r.raw.get("many_tables")
    if tables:
        rows.append(Row("reverb many tables poll", "15.1 Reverb",
                        f"pull_if_newer unchanged ≤ 0.3 ms, one of {tables['tables']} tables of "
                        f"{tables['leaves']} leaves", 3e-4, summary(tables["samples"]), unit="s"))
    return rows


def _many_rows(r: Results) -> List[Row]:
    rows = []
    for n in r.sizes("many")[:1]:  # the smallest: 1 MB in a full run
        leaves = next((c["leaves"] for c in r.raw.get("cases", []) if c["layout"] == "many"
                       and c["nbytes"] == n), "?")
        for contender, limit in (("reverb", 1.0), ("memory", 0.5)):
            s = r.ratio("many", n, "reverb", (contender, "update"), ("tf-agents", "update"))
            rows.append(Row(f"many update {contender}", "15.2 many variables",
                            f"{contender}:// update of {leaves} variables, {size_label(n)}, "
                            f"≤ {limit:.1f} × TF-Agents' update", limit, s))
    return rows


def _redis_rows(r: Results, sizes: List[int]) -> List[Row]:
    rows = []
    for n in sizes:
        base = better_baseline(r, n)
        if base is None:
            continue
        limit = 1.0 if n <= 100 * MB else 0.5
        named = "pipelined SETs" if base[0] == "redis-py pipelined" else "per-leaf SETs"
        label = size_label(n)
        rows.append(Row(f"redis push {n}", "15.3 Redis", f"push ≤ {limit:.1f} × the better "
                        f"hand-written push ({named} here), {label}", limit,
                        r.ratio("few", n, "redis", ("redis", "push"), base), basis=named))
        first = r.ratio("few", n, "redis", ("redis", "push, new table"), base)
        if first:
            rows.append(Row(f"redis first push {n}", "15.3 Redis",
                            f"a new table's first push ≤ {limit:.1f} × the better hand-written "
                            f"push, {label}", limit, first, basis=named))
        if n >= 10 * MB:
            rows.append(Row(f"redis pull {n}", "15.3 Redis",
                            f"pull ≤ 0.5 × hand-written GETs, {label}", 0.5,
                            r.ratio("few", n, "redis", ("redis", "pull"), ("redis-py", "pull"))))
    return rows


def wire_sizes(r: Results, sizes: List[int]) -> List[int]:
    """100 MB and 1 GB, the issue's; in a run without them, the largest size measured."""
    measured = [n for n in sizes if r.by_group.get(("few", n, "redis", *FLOOR))]
    chosen = [n for n in measured if n in (100 * MB, GB)]
    return chosen or measured[-1:]


def _wire_rows(r: Results, sizes: List[int]) -> List[Row]:
    return [Row(f"redis {op} floor {n}", "15.4 the wire",
                f"Redis {op} throughput ≥ 50 % of raw loopback TCP's, {size_label(n)}", 50,
                floor_share(r, n, op), unit="%", at_least=True)
            for n in wire_sizes(r, sizes) for op in ("push", "pull")]


def cold(r: Results) -> Dict[str, Dict[str, Any]]:
    return {c["backend"]: c for c in r.raw.get("cold_start", [])}


def _cold_rows(r: Results) -> List[Row]:
    from .cold_start import NEEDS

    records = cold(r)
    rows = []
    for name in COLD_BACKENDS:
        c = records.get(name)
        if c:
            what = ("import + connect + create + push + pull (no state across processes)"
                    if name == "memory" else "import + connect + pull")
            rows.append(Row(f"cold {name}", "15.5 cold start", f"{name}://, a new process's "
                            f"{what}, {size_label(c['bytes'])}: measured",
                            figure=summary([s["seconds"] for s in c["samples"]]), unit="s",
                            limit=float("nan")))
    if records:
        extra = {name: sorted({m for s in c["samples"] for m in s["heavy"]} - set(NEEDS[name]))
                 for name, c in records.items() if name in NEEDS}
        text = "; ".join(f"{name}: {', '.join(mods)}" for name, mods in extra.items() if mods)
        rows.append(Row("cold imports", "15.5 cold start",
                        "no backend imports what it does not use (of "
                        "tensorflow, reverb, redis, torch, jax)",
                        text=text or "none does", ok=not text))
    return rows


def figures_of(rows: List[Row]) -> Dict[str, Any]:
    """What results.json keeps of a run's targets, for the next run's table."""
    kept: Dict[str, Any] = {}
    for row in rows:
        if row.figure is not None:
            kept[row.key] = {k: row.figure[k] for k in ("median", "q1", "q3", "p90")
                             if k in row.figure}
            if row.basis:
                kept[row.key]["basis"] = row.basis
        elif row.text:
            kept[row.key] = row.text
    return kept


def previous_figures(path: Path) -> Optional[Dict[str, Any]]:
    """The targets' figures of the run whose results.json is at ``path``, with when it ran
    and its load; None if there is none (or it cannot be read)."""
    try:
        old = json.loads(path.read_text())
        figures = figures_of(target_rows(Results(old)))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    machine = old.get("machine", {})
    return {"started": machine.get("started", "?"), "load_average": machine.get("load_average"),
            "commit": (old.get("tree") or {}).get("commit", ""), "figures": figures}


def targets_section(r: Results) -> List[str]:
    rows = target_rows(r)  # a row without a figure shows "–": not measured (smoke.py checks)
    if not rows:
        return []
    previous = r.raw.get("previous") or {}
    before = previous.get("figures", {})
    cells = []
    for row in rows:
        old = before.get(row.key)
        shown = (row.cell(figure=old) if isinstance(old, dict) else str(old)) if old else "–"
        other = isinstance(old, dict) and old.get("basis", row.basis) != row.basis
        if other:
            shown += f" (× {old.get('basis') or 'another baseline'})"
        elif isinstance(old, dict) and row.figure is not None and row.unit != "s":
            change = row.figure["median"] - old["median"]
            worse = change < 0 if row.at_least else change > 0
            if abs(change) > 0.1 * abs(old["median"]) and worse:
                shown += " ← now worse"
        cells.append([row.item, row.target, row.cell(), shown, row.verdict()])
    met = [row for row in rows if row.met() is True]
    missed = [row for row in rows if row.met() is False]
    when = (f"the run of {previous['started']}"
            + (f" (commit {previous['commit']})" if previous.get("commit") else "")
            + (f", load average {previous['load_average'][0]:.1f}"
               if previous.get("load_average") else "")) if previous else "none recorded"
    return ([SECTION, "",
             "Every figure of this table comes from this run (section 9 and the sweep have the "
             "times behind it). Ratios are medians over rounds of the within-round ratio, IQR "
             "in brackets; below 1 is faster than the baseline. A verdict is this run's "
             "median against the target. Previous: " + when + "; \"–\" where that run did "
             "not measure it; \"now worse\" marks a ratio more than 10 % worse than then.", "",
             f"Targets met: {len(met)} of {len(met) + len(missed)} with a limit. This run's "
             f"load average: {_load(r.raw)}.", ""]
            + table(["issue", "target", "this run", "previous run", "verdict"], cells))


def _load(raw: Dict[str, Any]) -> str:
    start = raw["machine"]["load_average"][0]
    end = raw.get("load_average_end")
    return f"{start:.1f} at the start" + (f", {end[0]:.1f} at the end" if end else "")


def detail_section(r: Results) -> List[str]:
    lines = _redis_detail(r) + _tables_detail(r) + _cold_detail(r)
    return [DETAIL, ""] + lines if lines else []


def _redis_detail(r: Results) -> List[str]:
    rows = []
    for n in r.sizes("few"):
        def t(contender: str, op: str, n: int = n) -> str:
            return time_cell(_samples(r.by_group.get(("few", n, "redis", contender, op))))

        floor = _samples(r.by_group.get(("few", n, "redis", *FLOOR)))
        if floor is None:
            continue
        ratios = [paired_ratio(m, b) for m, b in (
            (r.by_group.get(("few", n, "redis", "redis", "push")),
             r.by_group.get(("few", n, "redis", *base))) for base in REDIS_BASELINES) if m and b]
        push, pull = floor_share(r, n, "push"), floor_share(r, n, "pull")
        rows.append([size_label(n), t("redis", "push"), t("redis-py", "push"),
                     t("redis-py pipelined", "push"),
                     " / ".join(f"{s['median']:.2f}" for s in ratios) or "–",
                     t("redis", "push, new table"), t("redis", "pull"), t("redis-py", "pull"),
                     f"{time_cell(floor)}, {n / floor['median'] / GB:.2f} GB/s",
                     f"{num(push['median'])} %" if push else "–",
                     f"{num(pull['median'])} %" if pull else "–"])
    if not rows:
        return []
    return (["### Redis: both hand-written pushes and the wire's floor, same rounds", "",
             "Medians (IQR) over the Redis group's rounds. Hand-written push: one `SET` per "
             "leaf (`r.set(key, leaf.tobytes())`), and the same `SET`s in one redis-py "
             "pipeline (`transaction=False`, one round trip). The floor: the nest's bytes over "
             "a raw loopback TCP socket pair, `sendall` of each leaf's memory into a receiver "
             "thread's `recv_into` of a buffer allocated once, until every byte arrived; "
             "\"% of floor\" is the floor's time over varsync's, round by round. A new table's "
             "first push: once per round, into a table made (untimed) for it.", ""]
            + table(["nest", "varsync push", "per-leaf SETs", "pipelined SETs",
                     "push / per-leaf, / pipelined", "first push, new table", "varsync pull",
                     "hand GETs", "raw TCP floor", "push, % of floor", "pull, % of floor"],
                    rows))


def _tables_detail(r: Results) -> List[str]:
    tables = r.raw.get("many_tables")
    if not tables:
        return []
    s = summary(tables["samples"])
    sweep = [p for (lay, _, c), p in r.polls.items() if lay == "few" and c == "reverb"]
    shown = (f"; on the sweep's server (a table of 4 leaves per size) "
             f"{seconds_text(statistics.median(sweep[0]))} at the smallest size"
             if sweep else "")
    return ["### Reverb: pull_if_newer with many tables on the server", "",
            f"A Reverb server of its own holding {tables['tables']} tables of {tables['leaves']} "
            f"float32 leaves ({size_label(tables['table_bytes'])} each, every one pushed once); "
            f"{s['n']} calls of `pull_if_newer` unchanged on one of them, each timed alone: "
            f"median {seconds_text(s['median'])}, p90 {seconds_text(s['p90'])}, max "
            f"{seconds_text(s['max'])}{shown}.", ""]


def _cold_detail(r: Results) -> List[str]:
    from .cold_start import NEEDS

    records = cold(r)
    if not records:
        return []
    rows = []
    for name in COLD_BACKENDS:
        c = records.get(name)
        if not c:
            continue
        got = c["samples"]

        def part(key: str, got: List[Dict[str, Any]] = got) -> str:
            return seconds_text(statistics.median(s[key] for s in got))

        heavy = sorted({m for s in got for m in s["heavy"]})
        rows.append([f"{name}://", time_cell(summary([s["seconds"] for s in got])),
                     part("import"), part("connect"),
                     part("create + push") if name == "memory" else "–", part("pull"),
                     ", ".join(heavy) or "none", ", ".join(NEEDS[name]) or "none"])
    first = next(iter(records.values()))
    return ["### Cold start: a new process's first connect + pull", "",
            f"Each sample a fresh `python -m benchmarks.cold_start URL` ({len(first['samples'])} "
            "per backend, taking turns), its clock started just before `import varsync` "
            "(Python's start-up excluded, the backend's imports included) and stopped when "
            f"`pull` of a {size_label(first['bytes'])} table (4 float32 arrays, filled by the "
            "suite) returned. memory:// keeps nothing across processes: its process creates "
            "the table and pushes before it pulls (building the nest is not counted). "
            "Heavy modules: which of tensorflow, reverb, redis, torch, jax were in "
            "`sys.modules` after the pull.", ""] + table(
        ["backend", "total, median (IQR)", "import varsync", "connect", "create + push",
         "pull", "heavy modules imported", "what it uses"], rows)


def _samples(values: Optional[List[float]]) -> Optional[Stat]:
    return summary(values) if values else None
