"""Write ``benchmarks/RESULTS.md`` from the suite's results (see suite.py).

    .venv/bin/python benchmarks/report.py benchmarks/results.json [benchmarks/RESULTS.md]

Every figure is computed here from the raw samples: medians, interquartile ranges, and
ratios taken round by round between operations timed side by side.
"""

from __future__ import annotations

import os
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GB, LABELS, MB, machine_line, paired_ratio, seconds_text, size_label, summary  # noqa: E402

Key = Tuple[str, int, str, str]  # layout, bytes, contender, op


class Results:
    """Lookups over the raw records."""

    def __init__(self, results: Dict[str, Any]) -> None:
        self.raw = results
        self.m = results["machine"]
        self.by_group: Dict[Tuple[str, int, str, str, str], List[float]] = {}
        self.pooled: Dict[Key, List[float]] = defaultdict(list)
        for r in results.get("sweep", []):
            self.by_group[(r["layout"], r["bytes"], r["group"], r["contender"], r["op"])] = r["samples"]
            self.pooled[(r["layout"], r["bytes"], r["contender"], r["op"])].extend(r["samples"])
        self.polls = {(r["layout"], r["bytes"], r["contender"]): r["samples"] for r in results.get("polls", [])}
        self.refusals = results.get("refusals", [])

    def sizes(self, layout: str) -> List[int]:
        return sorted({b for (lay, b, _, _) in self.pooled if lay == layout})

    def stat(self, layout: str, nbytes: int, contender: str, op: str) -> Optional[Dict[str, float]]:
        samples = self.pooled.get((layout, nbytes, contender, op))
        return summary(samples) if samples else None

    def ratio(self, layout: str, nbytes: int, group: str, mine: Tuple[str, str],
              other: Tuple[str, str]) -> Optional[Dict[str, float]]:
        a = self.by_group.get((layout, nbytes, group, *mine))
        b = self.by_group.get((layout, nbytes, group, *other))
        return paired_ratio(a, b) if a and b else None

    def push_pull_ratio(self, layout: str, nbytes: int) -> Optional[Dict[str, float]]:
        """varsync reverb push+pull over TF-Agents' push+pull, round by round."""
        parts = [self.by_group.get((layout, nbytes, "reverb", c, op))
                 for c in ("reverb", "tf-agents") for op in ("push", "pull")]
        if not all(parts):
            return None
        mine = [a + b for a, b in zip(parts[0], parts[1])]
        theirs = [a + b for a, b in zip(parts[2], parts[3])]
        return paired_ratio(mine, theirs)

    def refusal(self, layout: str, nbytes: int, contender: str) -> Optional[str]:
        for r in self.refusals:
            if r["layout"] == layout and r["bytes"] == nbytes and r["contender"] == contender:
                return r["reason"]
        return None


# -- formatting ---------------------------------------------------------------------------------


