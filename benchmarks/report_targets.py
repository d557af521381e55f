"""The backend issues' targets (3 Reverb, 4 Redis, 5 shm) checked against this run, and
RESULTS.md section 7: each backend's own figures at the targets' sizes (40 MB and 400 MB),
measured in the sweep's groups and the reader stages."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from .common import GB, LABELS, seconds_text, size_label, summary
from .report_base import Results, Stat, ratio_cell, table, time_cell

REVERB_CLIENTS = ["tf-agents", "reverb", "varsync drop-in"]
SHM_OPS = [("np.copyto", "copy"), ("shm", "push"), ("shm", "pull"), ("shm", "pull + read"),
           ("shm", "update numpy"), ("shm", "push, new segment"),
           ("shm", "pull + read, new segment")]


def verdict(ok: Optional[bool]) -> str:
    return "–" if ok is None else ("**met**" if ok else "**missed**")


def ratio_of_medians(r: Results, nbytes: int, contender: str) -> Optional[float]:
    """The median of ``contender``'s push+pull over TF-Agents' (issue 3's measure)."""
    mine = r.push_pull("few", nbytes, contender)
    theirs = r.push_pull("few", nbytes, "tf-agents")
    return statistics.median(mine) / statistics.median(theirs) if mine and theirs else None


def reader_growth(r: Results, contender: str) -> Optional[Dict[str, Any]]:
    """The reader-memory record of ``contender`` (the largest reader count)."""
    mine = [f for f in r.raw.get("reader_memory", []) if f["contender"] == contender]
    return max(mine, key=lambda f: f["readers"]) if mine else None


def targets(r: Results) -> List[str]:
    sizes = r.target_sizes()
    if not sizes:
        return []
    small, large = min(sizes), max(sizes)
    rows: List[List[str]] = []
    for contender in ("reverb", "varsync drop-in"):
        ratio = ratio_of_medians(r, small, contender)
        if ratio is not None:
            per_round = ratio_cell(r.push_pull_ratio("few", small, contender))
            rows.append(["3 Reverb", f"push+pull ≤ 0.80 × TF-Agents', {size_label(small)}",
                         f"{LABELS[contender]}: {ratio:.2f} (per round {per_round})",
                         verdict(ratio <= 0.80)])
    for n in sizes:
        poll = r.poll("few", n, "reverb")
        if poll:
            rows.append(["3 Reverb", f"pull_if_newer unchanged < 2 ms median, {size_label(n)}",
                         f"{seconds_text(poll['median'])} (p90 {seconds_text(poll['p90'])})",
                         verdict(poll["median"] < 2e-3)])
    push, pull = r.client_peak("reverb", "push"), r.client_peak("reverb", "pull")
    if push and pull:
        rows.append(["3 Reverb", f"client memory of a {size_label(r.plan['probe_bytes'])} push "
                     "/ pull: measured", f"{push[0]:.2f}× / {pull[0]:.2f}× (section 6)",
                     "recorded"])
    for op in ("push", "pull"):
        s = r.ratio("few", large, "redis", ("redis", op), ("redis-py", op))
        if s:
            rows.append(["4 Redis", f"{op} ≤ 0.5 × hand-written, {size_label(large)}",
                         ratio_cell(s), verdict(s["median"] <= 0.5)])
    medians = [summary(v)["median"] for (_, _, c), v in r.polls.items() if c == "redis"]
    if medians:
        rows.append(["4 Redis", "pull_if_newer unchanged < 1 ms median, any size",
                     f"{seconds_text(min(medians))}–{seconds_text(max(medians))} over "
                     f"{len(medians)} cases", verdict(max(medians) < 1e-3)])
    mine, hand = r.client_peak("redis", "pull"), r.client_peak("redis-py", "pull")
    if mine:
        rows.append(["4 Redis", f"client peak during a {size_label(r.plan['probe_bytes'])} "
                     "pull ≤ 1.3 × payload",
                     f"{mine[0]:.2f}× (hand-written {hand[0] if hand else float('nan'):.2f}×)",
                     verdict(mine[0] <= 1.3)])
    growth, hand_growth = reader_growth(r, "redis"), reader_growth(r, "redis-py")
    if growth:
        share = growth["server_growth"]["used_memory"] / growth["bytes"]
        theirs = (hand_growth["server_growth"]["used_memory"] / hand_growth["bytes"]
                  if hand_growth else float("nan"))
        rows.append(["4 Redis", f"{growth['readers']} concurrent readers of "
                     f"{size_label(growth['bytes'])} grow server memory ≤ 10 % of payload",
                     f"{share * 100:.1f} % (hand-written {theirs * 100:.0f} %)",
                     verdict(share <= 0.10)])
    for n in sizes:
        steady = r.ratio("few", n, "shm", ("shm", "pull + read"), ("np.copyto", "copy"))
        views = r.ratio("few", n, "shm", ("shm", "pull"), ("np.copyto", "copy"))
        cold = r.ratio("few", n, "shm", ("shm", "pull + read, new segment"), ("np.copyto", "copy"))
        if steady and views and cold:
            tail = "" if cold["median"] <= 2 else " (steady state; the cold path is over)"
            rows.append(["5 shm", f"pull ≤ 2 × np.copyto, {size_label(n)}",
                         f"pull (views) {views['median']:.2f}×; pull + read "
                         f"{steady['median']:.2f}×; first read of a new segment "
                         f"{cold['median']:.2f}×", verdict(steady["median"] <= 2) + tail])
    return (["## Targets of issues 3, 4 and 5, this run", "",
             "Measured in this run's groups at the targets' sizes (section 7 has every figure "
             "behind them). A single run on this machine moves a ratio by ±0.15 or so (see the "
             "spreads); a target is marked by this run's median, as it came out.", ""]
            + table(["issue", "target", "this run", "verdict"], rows))


def backends_section(r: Results) -> List[str]:
    sizes = r.target_sizes()
    if not sizes:
        return []
    lines = ["## 7. Each backend at the targets' sizes", "",
             f"The sweep's 4-array cases at {' and '.join(map(size_label, sizes))}, where each "
             "group also ran what its backend's issue set a target on: Reverb's drop-in for "
             "TF-Agents' container (pushing `tf.Variable`s), Redis's `version` and `np.copyto` "
             "into new arrays, shm://'s pull + read, update into numpy arrays and cold paths. "
             "Ratios are taken round by round within the group; times are medians (IQR).", ""]
    return lines + _reverb(r, sizes) + _redis(r, sizes) + _shm(r, sizes)


def _reverb(r: Results, sizes: List[int]) -> List[str]:
    rows = []
    for n in sizes:
        base = r.push_pull("few", n, "tf-agents")
        for contender in REVERB_CLIENTS:
            total = r.push_pull("few", n, contender)
            if not total or not base:
                continue
            rows.append([size_label(n), LABELS[contender],
                         time_cell(r.stat("few", n, contender, "push")),
                         time_cell(r.stat("few", n, contender, "pull")),
                         time_cell(_summary(total)),
                         f"{statistics.median(total) / statistics.median(base):.2f}",
                         ratio_cell(r.push_pull_ratio("few", n, contender))])
    polls = []
    for n in sizes:
        poll, full = r.poll("few", n, "reverb"), r.stat("few", n, "tf-agents", "pull")
        if poll:
            polls.append([size_label(n), seconds_text(poll["median"]), seconds_text(poll["p90"]),
                          seconds_text(full["median"]) if full else "–"])
    return (["### Reverb: varsync vs TF-Agents' ReverbVariableContainer, same server", ""]
            + table(["nest", "client", "push", "pull", "push+pull",
                     "ratio of medians to TF-Agents", "per round"], rows)
            + ["Target (issue 3): varsync's push+pull at most 0.80 of TF-Agents'. "
               "pull_if_newer when nothing changed (target: under 2 ms median):", ""]
            + table(["nest", "median", "p90", "TF-Agents' only way: a full pull"], polls)
            + ["Client memory of a push and a pull: section 6.", ""])


def _redis(r: Results, sizes: List[int]) -> List[str]:
    lines = ["### Redis: varsync vs hand-written redis-py and np.copyto, same server", ""]
    for n in sizes:
        lines += [f"**{size_label(n)}** (4 float32 arrays)", ""]
        lines += table(["operation", "median (IQR)", "ratio, per round"], _redis_rows(r, n))
    rows = []
    for contender in ("redis", "redis-py"):
        peak = r.client_peak(contender, "pull")
        if peak:
            rows.append([f"client peak, {LABELS[contender]} pull "
                         f"({size_label(r.plan['probe_bytes'])}, section 6)", f"{peak[0]:.3f}"])
    for contender in ("redis", "redis-py"):
        growth = reader_growth(r, contender)
        if growth:
            for metric, value in growth["server_growth"].items():
                rows.append([f"server growth ({metric}), {growth['readers']} "
                             f"{LABELS[contender]} readers of {size_label(growth['bytes'])}",
                             f"{value / growth['bytes']:.3f}"])
    lines += table(["memory", "multiple of the payload"], rows)
    return lines + ["Targets (issue 4): push and pull ≤ 0.5 × hand-written; pull_if_newer < 1 ms; "
                    "client peak ≤ 1.3 × payload; four readers grow the server ≤ 10 % of it.", ""]


def _redis_rows(r: Results, n: int) -> List[List[str]]:
    def ratio(mine: str, op: str, other: str, other_op: str) -> str:
        s = r.ratio("few", n, "redis", (mine, op), (other, other_op))
        return f"{ratio_cell(s)} × {LABELS[other]}" if s else "–"

    return [
        ["varsync push", time_cell(r.stat("few", n, "redis", "push")),
         ratio("redis", "push", "redis-py", "push")],
        ["hand push", time_cell(r.stat("few", n, "redis-py", "push")), ""],
        ["varsync pull", time_cell(r.stat("few", n, "redis", "pull")),
         ratio("redis", "pull", "redis-py", "pull") + "; "
         + ratio("redis", "pull", "np.copyto fresh", "copy")],
        ["hand pull", time_cell(r.stat("few", n, "redis-py", "pull")), ""],
        ["np.copyto into existing arrays", time_cell(_group(r, n, "np.copyto")), ""],
        ["np.copyto into new arrays", time_cell(_group(r, n, "np.copyto fresh")), ""],
        ["pull_if_newer unchanged", time_cell(r.poll("few", n, "redis")), ""],
        ["version", time_cell(_summary(r.versions.get(("few", n, "redis")))), ""],
    ]


def _shm(r: Results, sizes: List[int]) -> List[str]:
    rows = []
    for n in sizes:
        for contender, op in SHM_OPS:
            s = _group(r, n, contender, op, "shm")
            if not s:
                continue
            ratio = r.ratio("few", n, "shm", (contender, op), ("np.copyto", "copy"))
            rows.append([size_label(n), op if contender == "shm" else "np.copyto (the baseline)",
                         time_cell(s), ratio_cell(ratio), f"{n / s['median'] / GB:.2f}"])
        poll = r.poll("few", n, "shm")
        if poll:
            rows.append([size_label(n), "pull_if_newer unchanged", time_cell(poll), "", ""])
    return (["### shm:// vs np.copyto", "",
             "Steady state: one writer, readers that do not hold on to pulled arrays (the "
             "current segment and the spare alternate). Cold paths, once per round: a reader "
             "holds the two latest versions, so no spare is free; the push allocates and fills "
             "a new segment, and the first pull + read of it faults its pages in.", ""]
            + table(["nest", "operation", "median (IQR)", "ratio to copy, per round", "GB/s"],
                    rows)
            + ["Target (issue 5): pull (+ read) ≤ 2 × np.copyto of the same bytes.", ""])


def _group(r: Results, nbytes: int, contender: str, op: str = "copy",
           group: str = "redis") -> Optional[Stat]:
    """A contender's times within one group (not pooled over groups)."""
    return _summary(r.by_group.get(("few", nbytes, group, contender, op)))


def _summary(samples: Optional[List[float]]) -> Optional[Stat]:
    return summary(samples) if samples else None
