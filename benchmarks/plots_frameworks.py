"""``frameworks.png``: the framework group's four comparisons (issue 14.8), varsync beside
what PyTorch's and JAX's users write by hand, medians with interquartile ranges, the
round-by-round ratio and its target in each panel's title."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from .common import machine_line, size_label
from .report_frameworks import TARGETS, Frameworks

DPI = 110
MINE, THEIRS = "#2ca02c", "#8c6d31"


#: Further bars per panel beside the target's own: (part, contender, operation, label).
EXTRA = {
    "torch shm": [
        ("torch shm, 1 thread", "torch", "load_state_dict(copy)", "load_state_dict\n(1 thread)"),
        ("torch shm, 1 thread", "varsync shm://", "update(module)", "update\n(1 thread)"),
    ],
    "jax shm": [("jax shm", "jax", "device_put(numpy, unaligned)", "device_put\n(unaligned)")],
    "torchrl": [("torchrl", "torchrl MultiProcess", "send", "MultiProcess\nsend")],
}
#: Panels with a bar for the sum of varsync's operations (the target's own side), labelled.
TOTALS = {"torchrl": "varsync\ntotal"}
SHORT = {
    "load_state_dict(copy)": "load_state_dict",
    "update(module)": "update",
    "device_put(numpy)": "device_put",
    "pull(like=tree)": "pull(like=)",
    "until the worker applied": "then applied",
}


def _label(contender: str, op: str) -> str:
    who = {
        "by hand": "hand",
        "varsync redis://": "varsync",
        "varsync shm://": "varsync",
        "torchrl SharedMem": "SharedMem",
        "torchrl MultiProcess": "MultiProcess",
    }
    return f"{who.get(contender, contender)}\n{SHORT.get(op, op)}"


def draw(results: dict[str, Any], path: Path) -> Path:
    section = results["frameworks"]
    f = Frameworks(section)
    fig, axes = plt.subplots(
        1, len(TARGETS), figsize=(16, 5), gridspec_kw={"width_ratios": [4, 4, 4, 3]}
    )
    for ax, target in zip(axes, TARGETS):
        s, word = f.verdict(target)
        if s is None:
            ax.set_title(target.part, fontsize=9.5)
            ax.text(
                0.5,
                0.5,
                textwrap.fill(word, 22),
                ha="center",
                va="center",
                fontsize=8,
                transform=ax.transAxes,
                color="#666666",
            )
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        bars = []  # (label, summary, colour)
        for ops, colour in ((target.theirs, THEIRS), (target.mine, MINE)):
            for op in ops:
                stat = f.stat(target.part, [op])
                if stat:
                    bars.append((_label(*op), stat, colour))
        if target.part in TOTALS:
            stat = f.stat(target.part, target.mine)
            if stat:
                bars.append((TOTALS[target.part], stat, MINE))
        for part, contender, extra_op, label in EXTRA.get(target.part, []):
            stat = f.stat(part, [(contender, extra_op)])
            if stat:
                bars.append((label, stat, MINE if contender.startswith("varsync") else THEIRS))
        for x, (_, stat, colour) in enumerate(bars):
            ms = [stat["median"] * 1e3, stat["q1"] * 1e3, stat["q3"] * 1e3]
            ax.bar(
                x,
                ms[0],
                color=colour,
                alpha=0.85,
                yerr=[[ms[0] - ms[1]], [ms[2] - ms[0]]],
                capsize=4,
            )
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels([b[0] for b in bars], fontsize=7.5)
        ax.set_ylabel("ms per call")
        met = word == "**met**"
        ax.set_title(
            f"{target.part}: varsync / theirs = {s['median']:.2f}\n"
            f"(IQR {s['q1']:.2f}–{s['q3']:.2f}; target ≤ {target.limit:.1f}: "
            f"{'met' if met else 'missed'})",
            fontsize=9,
            color="#1a6e1a" if met else "#b22222",
        )
        ax.grid(axis="y", alpha=0.3)
    plan = section["plan"]
    fig.suptitle(
        f"PyTorch and JAX through varsync, {size_label(plan['nbytes'])} "
        f"({plan['tensors']} tensors), {plan['rounds']} rounds; brown: theirs, "
        "green: varsync",
        fontsize=11,
    )
    fig.text(
        0.01,
        0.01,
        textwrap.fill(
            machine_line(section["machine"]) + ". Medians; bars show the interquartile range; "
            "ratios round by round (redis://: push + pull on each side; torchrl: from send until "
            "a spawned worker applied, varsync's total = send + then applied). Target ratios: "
            "the first bar of each colour (torchrl: SharedMem send against varsync's total).",
            200,
        ),
        fontsize=8.5,
        color="#444444",
    )
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