def num(x: float) -> str:
    """Three significant digits without exponents: 0.884, 21.4, 1110."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def time_cell(s: Optional[Dict[str, float]]) -> str:
    if not s:
        return "–"
    median = s["median"]
    scale, unit = (1, "s") if median >= 1 else (1e3, "ms") if median >= 1e-3 else (1e6, "µs")
    return f"{num(median * scale)} {unit} ({num(s['q1'] * scale)}–{num(s['q3'] * scale)})"


VIEWS = ("memory", "shm")  # backends whose pull returns views of stored bytes


def ratio_cell(s: Optional[Dict[str, float]]) -> str:
    return f"{s['median']:.2f} ({s['q1']:.2f}–{s['q3']:.2f})" if s else "–"


def rate(nbytes: int, s: Optional[Dict[str, float]]) -> str:
    return f"{nbytes / s['median'] / GB:.2f} GB/s" if s else "–"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "l") -> List[str]:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i == 0 else ("---:" if align == "r" else "---") for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def refusal_word(reason: Optional[str]) -> str:
    return "not run" if reason and reason.startswith("not run") else "refused"


def demote(markdown: str, levels: int = 2) -> str:
    return re.sub(r"^(#+) ", lambda m: "#" * (len(m.group(1)) + levels) + " ", markdown, flags=re.M)


def rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")


# -- sections ---------------------------------------------------------------------------------------


def header(r: Results, images: Dict[str, Path], out: Path, json_path: Path) -> List[str]:
    m, raw = r.m, r.raw
    versions = raw.get("versions", {})
    lines = [
        "# varsync benchmarks",
        "",
        f"Regenerated by `make bench` ([benchmarks/suite.py](suite.py)) on {m['started']} (machine clock), "
        f"in {raw.get('seconds', 0) / 60:.1f} minutes. **Machine: {m['cores']} cores "
        f"({m['cpu']}), {m['memory_gib']:.0f} GiB**, {m['platform']}; Python {m['python']}, "
        + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "",
        f"The machine is shared with other engineers' builds and tests and is **noisy** (load "
        f"average {m['load_average'][0]:.1f} when the run started): every figure is a median with "
        "its spread (the interquartile range, in brackets), and backends are compared by ratios "
        "taken round by round between operations that took turns in the same rounds, not by "
        "single times. Servers ran on this machine, on loopback, sharing its cores with the clients.",
        "",
        f"How the suite works and how to read it: [docs/benchmarks.md](../docs/benchmarks.md). "
        f"Every sample: [{json_path.name}]({rel(json_path, out.parent)}).",
        "",
    ]
    if raw.get("quick"):
        lines += ["**Quick run (`--quick`): small sizes and few rounds, for trying the suite out; not "
                  "figures to quote.**", ""]
    if "throughput" in images:
        lines += [f"![Throughput vs nest size]({rel(images['throughput'], out.parent)})", ""]
    return lines


def headline(r: Results) -> List[str]:
    bullets = []
    few = r.sizes("few")
    big_sizes = [s for s in few if s <= GB]
    if big_sizes:
        top = max(big_sizes)
        parts = []
        for name in ["memory", "shm", "redis", "reverb", "tf-agents", "redis-py"]:
            s = r.stat("few", top, name, "update")
            if s:
                parts.append(f"{LABELS[name]} {rate(top, s)}")
        assign = r.stat("few", top, "tf assign", "update")
        if parts:
            bullets.append(f"**Update into tf.Variables, {size_label(top)}**: " + "; ".join(parts)
                           + (f" (the floor, `tf.Variable.assign` from memory: {rate(top, assign)})" if assign else "")
                           + ".")
    scripts = r.raw.get("scripts", {})
    rev = scripts.get("reverb", {}).get("figures", {}).get("push_pull", {})
    reverb_bits = []
    if "varsync numpy" in rev:
        reverb_bits.append(f"{rev['varsync numpy']['ratio']:.2f}× at 40 MB (reverb_bench.py)")
    for nbytes in few:
        s = r.push_pull_ratio("few", nbytes)
        if s and nbytes >= 10 * MB:
            reverb_bits.append(f"{s['median']:.2f}× at {size_label(nbytes)}")
    if reverb_bits:
        bullets.append("**Reverb**: varsync's push+pull takes " + ", ".join(reverb_bits)
                       + " the time of TF-Agents' container on the same server (target ≤ 0.80).")
    redis_bits = []
    for nbytes in few:
        if nbytes >= 100 * MB:
            push = r.ratio("few", nbytes, "redis", ("redis", "push"), ("redis-py", "push"))
            pull = r.ratio("few", nbytes, "redis", ("redis", "pull"), ("redis-py", "pull"))
            if push and pull:
                redis_bits.append(f"{size_label(nbytes)}: push {push['median']:.2f}×, pull {pull['median']:.2f}×")
    if redis_bits:
        bullets.append("**Redis** against hand-written redis-py SET/GET (target ≤ 0.5): " + "; ".join(redis_bits) + ".")
    floor_bits = []
    for name in ["memory", "shm", "redis", "reverb"]:
        bits = []
        for nbytes in few:
            if nbytes >= 100 * MB:
                s = r.ratio("few", nbytes, name, (name, "update"), ("tf assign", "update"))
                if s:
                    bits.append(f"{s['median']:.2f}× at {size_label(nbytes)}")
        if bits:
            floor_bits.append(f"{LABELS[name]} " + ", ".join(bits))
    if floor_bits:
        bullets.append("**Update against its floor** (`tf.Variable.assign` of the same bytes from memory, "
                       "same rounds): " + "; ".join(floor_bits) + ".")
    poll_bits = []
    for name in ["memory", "shm", "redis", "reverb"]:
        medians = [summary(v)["median"] for (lay, _, c), v in r.polls.items() if lay == "few" and c == name]
        if medians:
            poll_bits.append(f"{LABELS[name]} {seconds_text(min(medians))}–{seconds_text(max(medians))}")
    if poll_bits:
        tfa = r.stat("few", max(few), "tf-agents", "pull") if few else None
        sizes_tfa = [s for s in few if r.stat("few", s, "tf-agents", "pull")]
        tail = ""
        if sizes_tfa:
            tail = (f"; TF-Agents has no such call and pulls everything: "
                    f"{seconds_text(r.stat('few', max(sizes_tfa), 'tf-agents', 'pull')['median'])} "
                    f"at {size_label(max(sizes_tfa))}")
        del tfa
        bullets.append("**pull_if_newer when nothing changed**, medians over all sizes from "
                       f"{size_label(min(few))} to {size_label(max(few))}: " + "; ".join(poll_bits) + tail + ".")
    fan = r.raw.get("fanout", [])
    if fan:
        bits = []
        for name in ["reverb", "redis", "shm"]:
            mine = {f["readers"]: f for f in fan if f["contender"] == name}
            if mine:
                lo, hi = mine[min(mine)], mine[max(mine)]
                growth = max(hi["server_growth"].values()) if hi["server_growth"] else 0
                bits.append(f"{LABELS[name]} {lo['aggregate_bytes_per_s'] / GB:.2f} → "
                            f"{hi['aggregate_bytes_per_s'] / GB:.2f} GB/s, server +{growth / MB:.0f} MB")
        bullets.append(f"**Fan-out** from 1 to {max(f['readers'] for f in fan)} readers of "
                       f"{size_label(fan[0]['bytes'])}: " + "; ".join(bits) + ".")
    if not bullets:
        return []
    return ["## Headline", ""] + [f"- {b}" for b in bullets] + [""]


def targets(r: Results) -> List[str]:
    """Issue 3, 4 and 5 targets checked against this run's figures."""
    rows: List[List[str]] = []
    scripts = r.raw.get("scripts", {})

    def verdict(ok: Optional[bool]) -> str:
        return "–" if ok is None else ("**met**" if ok else "**missed**")

    rev = scripts.get("reverb", {}).get("figures", {})
    if rev.get("push_pull"):
        for name in ("varsync numpy", "varsync drop-in (tf.Variable)"):
            if name in rev["push_pull"]:
                ratio = rev["push_pull"][name]["ratio"]
                rows.append(["3 Reverb", "push+pull ≤ 0.80 × TF-Agents', 40 MB", f"{name}: {ratio:.2f}",
                             verdict(ratio <= 0.80)])
    for table_name, figures in rev.get("poll", {}).items():
        rows.append(["3 Reverb", f"pull_if_newer unchanged < 2 ms median, {table_name}",
                     f"{figures['median_ms']:.2f} ms (p90 {figures['p90_ms']:.2f} ms)",
                     verdict(figures["median_ms"] < 2)])
    if rev.get("memory"):
        mem = rev["memory"]
        probe = {m["op"]: m["peak_above_baseline"] / m["bytes"] for m in r.raw.get("client_memory", [])
                 if m["contender"] == "reverb"}
        text = f"reverb_bench.py (RSS sampled in-process): {mem['push']:.2f}× / {mem['pull']:.2f}×"
        if probe:
            text += f"; suite (fresh process, exact peak): {probe.get('push', 0):.2f}× / {probe.get('pull', 0):.2f}×"
        rows.append(["3 Reverb", "client memory of a 400 MB push / pull: measured", text, "recorded"])
    red = scripts.get("redis", {}).get("figures", {})
    sizes = red.get("sizes", {})
    big = max(sizes, key=int) if sizes else None
    if big:
        res = sizes[big]
        for what, key in (("push", "push ratio"), ("pull", "pull ratio")):
            rows.append(["4 Redis", f"{what} ≤ 0.5 × hand-written, {big} MB", f"{res[key]:.2f}",
                         verdict(res[key] <= 0.5)])
        for nbytes in r.sizes("few"):
            if nbytes >= 100 * MB and nbytes <= GB:
                ratios = [(op, r.ratio("few", nbytes, "redis", ("redis", op), ("redis-py", op))) for op in ("push", "pull")]
                if all(v for _, v in ratios):
                    rows.append(["4 Redis", f"the same, suite sweep at {size_label(nbytes)} (not the target's size)",
                                 "; ".join(f"{op} {v['median']:.2f} ({v['q1']:.2f}–{v['q3']:.2f})" for op, v in ratios),
                                 " / ".join(verdict(v["median"] <= 0.5) for _, v in ratios)])
        polls = [(mb, s["pull_if_newer unchanged"]) for mb, s in sizes.items()]
        worst = max(v for _, v in polls)
        sweep = [summary(v)["median"] for (lay, _, c), v in r.polls.items() if c == "redis"]
        text = ", ".join(f"{mb} MB {v * 1e6:.0f} µs" for mb, v in polls)
        if sweep:
            text += f"; suite sweep {min(sweep) * 1e6:.0f}–{max(sweep) * 1e6:.0f} µs"
            worst = max(worst, max(sweep))
        rows.append(["4 Redis", "pull_if_newer unchanged < 1 ms median, any size", text, verdict(worst < 1e-3)])
    mem = red.get("memory", {})
    if mem:
        peak = mem.get("client peak, varsync pull")
        rows.append(["4 Redis", f"client peak during a {mem['megabytes']} MB pull ≤ 1.3 × payload",
                     f"{peak:.2f}× (hand-written {mem.get('client peak, hand pull', 0):.2f}×)", verdict(peak <= 1.3)])
        readers = mem["readers"]
        growth = mem.get(f"server growth, {readers} varsync readers")
        hand = mem.get(f"server growth, {readers} hand readers", 0)
        rows.append(["4 Redis", f"{readers} concurrent readers grow server memory ≤ 10 % of payload",
                     f"{growth * 100:.1f} % (hand-written {hand * 100:.0f} %)", verdict(growth <= 0.10)])
    shm = scripts.get("shm", {}).get("figures", {}).get("sizes", {})
    for size, ops in shm.items():
        steady = ops.get("pull + read", {}).get("ratio_to_copy")
        cold = ops.get("pull + read, new segment", {}).get("ratio_to_copy")
        pull = ops.get("pull", {}).get("ratio_to_copy")
        if steady is not None:
            rows.append(["5 shm", f"pull ≤ 2 × np.copyto, {size}",
                         f"pull (views) {pull:.2f}×; pull + read {steady:.2f}×; first read of a new segment {cold:.2f}×",
                         verdict(steady <= 2) + ("" if cold is None or cold <= 2 else " (steady state; the cold path is over)")])
    if not rows:
        return []
    return (["## Targets of issues 3, 4 and 5, this run", "",
             "From the per-backend scripts below, run in this same `make bench`. A single run on this "
             "machine moves a ratio by ±0.15 or so (see the spreads); a target is marked by this run's "
             "median, as it came out.", ""]
            + table(["issue", "target", "this run", "verdict"], rows))


