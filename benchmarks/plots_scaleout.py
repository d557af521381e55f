"""The scale-out picture, drawn from ``results_scaleout.json`` (matplotlib, Agg):

    .venv/bin/python -m benchmarks.plots_scaleout benchmarks/results_scaleout.json [docs/img]

``scaleout.png``: for each nest size and actor count, the time until every actor holds a
new version with R replicas over the time with the primary alone (median over versions),
star and chain replication beside the goal 1.3/R and what the links alone allow for a star.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["draw"]


def _median_all(case: dict[str, Any]) -> float:
    return statistics.median(v["all_seconds"] for v in case["versions"])


def _ratios(results: dict[str, Any]) -> dict[tuple[int, int, str], dict[int, float]]:
    """(bytes, actors, topology) -> {replicas: t(R)/t(0)}."""
    base: dict[tuple[int, int], float] = {}
    for case in results["cases"]:
        if case["replicas"] == 0 and case["versions"]:
            base[(case["bytes"], case["actors"])] = _median_all(case)
    out: dict[tuple[int, int, str], dict[int, float]] = {}
    for case in results["cases"]:
        key = (case["bytes"], case["actors"])
        if case["replicas"] == 0 or key not in base or not case["versions"]:
            continue
        out.setdefault((*key, case["topology"]), {})[case["replicas"]] = (
            _median_all(case) / base[key]
        )
    return out


def draw(results: dict[str, Any], img_dir: Path) -> Path:
    ratios = _ratios(results)
    sizes = sorted({b for b, _, _ in ratios})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.2 * len(sizes), 4.2), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        replicas: list[int] = sorted(
            {r for (b, _, _), rs in ratios.items() if b == size for r in rs}
        )
        ax.plot(replicas, [min(1.3 / r, 1.3) for r in replicas], "k--", label="goal 1.3/R")
        for (b, actors, topology), by_r in sorted(ratios.items()):
            if b != size:
                continue
            xs = sorted(by_r)
            style = "-o" if topology == "star" else "-s"
            ax.plot(xs, [by_r[x] for x in xs], style, label=f"{topology}, {actors} actors")
            if topology == "star":
                floor = [((x - 1) + actors / x) / actors for x in xs]
                ax.plot(
                    xs,
                    floor,
                    ":",
                    color=ax.lines[-1].get_color(),
                    linewidth=1,
                    label=f"star link floor, {actors} actors",
                )
        ax.set_title(f"{size / 1e6:.0f} MB nest, 1 Gbit/s links")
        ax.set_xlabel("replicas R")
        ax.set_ylabel("time until every actor holds a version, / R = 0")
        ax.set_xticks(replicas)
        ax.set_ylim(0, 1.3)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    machine = results.get("machine", {})
    fig.suptitle(
        f"varsync over Redis replication, hosts in network namespaces "
        f"({machine.get('cores', '?')} cores, started {machine.get('started', '?')})",
        fontsize=9,
    )
    fig.tight_layout()
    img_dir.mkdir(parents=True, exist_ok=True)
    path = img_dir / "scaleout.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    import json

    source = Path(argv[0] if argv else "benchmarks/results_scaleout.json")
    img_dir = Path(argv[1] if len(argv) > 1 else "docs/img")
    print(draw(json.loads(source.read_text()), img_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
