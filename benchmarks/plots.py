"""The suite's pictures, drawn from ``results.json`` with matplotlib's Agg backend.

    .venv/bin/python -m benchmarks.plots benchmarks/results.json [docs/img]

- ``throughput.png``: push, pull and update-into-tf.Variable throughput vs nest size, every
  backend beside its baselines (the headline picture);
- ``poll_latency.png``: ``pull_if_newer`` when nothing changed, vs nest size;
- ``fanout.png``: 1-8 reader processes pulling one table: aggregate throughput, server memory;
- ``client_memory.png``: client peak memory above baseline per push / pull, x payload;
- ``frameworks.png``: PyTorch and JAX through varsync beside their hand-written baselines
  (plots_frameworks.py).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FixedLocator, NullLocator

from .common import GB, LABELS, MB, machine_line, size_label, summary

STYLE = {  # colour, line style, marker
    "memory": ("#7f3c8d", "-", "o"),
    "reverb": ("#1f77b4", "-", "s"),
    "redis": ("#d62728", "-", "D"),
    "shm": ("#2ca02c", "-", "^"),
    "tf-agents": ("#6baed6", "--", "s"),
    "redis-py": ("#f4a582", "--", "D"),
    "np.copyto": ("#555555", ":", None),
    "np.copyto fresh": ("#999999", "-.", None),
    "tf assign": ("#8c6d31", (0, (1, 1.5)), None),
    "tcp loopback": ("#000000", (0, (4, 1, 1, 1)), None),
}
DPI = 110


def _footer(
    fig: Any,
    results: dict[str, Any],
    extra: str = "",
    spread: str = "Medians; bars show the interquartile range.",
) -> None:
    text = machine_line(results["machine"]) + ". " + spread
    fig.text(
        0.01,
        0.01,
        text + (" " + extra if extra else ""),
        fontsize=8.5,
        color="#444444",
        ha="left",
        va="bottom",
        wrap=True,
    )


def _size_axis(ax: Any, sizes: list[int]) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_minor_locator(NullLocator())
    # Sizes closer than half a decade to the previous one go on a second line.
    labels = [
        ("\n" if i and s / sizes[i - 1] < 3.2 else "") + size_label(s) for i, s in enumerate(sizes)
    ]
    ax.set_xticklabels(labels, fontsize=9)
    ax.set_xlim(min(sizes) / 1.6, max(sizes) * 1.6)
    ax.set_xlabel("nest size (4 float32 arrays)")


Series = dict[str, list[tuple[int, dict[str, float]]]]  # contender -> [(bytes, summary)]


def _sweep_series(results: dict[str, Any], op: str) -> Series:
    """contender -> [(bytes, summary of seconds)] for the 4-array layout."""
    series: Series = defaultdict(list)
    pooled: dict[tuple[str, int], list[float]] = defaultdict(list)
    for record in results.get("sweep", []):
        if record["layout"] == "few" and record["op"] == op:
            pooled[(record["contender"], record["bytes"])].extend(record["samples"])
    for (contender, nbytes), samples in sorted(pooled.items(), key=lambda item: item[0][1]):
        series[contender].append((nbytes, summary(samples)))
    return series


def throughput(results: dict[str, Any], path: Path) -> Path:
    contenders = ["memory", "reverb", "redis", "shm", "tf-agents", "redis-py"]
    panels = [
        ("push", "push", contenders, ["np.copyto", "tcp loopback"]),
        ("pull", "pull", contenders, ["np.copyto", "np.copyto fresh", "tcp loopback"]),
        ("update", "update into tf.Variables", contenders, ["tf assign"]),
    ]
    copies = {**_sweep_series(results, "copy"), **_sweep_series(results, "transfer")}
    sizes = sorted({r["bytes"] for r in results.get("sweep", []) if r["layout"] == "few"})
    fig, axes = plt.subplots(1, 3, figsize=(17, 7.2), sharey=True)
    handles: dict[str, Any] = {}
    for ax, (op, title, contenders, references) in zip(axes, panels):
        series = _sweep_series(results, op)
        for name in references:
            points = copies.get(name) if name in copies else series.get(name)
            handles[name] = _line(ax, name, points or [])
        for name in contenders:
            if series.get(name):
                handles[name] = _line(ax, name, series[name])
        refused = [
            f for f in results.get("refusals", []) if f["op"] == "push" and f["layout"] == "few"
        ]
        for i, refusal in enumerate(refused):
            colour = STYLE[refusal["contender"]][0]
            ax.plot(
                [refusal["bytes"]],
                [0.04 + 0.055 * i],
                marker="x",
                markersize=9,
                mew=2.5,
                color=colour,
                linestyle="none",
                transform=ax.get_xaxis_transform(),
                zorder=5,
            )
        ax.set_title(title, fontsize=13)
        ax.set_yscale("log")
        ax.grid(True, which="major", alpha=0.3)
        if sizes:
            _size_axis(ax, sizes)
    axes[0].set_ylabel("throughput (GB/s, payload bytes / median time)")
    if any(r["layout"] == "few" for r in results.get("refusals", [])):
        handles["refused"] = axes[0].plot(
            [], [], marker="x", color="#333333", linestyle="none", markersize=10, mew=2.5
        )[0]
    labels = {
        **LABELS,
        "refused": "x at the bottom: not possible above 2 GiB (Reverb, "
        "TF-Agents: by design; redis-py: 512 MB per SET)",
    }
    order = [
        n
        for n in [
            "memory",
            "reverb",
            "redis",
            "shm",
            "tf-agents",
            "redis-py",
            "np.copyto",
            "np.copyto fresh",
            "tf assign",
            "tcp loopback",
            "refused",
        ]
        if n in handles
    ]
    fig.suptitle(
        "Throughput vs nest size: varsync backends and their baselines, same run",
        fontsize=15,
        y=0.985,
        va="top",
    )
    fig.legend(
        [handles[n] for n in order],
        [labels[n] for n in order],
        loc="upper center",
        ncol=5,
        fontsize=10,
        frameon=False,
        bbox_to_anchor=(0.5, 0.945),
    )
    _footer(
        fig,
        results,
        "memory:// and shm:// pulls return read-only views (no copy): "
        "compare them in the update panel.",
    )
    fig.subplots_adjust(left=0.055, right=0.99, top=0.77, bottom=0.17, wspace=0.06)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _line(ax: Any, name: str, points: list[tuple[int, dict[str, float]]]) -> Any:
    colour, style, marker = STYLE[name]
    if not points:
        return ax.plot([], [], color=colour, linestyle=style, marker=marker)[0]
    xs = [b for b, _ in points]
    ys = [b / s["median"] / GB for b, s in points]
    low = [y - b / s["q3"] / GB for (b, s), y in zip(points, ys)]
    high = [b / s["q1"] / GB - y for (b, s), y in zip(points, ys)]
    container = ax.errorbar(
        xs,
        ys,
        yerr=[low, high],
        color=colour,
        linestyle=style,
        marker=marker,
        markersize=5,
        linewidth=1.8,
        capsize=2.5,
        elinewidth=1,
    )
    return container.lines[0]


def poll_latency(results: dict[str, Any], path: Path) -> Path:
    pooled: dict[tuple[str, int], list[float]] = defaultdict(list)
    for record in results.get("polls", []):
        if record["layout"] == "few" and record.get("op", "pull_if_newer") == "pull_if_newer":
            pooled[(record["contender"], record["bytes"])].extend(record["samples"])
    fig, ax = plt.subplots(figsize=(10, 6.2))
    sizes = sorted({b for _, b in pooled})
    for name in ["memory", "reverb", "redis", "shm"]:
        points = sorted((b, summary(s)) for (c, b), s in pooled.items() if c == name)
        if not points:
            continue
        colour, style, marker = STYLE[name]
        xs = [b for b, _ in points]
        ax.plot(
            xs,
            [s["median"] * 1e6 for _, s in points],
            color=colour,
            linestyle=style,
            marker=marker,
            label=LABELS[name] + ": pull_if_newer, nothing newer",
        )
        ax.fill_between(
            xs,
            [s["q1"] * 1e6 for _, s in points],
            [s["q3"] * 1e6 for _, s in points],
            color=colour,
            alpha=0.15,
            linewidth=0,
        )
    tfa = _sweep_series(results, "pull").get("tf-agents", [])
    if tfa:
        colour, style, marker = STYLE["tf-agents"]
        ax.plot(
            [b for b, _ in tfa],
            [s["median"] * 1e6 for _, s in tfa],
            color=colour,
            linestyle=style,
            marker=marker,
            label="TF-Agents: no version to check, must pull the whole nest",
        )
    ax.set_yscale("log")
    ax.set_ylabel("latency of one call (µs, median; band: IQR; log scale)")
    if sizes:
        _size_axis(ax, sorted(set(sizes) | {b for b, _ in tfa}))
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=9, loc="best")
    ax.set_title("Learning that nothing changed: cost vs nest size", fontsize=13)
    _footer(fig, results, "", "Medians; bands show the interquartile range.")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def fanout(results: dict[str, Any], path: Path) -> Path:
    records = results.get("fanout", [])
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 6))
    payload = records[0]["bytes"] if records else 0
    for name in ["reverb", "redis", "shm"]:
        mine = sorted((r for r in records if r["contender"] == name), key=lambda r: r["readers"])
        if not mine:
            continue
        colour, style, marker = STYLE[name]
        readers = [r["readers"] for r in mine]
        left.plot(
            readers,
            [r["aggregate_bytes_per_s"] / GB for r in mine],
            color=colour,
            linestyle=style,
            marker=marker,
            label=LABELS[name],
        )
        for metric, growth in _growth_series(mine).items():
            dashed = metric in ("used_memory",)
            right.plot(
                readers,
                [g / MB for g in growth],
                color=colour,
                linestyle="--" if dashed else "-",
                marker=marker,
                label=f"{LABELS[name]}: {metric}",
            )
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        counts = results.get("plan", {}).get("fanout_readers", [1, 2, 4, 8])
        ax.xaxis.set_major_locator(FixedLocator(counts))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("reader processes pulling at once")
        ax.grid(True, alpha=0.3)
    left.set_ylabel("aggregate throughput (GB/s, all readers)")
    left.set_ylim(bottom=0)
    left.set_title(
        f"Fan-out: every reader updates its own arrays from one {size_label(payload)} table",
        fontsize=11.5,
    )
    left.legend(fontsize=9)
    right.set_ylabel("server memory growth while pulling (MB, peak above before)")
    right.set_title("Server memory growth (shm://: bytes in /dev/shm; no server)", fontsize=11.5)
    right.set_ylim(0, max(right.get_ylim()[1], payload / MB * 1.15))
    if payload:
        right.axhline(
            payload / MB,
            color="#999999",
            linestyle=":",
            linewidth=1,
            label=f"one payload ({size_label(payload)})",
        )
    right.legend(fontsize=8.5)
    _footer(
        fig,
        results,
        f"{results['machine']['cores']} cores are shared by the server and "
        "all readers: beyond that, readers take turns.",
        "One run per point.",
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _growth_series(records: list[dict[str, Any]]) -> dict[str, list[float]]:
    metrics: dict[str, list[float]] = defaultdict(list)
    for record in records:
        for metric, growth in record["server_growth"].items():
            metrics[metric].append(max(growth, 0))
    return metrics


def client_memory(results: dict[str, Any], path: Path) -> Path:
    records = results.get("client_memory", [])
    order = [
        c
        for c in ["memory", "reverb", "tf-agents", "redis", "redis-py", "shm"]
        if any(r["contender"] == c for r in records)
    ]
    fig, ax = plt.subplots(figsize=(11, 5.8))
    width = 0.38
    for offset, op, hatch in ((-width / 2, "push", ""), (width / 2, "pull", "//")):
        values = []
        for contender in order:
            match = [r for r in records if r["contender"] == contender and r["op"] == op]
            values.append(match[0]["peak_above_baseline"] / match[0]["bytes"] if match else 0)
        bars = ax.bar(
            [i + offset for i in range(len(order))],
            values,
            width,
            color=[STYLE[c][0] for c in order],
            hatch=hatch,
            edgecolor="white",
            label=op,
        )
        for bar, value in zip(bars, values):
            ax.text(
                bar.get_x() + bar.get_width() / 2,
                value + 0.02,
                f"{value:.2f}",
                ha="center",
                va="bottom",
                fontsize=8.5,
            )
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels([LABELS[c].replace(" ", "\n", 1) for c in order], fontsize=9)
    ax.axhline(1.0, color="#999999", linestyle=":", linewidth=1, label="one copy of the payload")
    ax.set_ylabel("client peak memory above baseline (× payload)")
    payload = records[0]["bytes"] if records else 0
    ax.set_title(
        "Client memory during one push (plain) and one pull (hatched), "
        f"{size_label(payload)} nest, fresh process each",
        fontsize=12,
    )
    ax.legend(fontsize=9)
    ax.set_ylim(bottom=0)
    _footer(
        fig,
        results,
        "A pull that returns new arrays needs at least 1x; memory:// and shm:// "
        "pulls return views.",
        "One measurement per bar.",
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def draw_all(
    results: dict[str, Any], folder: Path, groups: Sequence[str] = ("cross-backend", "frameworks")
) -> dict[str, Path]:
    """The PNGs of ``groups`` that ``results`` has data for."""
    folder.mkdir(parents=True, exist_ok=True)
    drawn = {}
    for name, draw in (
        ("throughput", throughput),
        ("poll_latency", poll_latency),
        ("fanout", fanout),
        ("client_memory", client_memory),
    ):
        wanted = {"fanout": "fanout", "client_memory": "client_memory"}.get(name, "sweep")
        if "cross-backend" in groups and results.get(wanted):
            drawn[name] = draw(results, folder / f"{name}.png")
    if "frameworks" in groups and results.get("frameworks", {}).get("records"):
        from . import plots_frameworks

        drawn["frameworks"] = plots_frameworks.draw(results, folder / "frameworks.png")
    return drawn


if __name__ == "__main__":
    import json

    source = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results.json")
    target = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/img")
    for drawn in draw_all(json.loads(source.read_text()), target).values():
        print(drawn)