def throughput_section(r: Results, images: Dict[str, Path], out: Path) -> List[str]:
    sizes = r.sizes("few")
    if not sizes:
        return []
    lines = ["## 1. Throughput vs size: 4 large float32 arrays", ""]
    if "throughput" in images:
        lines += [f"![Throughput vs nest size]({rel(images['throughput'], out.parent)})", ""]
    lines += [f"*{machine_line(r.m)}.* Each backend was timed in a group with its baselines "
              "(Reverb with TF-Agents' container on the same server and table, Redis with redis-py on "
              "the same server, every group with `np.copyto` of the same bytes into existing arrays); "
              "within a round the group's operations take turns. memory:// and shm:// pulls return "
              "read-only views of the stored bytes (no copy), so their pull is not a transfer: "
              "compare backends on update, which lands the bytes in `tf.Variable`s.", ""]
    contenders = ["memory", "reverb", "tf-agents", "redis", "redis-py", "shm"]
    for op, title in (("push", "push"), ("pull", "pull"), ("update", "update into tf.Variables")):
        rows = []
        for name in contenders:
            cells = []
            for nbytes in sizes:
                s = r.stat("few", nbytes, name, op)
                reason = r.refusal("few", nbytes, name)
                cells.append(time_cell(s) if s else (refusal_word(reason) if reason else "–"))
            if any(c != "–" for c in cells):
                rows.append([LABELS[name]] + cells)
        lines += [f"**{title}**: median time (IQR)", ""] + table(["", *map(size_label, sizes)], rows)
    rows = []
    for name, op in (("np.copyto", "copy"), ("np.copyto fresh", "copy"), ("tf assign", "update")):
        cells = [time_cell(r.stat("few", n, name, op)) for n in sizes]
        rows.append([LABELS[name]] + cells)
    lines += ["**the physical reference**: median time (IQR)", ""] + table(["", *map(size_label, sizes)], rows)
    ratio_rows: List[List[str]] = []
    for op in ("push", "pull", "update"):
        ratio_rows.append([f"reverb / TF-Agents, {op}"] + [
            ratio_cell(r.ratio("few", n, "reverb", ("reverb", op), ("tf-agents", op))) for n in sizes])
    ratio_rows.append(["reverb / TF-Agents, push+pull"] + [ratio_cell(r.push_pull_ratio("few", n)) for n in sizes])
    for op in ("push", "pull", "update"):
        ratio_rows.append([f"redis / redis-py, {op}"] + [
            ratio_cell(r.ratio("few", n, "redis", ("redis", op), ("redis-py", op))) for n in sizes])
    for name in ("memory", "reverb", "redis", "shm"):
        ratio_rows.append([f"{name} push / np.copyto"] + [
            ratio_cell(r.ratio("few", n, name, (name, "push"), ("np.copyto", "copy"))) for n in sizes])
    for name in ("memory", "reverb", "redis", "shm"):
        ratio_rows.append([f"{name} update / tf.Variable.assign"] + [
            ratio_cell(r.ratio("few", n, name, (name, "update"), ("tf assign", "update"))) for n in sizes])
    lines += ["**ratios**, median over rounds of (time / baseline's time in the same round), IQR in "
              "brackets; below 1 is faster than the baseline. `np.copyto` and `tf.Variable.assign` "
              "(from numpy, the floor of any update into TensorFlow variables) were timed in every "
              "group.", ""]
    lines += table(["", *map(size_label, sizes)], ratio_rows)
    return lines


