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

STYLE = {  # contender -> line style: varsync solid, baselines dashed, floors dotted
    "memory": "-",
    "reverb": "-",
    "redis": "-",
    "shm": "-",
    "tf-agents": "--",
    "redis-py SETs": "--",
    "redis-py MULTI/EXEC": "--",
    "np.copyto": ":",
    "tf assign": ":",
    "tcp loopback": "-.",
}


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
    points = sorted(
        (k[2], r["samples"])
        for k, r in index.items()
        if k[1] == 4 and k[3] == contender and k[4] == op
    )
    xs, ys, lo, hi = [], [], [], []
    for nbytes, samples in points:
        s = summary(samples)
        if per_second:
            xs.append(nbytes)
            ys.append(nbytes / s["median"] / GB)
            lo.append(ys[-1] - nbytes / s["q3"] / GB)
            hi.append(nbytes / s["q1"] / GB - ys[-1])
        else:
            xs.append(nbytes)
            ys.append(s["median"] * 1e3)
            lo.append(ys[-1] - s["q1"] * 1e3)
            hi.append(s["q3"] * 1e3 - ys[-1])
    return xs, ys, lo, hi


def throughput(results: dict[str, Any]) -> Any:
    index = sweep_index(results)
    if not index:
        return None
    figure, axes = plt.subplots(1, 3, figsize=(17, 5.5), sharey=True)
    for axis, op in zip(axes, ("push", "pull", "update")):
        for contender, style in STYLE.items():
            ops = [op] if contender not in ("np.copyto", "tcp loopback") else ["copy", "transfer"]
            for name in ops:
                xs, ys, lo, hi = _series(index, contender, name, per_second=True)
                if xs and (name == op or op != "update"):
                    axis.errorbar(
                        xs,
                        ys,
                        yerr=[lo, hi],
                        ls=style,
                        marker="o",
                        ms=3,
                        capsize=2,
                        label=label(contender),
                    )
        axis.set(xscale="log", yscale="log", title=op, xlabel="nest size (bytes)")
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("GB/s (median; bars: IQR)")
    axes[0].legend(fontsize=7)
    return figure


def polls(results: dict[str, Any]) -> Any:
    index = sweep_index(results)
    figure, axis = plt.subplots(figsize=(8, 5))
    drawn = False
    for contender, op in [(c, "pull_if_newer") for c in ("memory", "reverb", "redis", "shm")] + [
        ("tf-agents", "pull")
    ]:
        xs, ys, lo, hi = _series(index, contender, op, per_second=False)
        if xs:
            drawn = True
            name = label(contender) + (" (a full pull)" if op == "pull" else "")
            axis.errorbar(
                xs, ys, yerr=[lo, hi], marker="o", ms=3, capsize=2, label=name, ls=STYLE[contender]
            )
    if not drawn:
        plt.close(figure)
        return None
    axis.set(
        xscale="log",
        yscale="log",
        xlabel="nest size (bytes)",
        ylabel="ms",
        title="pull_if_newer when nothing changed",
    )
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
