"""The pictures of RESULTS.md, drawn from the raw results into ``docs/img/`` (matplotlib,
the ``bench`` extra). Medians; bars the interquartile range."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from .harness import GB, MB, summary
from .report import framework_records, label, sweep_index

STYLE = {  # contender -> (line style, colour): varsync solid, baselines dashed, floors dotted
    "memory": ("-", "tab:blue"),
    "reverb": ("-", "tab:orange"),
    "redis": ("-", "tab:red"),
    "shm": ("-", "tab:green"),
    "varsync drop-in": ("-", "tab:olive"),
    "tf-agents": ("--", "tab:orange"),
    "redis-py SETs": ("--", "tab:red"),
    "redis-py pipelined SETs": ("--", "tab:pink"),
    "redis-py MULTI/EXEC": ("--", "tab:purple"),
    "np.copyto": (":", "black"),
    "tf assign": (":", "tab:gray"),
    "tcp loopback": ("-.", "tab:brown"),
}
FLOORS = {"np.copyto": "copy", "tcp loopback": "transfer"}  # drawn in the push and pull panels


def draw_all(results: dict[str, Any], folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    drawn = {}
    for name, draw in (
        ("throughput", throughput),
        ("poll_latency", polls),
        ("fanout", fanout),
        ("frameworks", frameworks),
    ):
        figure = draw(results)
        if figure is not None:
            drawn[name] = folder / f"{name}.png"
            figure.savefig(drawn[name], dpi=110, bbox_inches="tight")
            plt.close(figure)
    return drawn


def _series(
    index: dict[Any, Any], contender: str, op: str, per_second: bool
) -> tuple[list[float], ...]:
    """Median and IQR per size (4 arrays) of one operation, from the first group timing it."""
    points: dict[int, list[float]] = {}
    for key, record in sorted(index.items()):
        if key[1] == 4 and key[3] == contender and key[4] == op:
            points.setdefault(key[2], record["samples"])
    xs: list[float] = []
    ys: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    for nbytes, samples in sorted(points.items()):
        s = summary(samples)
        med, q1, q3 = (
            (nbytes / s[k] / GB for k in ("median", "q1", "q3"))
            if per_second
            else (s[k] * 1e3 for k in ("median", "q1", "q3"))
        )
        xs.append(nbytes)
        ys.append(med)
        lo.append(med - min(q1, q3))
        hi.append(max(q1, q3) - med)
    return xs, ys, lo, hi


def _line(axis: Any, index: dict[Any, Any], contender: str, op: str, per_second: bool) -> bool:
    xs, ys, lo, hi = _series(index, contender, op, per_second)
    if xs:
        style, colour = STYLE[contender]
        name = label(contender) + ("" if per_second or op == "pull_if_newer" else " (a full pull)")
        axis.errorbar(
            xs, ys, yerr=[lo, hi], ls=style, color=colour, marker="o", ms=3, capsize=2, label=name
        )
    return bool(xs)


def throughput(results: dict[str, Any]) -> Any:
    index = sweep_index(results)
    if not index:
        return None
    figure, axes = plt.subplots(1, 3, figsize=(17, 5.5), sharey=True)
    for axis, op in zip(axes, ("push", "pull", "update")):
        for contender in STYLE:
            name = FLOORS.get(contender, op) if op != "update" else op
            _line(axis, index, contender, name, per_second=True)
        axis.set(xscale="log", yscale="log", title=op, xlabel="nest size (bytes)")
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("GB/s (median; bars: IQR)")
    handles = {h.get_label(): h for axis in axes for h in axis.get_legend_handles_labels()[0]}
    figure.legend(handles.values(), handles.keys(), loc="lower center", ncol=4, fontsize=8)
    figure.subplots_adjust(bottom=0.25)
    return figure


def polls(results: dict[str, Any]) -> Any:
    index = sweep_index(results)
    figure, axis = plt.subplots(figsize=(8, 5))
    drawn = [
        _line(axis, index, c, "pull_if_newer", False) for c in ("memory", "reverb", "redis", "shm")
    ]
    if not (_line(axis, index, "tf-agents", "pull", False) or any(drawn)):
        plt.close(figure)
        return None
    axis.set(
        xscale="log", yscale="log", xlabel="nest size (bytes)", ylabel="ms (median; bars: IQR)"
    )
    axis.set_title("pull_if_newer when nothing changed")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    return figure


def fanout(results: dict[str, Any]) -> Any:
    records = results.get("cross-backend", {}).get("fanout")
    if not records:
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for contender in dict.fromkeys(r["contender"] for r in records):
        mine = [r for r in records if r["contender"] == contender]
        counts = [r["readers"] for r in mine]
        left.plot(
            counts,
            [r["aggregate_bytes_per_s"] / GB for r in mine],
            marker="o",
            label=label(contender),
        )
        right.plot(
            counts,
            [max(r["server_growth"].values()) / MB for r in mine],
            marker="o",
            label=label(contender),
        )
    left.set(xlabel="readers", ylabel="GB/s, all readers", title="aggregate throughput")
    right.set(xlabel="readers", ylabel="MB", title="server memory growth")
    left.legend(fontsize=8)
    return figure


def frameworks(results: dict[str, Any]) -> Any:
    fw = results.get("frameworks")
    if not fw or not fw.get("records"):
        return None
    index = framework_records(fw)
    parts = list(dict.fromkeys(p for p, _, _ in index))
    figure, axes = plt.subplots(1, len(parts), figsize=(4.2 * len(parts), 4.5), squeeze=False)
    for axis, part in zip(axes[0], parts):
        bars = [(f"{c}\n{o}", summary(s)) for (p, c, o), s in index.items() if p == part]
        medians = [s["median"] * 1e3 for _, s in bars]
        errors = [
            [m - s["q1"] * 1e3 for m, (_, s) in zip(medians, bars)],
            [s["q3"] * 1e3 - m for m, (_, s) in zip(medians, bars)],
        ]
        colors = ["tab:green" if "varsync" in name else "tab:brown" for name, _ in bars]
        axis.bar(range(len(bars)), medians, yerr=errors, color=colors, capsize=3)
        axis.set_xticks(
            range(len(bars)), [name for name, _ in bars], fontsize=6, rotation=30, ha="right"
        )
        axis.set(title=part, ylabel="ms")
    return figure