def big_section(r: Results) -> List[str]:
    bigs = [c for c in r.raw.get("cases", []) if c["nbytes"] > 2**31]
    skipped = [s for s in r.raw.get("skipped", []) if "GB" in s.split(":")[0]]
    if not bigs and not skipped:
        return []
    lines = ["## 2. Above 2 GiB", ""]
    for case in bigs:
        n = case["nbytes"]
        lines += [f"*{machine_line(r.m)}.* One nest of {size_label(n)} ({n / 2**30:.2f} GiB, 4 float32 arrays "
                  f"of {n / 4 / MB:.0f} MB), {case['rounds']} rounds; update into tf.Variables not "
                  "timed at this size (memory).", ""]
        rows = []
        for name in ["memory", "reverb", "tf-agents", "redis", "redis-py", "shm", "np.copyto", "np.copyto fresh"]:
            reason = r.refusal("few", n, name)
            if reason:
                rows.append([LABELS[name], reason, "", ""])
                continue
            op = "copy" if name.startswith("np.") else None
            push = r.stat("few", n, name, op or "push")
            if not push:
                continue
            pull = r.stat("few", n, name, "pull") if not op else None
            poll = r.polls.get(("few", n, name))
            pull_text = ""
            if pull:
                pull_text = f"{time_cell(pull)}, " + ("read-only views, no copy" if name in VIEWS else rate(n, pull))
            rows.append([LABELS[name], f"{time_cell(push)}, {rate(n, push)}", pull_text,
                         time_cell(summary(poll)) if poll else ""])
        lines += table(["", "push (or copy)", "pull", "pull_if_newer unchanged"], rows)
    for s in skipped:
        lines += [f"- {s}", ""]
    return lines


def many_section(r: Results) -> List[str]:
    sizes = r.sizes("many")
    if not sizes:
        return []
    leaves = next((c["leaves"] for c in r.raw.get("cases", []) if c["layout"] == "many"), 500)
    lines = [f"## 3. Many small arrays ({leaves} variables) vs few large ones (4)", "",
             f"*{machine_line(r.m)}.* The same total bytes split into {leaves} float32 vectors, "
             "as a policy network with many layers would be; per-array costs (requests, signature "
             "checks, assignments) show here.", ""]
    rows = []
    for name in ["memory", "reverb", "tf-agents", "redis", "redis-py", "shm", "np.copyto", "tf assign"]:
        for op in {"np.copyto": ["copy"], "tf assign": ["update"]}.get(name, ["push", "pull", "update"]):
            cells = []
            for n in sizes:
                few, many = r.stat("few", n, name, op), r.stat("many", n, name, op)
                ratio = f"{many['median'] / few['median']:.2f}×" if few and many else "–"
                cells += [time_cell(many), ratio]
            if any(c != "–" for c in cells):
                rows.append([f"{LABELS[name]} {op}"] + cells)
    notes = []
    for name in ["memory", "reverb", "redis", "shm"]:
        cells = []
        for n in sizes:
            few, many = r.polls.get(("few", n, name)), r.polls.get(("many", n, name))
            few_s, many_s = (summary(few) if few else None), (summary(many) if many else None)
            cells += [time_cell(many_s), f"{many_s['median'] / few_s['median']:.2f}×" if few_s and many_s else "–"]
            if name == "reverb" and few_s and many_s and many_s["median"] > 5 * few_s["median"]:
                notes.append(
                    f"On Reverb, learning that nothing changed costs {seconds_text(many_s['median'])} with "
                    f"{leaves} arrays against {seconds_text(few_s['median'])} with 4, at {size_label(n)}: "
                    "varsync reads a table's version through Reverb's `server_info`, whose reply carries "
                    "the signature of every table on the server, one `TensorSpec` per leaf. A "
                    f"{leaves}-leaf table on a server therefore slows `version`, `pull_if_newer`, `push` and "
                    "`pull` on every table of that server (measured while building this suite: 0.23 ms "
                    "per call with one 4-leaf table, 8.7 ms once a 500-leaf table is added). That is why "
                    "each many-array case here has a Reverb server of its own.")
        rows.append([f"{LABELS[name]} pull_if_newer unchanged"] + cells)
    head = [""]
    for n in sizes:
        head += [f"{size_label(n)}, {leaves} arrays", "vs 4 arrays"]
    lines += table(head, rows)
    for note in notes[:1]:
        lines += [note, ""]
    return lines


def poll_section(r: Results, images: Dict[str, Path], out: Path) -> List[str]:
    sizes = sorted({b for (lay, b, _) in r.polls if lay == "few"})
    if not sizes:
        return []
    lines = ["## 4. pull_if_newer when nothing changed", ""]
    if "poll_latency" in images:
        lines += [f"![pull_if_newer latency vs size]({rel(images['poll_latency'], out.parent)})", ""]
    plan = r.raw.get("plan", {})
    lines += [f"*{machine_line(r.m)}.* Median (p90) of {plan.get('polls', '?')} calls "
              f"({plan.get('reverb_polls', '?')} on Reverb), each timed alone, after the size's "
              "rounds. TF-Agents' container has no version to compare: to learn the train step it "
              "pulls the whole nest (its pull time is shown).", ""]
    rows = []
    for name in ["memory", "reverb", "redis", "shm"]:
        cells = []
        for n in sizes:
            v = r.polls.get(("few", n, name))
            s = summary(v) if v else None
            cells.append(f"{seconds_text(s['median'])} ({seconds_text(s['p90'])})" if s else "–")
        rows.append([LABELS[name]] + cells)
    rows.append(["TF-Agents: a full pull"] + [
        seconds_text(s["median"]) if (s := r.stat("few", n, "tf-agents", "pull")) else "–" for n in sizes])
    return lines + table(["", *map(size_label, sizes)], rows)


def fanout_section(r: Results, images: Dict[str, Path], out: Path) -> List[str]:
    fan = r.raw.get("fanout", [])
    skipped = [s for s in r.raw.get("skipped", []) if s.startswith("fan-out")]
    if not fan:
        return (["## 5. Fan-out", ""] + [f"- {s}" for s in skipped] + [""]) if skipped else []
    payload = fan[0]["bytes"]
    lines = ["## 5. Fan-out: reader processes pulling one table", ""]
    if "fanout" in images:
        lines += [f"![Fan-out scaling]({rel(images['fanout'], out.parent)})", ""]
    lines += [f"*{machine_line(r.m)}.* On a Reverb server and a redis-server of their own, 1 to "
              f"{max(f['readers'] for f in fan)} reader processes (started "
              f"once, connected and warmed before timing) each `update` their own numpy arrays from "
              f"the same {size_label(payload)} table {fan[0]['pulls_each']} times, all at once. "
              "Aggregate = bytes delivered to all readers / wall time from the first start to the "
              "last finish. Server memory: the largest rise during the pulls, sampled every 2 ms — "
              "the server process's resident memory (Reverb, Redis), Redis's own `used_memory`, and "
              "for shm:// (no server) the bytes its table holds in /dev/shm. memory:// lives in one "
              f"process and has no fan-out. With {r.m['cores']} cores shared by the server and every "
              "reader, more readers than cores take turns: aggregate throughput cannot scale past "
              "that here.", ""]
    rows = []
    for f in sorted(fan, key=lambda f: (["reverb", "redis", "shm"].index(f["contender"]), f["readers"])):
        s = summary(f["latencies"])
        growth = "; ".join(f"{k} +{v / MB:.0f} MB ({v / payload:.2f}×)" for k, v in f["server_growth"].items())
        rows.append([LABELS[f["contender"]], str(f["readers"]), f"{f['aggregate_bytes_per_s'] / GB:.2f} GB/s",
                     time_cell(s), growth])
    lines += table(["backend", "readers", "aggregate", "one update, median (IQR)", "server memory growth (× payload)"], rows)
    return lines + [f"- {s}" for s in skipped] + ([""] if skipped else [])


def memory_section(r: Results, images: Dict[str, Path], out: Path) -> List[str]:
    records = r.raw.get("client_memory", [])
    if not records:
        skipped = [s for s in r.raw.get("skipped", []) if s.startswith("client memory")]
        return (["## 6. Client memory", ""] + [f"- {s}" for s in skipped] + [""]) if skipped else []
    payload = records[0]["bytes"]
    lines = ["## 6. Client memory per push and pull", ""]
    if "client_memory" in images:
        lines += [f"![Client memory]({rel(images['client_memory'], out.parent)})", ""]
    lines += [f"*{machine_line(r.m)}.* A fresh process per backend builds a {size_label(payload)} nest "
              "(4 float32 arrays), connects and pushes once (warm-up); then for one push, and one pull "
              "whose result is kept: the peak resident memory (`VmHWM`, reset through "
              "`/proc/self/clear_refs`) minus the resident memory just before. glibc's mmap threshold is "
              "fixed at 128 KiB in these processes (`MALLOC_MMAP_THRESHOLD_`), so that buffers freed by "
              "the warm-up go back to the system instead of hiding the next call's allocations. A pull "
              "that returns new arrays cannot use less than 1×; memory:// and shm:// pulls return views "
              "of stored bytes. For shm://, resident memory counts the pages of the shared segment the "
              "process maps: its push writes one whole segment (1×), which lives in /dev/shm, not in a "
              "private copy.", ""]
    rows = []
    for contender in ["memory", "reverb", "tf-agents", "redis", "redis-py", "shm"]:
        cells = []
        for op in ("push", "pull"):
            match = [m for m in records if m["contender"] == contender and m["op"] == op]
            cells.append(f"{match[0]['peak_above_baseline'] / payload:.2f}× ({match[0]['peak_above_baseline'] / MB:.0f} MB)"
                         if match else "–")
        if any(c != "–" for c in cells):
            rows.append([LABELS[contender]] + cells)
    return lines + table(["", "push", "pull (result kept)"], rows)


def scripts_section(r: Results) -> List[str]:
    scripts = r.raw.get("scripts", {})
    if not scripts:
        return []
    lines = ["## 7. Per-backend benchmarks", "",
             "The three per-backend scripts, each run by `make bench` in its own process, with fewer "
             "rounds than their defaults to fit the 15 minutes (the command is shown); their own "
             "output follows, headings demoted. Their dates, machine and rounds are in their first lines.",
             "Where a script and the suite measure the same thing, they may differ by method (the "
             "scripts' own nests and rounds; see docs/benchmarks.md), and on this machine by noise.", ""]
    titles = {"reverb": "Reverb: varsync vs TF-Agents' container", "redis": "Redis: varsync vs hand-written redis-py and np.copyto",
              "shm": "shm:// vs np.copyto"}
    for name, result in scripts.items():
        lines += [f"### {titles.get(name, name)}", "",
                  f"`{result['command']}` — {result['seconds']:.0f} s, exit status {result['returncode']}.", ""]
        if result.get("returncode"):
            lines += ["```", result.get("error", "").strip()[-1500:], "```", ""]
        lines += [demote(result.get("markdown", "").strip(), 3), ""]
    return lines


def plan_section(r: Results) -> List[str]:
    raw = r.raw
    cases = raw.get("cases", [])
    plan = raw.get("plan", {})
    lines = ["## What was run", ""]
    if cases:
        rows = [[c["layout"] + (" (4 arrays)" if c["layout"] == "few" else f" ({c['leaves']} arrays)"),
                 size_label(c["nbytes"]), str(c["rounds"]), str(c["inner"]), "yes" if c["update"] else "no"]
                for c in cases]
        lines += ["Sizes are decimal (1 MB = 10^6 bytes). Each size: one warm-up round (three for shm://, "
                  "so that both of its alternating segments exist), then the rounds; at small sizes "
                  "each sample times several back-to-back calls (\"calls per sample\") and divides.", ""]
        lines += table(["layout", "size", "rounds", "calls per sample", "update timed"], rows)
    if plan:
        lines += [f"- Fan-out: {size_label(plan['fanout_bytes'])} table, readers {plan['fanout_readers']}, "
                  f"{plan['fanout_pulls']} updates each. Client memory: {size_label(plan['probe_bytes'])} nest.",
                  f"- pull_if_newer: {plan['polls']} calls per size ({plan['reverb_polls']} on Reverb)."]
    lines += ["- Servers: one Reverb server (in a child process; every table made by "
              "`varsync.reverb.serve`, TF-Agents' layout) for the 4-array sizes and the client-memory "
              "probe, one per 500-array case, one for the fan-out; one redis-server (no persistence, "
              "127.0.0.1) for the sweep and one for the fan-out (the redis-server binary the tests "
              "use). All started by the suite and stopped when it ends; the whole run in a network "
              "namespace with loopback only (`scripts/loopback-only`).",
              "- The backends were measured as they were in the working tree at the time of the run."]
    for s in raw.get("skipped", []):
        lines.append(f"- Not run: {s}")
    for refusal in r.refusals:
        lines.append(f"- {LABELS.get(refusal['contender'], refusal['contender'])} {refusal['op']} of "
                     f"{size_label(refusal['bytes'])}: {refusal['reason']}")
    stages = raw.get("stage_seconds")
    if stages:
        lines.append("- Time per stage: " + ", ".join(f"{k} {v:.0f} s" for k, v in stages.items()))
    return lines + [""]


def write(results: Dict[str, Any], out: Path, images: Dict[str, Path], json_path: Path) -> None:
    r = Results(results)
    lines: List[str] = []
    lines += header(r, images, out, json_path)
    lines += headline(r)
    lines += targets(r)
    lines += throughput_section(r, images, out)
    lines += big_section(r)
    lines += many_section(r)
    lines += poll_section(r, images, out)
    lines += fanout_section(r, images, out)
    lines += memory_section(r, images, out)
    lines += scripts_section(r)
    lines += plan_section(r)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines).rstrip() + "\n")


if __name__ == "__main__":
    import json

    source = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results.json")
    target = Path(sys.argv[2] if len(sys.argv) > 2 else "benchmarks/RESULTS.md")
    root = Path(__file__).resolve().parent.parent
    images = {p.stem: p for p in (root / "docs" / "img").glob("*.png")}
    write(json.loads(source.read_text()), target, images, source)
