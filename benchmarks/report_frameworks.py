"""RESULTS.md section 8: the framework group (frameworks.py, issue 14.8), PyTorch and JAX
through varsync beside what their users write by hand, with the issue's four targets.

Read from results.json's "frameworks" section, which a run of ``--group frameworks`` in the
modern environment writes and a run of the other group in the TF environment keeps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import paired_ratio, size_label, summary
from .report_base import Stat, ratio_cell, rel, table, time_cell

Op = tuple[str, str]  # (contender, operation)
SECTION = "## 8. PyTorch and JAX (issue 14.8)"


@dataclass
class Target:
    """One of the issue's targets: ``mine`` over ``theirs``, round by round, ≤ ``limit``.
    Each side is one operation or the sum of several timed in the same round."""

    part: str
    what: str
    mine: list[Op]
    theirs: list[Op]
    limit: float
    theirs_label: str


TARGETS = [
    Target(
        "torch shm",
        "`update(module)` over shm://",
        [("varsync shm://", "update(module)")],
        [("torch", "load_state_dict(copy)")],
        1.3,
        "`model.load_state_dict(copy)`, copy an in-memory state_dict (the floor)",
    ),
    Target(
        "torch redis",
        "`push(module)` + `update(module)` over redis://",
        [("varsync redis://", "push"), ("varsync redis://", "pull")],
        [("by hand", "push"), ("by hand", "pull")],
        0.5,
        "`torch.save` to bytes + SET, GET + `torch.load` + `load_state_dict` (unpickles)",
    ),
    Target(
        "torchrl",
        "`VarsyncWeightSyncScheme` over shm://: `send` until a spawned worker applied it",
        [("varsync shm://", "send"), ("varsync shm://", "until the worker applied")],
        [("torchrl SharedMem", "send")],
        1.0,
        "TorchRL's `SharedMemWeightSyncScheme.send` (MultiSyncCollector's default for a "
        "policy module; returns on the worker's acknowledgement)",
    ),
    Target(
        "jax shm",
        "`pull(like=tree)` over shm://",
        [("varsync shm://", "pull(like=tree)")],
        [("jax", "device_put(numpy)")],
        1.3,
        "`jax.device_put` of the same tree of numpy arrays (64-byte aligned)",
    ),
]


class Frameworks:
    """Lookups over results.json's "frameworks" section."""

    def __init__(self, section: dict[str, Any]) -> None:
        self.raw = section
        self.samples: dict[tuple[str, str, str], list[float]] = {
            (r["part"], r["contender"], r["op"]): r["samples"] for r in section.get("records", [])
        }
        self.skipped: dict[str, str] = section.get("skipped", {})

    def series(self, part: str, ops: list[Op]) -> list[float] | None:
        """The round-by-round sum of ``ops`` in ``part``."""
        found = [self.samples.get((part, *op)) for op in ops]
        if not ops or not all(found):
            return None
        return [sum(values) for values in zip(*[f for f in found if f])]

    def stat(self, part: str, ops: list[Op]) -> Stat | None:
        values = self.series(part, ops)
        return summary(values) if values else None

    def ratio(self, part: str, mine: list[Op], theirs: list[Op]) -> Stat | None:
        a, b = self.series(part, mine), self.series(part, theirs)
        return paired_ratio(a, b) if a and b else None

    def verdict(self, target: Target) -> tuple[Stat | None, str]:
        s = self.ratio(target.part, target.mine, target.theirs)
        if s is None:
            reason = self.skipped.get(target.part, "not measured")
            return None, f"not run: {reason}"
        return s, "**met**" if s["median"] <= target.limit else "**missed**"


def frameworks_section(raw: dict[str, Any], images: dict[str, Path], out: Path) -> list[str]:
    section = raw.get("frameworks")
    skipped_group = raw.get("groups_skipped", {}).get("frameworks")
    if not section:
        if not skipped_group:
            return []
        return [SECTION, "", f"Not run: {skipped_group}.", ""]
    f = Frameworks(section)
    m, plan, versions = section["machine"], section["plan"], section.get("versions", {})
    after = section.get("load_average_after")
    lines = [
        SECTION,
        "",
        f"Measured by `python -m benchmarks.suite --group frameworks` in the modern "
        f"environment on {m['started']} (machine clock), in {section.get('seconds', 0):.0f} s: "
        f"{m['cores']} cores, {m['memory_gib']:.0f} GiB, Python {m['python']}, "
        + ", ".join(f"{k} {v}" for k, v in versions.items() if v != "?")
        + f"; torch on {section.get('torch_threads')} threads. {_tree(section)} Load average "
        f"{m['load_average'][0]:.1f} when the group started"
        + (f", {after[0]:.1f} when it ended" if after else "")
        + " (a shared, noisy machine).",
        "",
        f"The policy: {plan['tensors']} float32 tensors, {size_label(plan['nbytes'])} in all "
        f"({plan['tensors'] // 2} square `nn.Linear` layers, weight and bias); for JAX a pytree "
        "of the same arrays. Each pair took turns in every round (the order reversed every "
        f"other round), {plan['warm']} untimed rounds (three for redis://) then "
        f"{plan['rounds']} timed ones; the learner and the actor are two containers in one "
        "process (but for TorchRL's, below). A ratio is the median over rounds of mine / theirs "
        "within a round, with its interquartile range in brackets, as are the times.",
        "",
    ]
    if any(r["part"] == "torchrl" for r in section.get("records", [])):
        lines += [
            "TorchRL (`torchrl`): each scheme driven as a multi-process collector drives it, "
            "without the collector (no environment, no rollouts): the sender side in the "
            "benchmark's process (`init_on_sender` with a copy of the policy standing for the "
            "collector's, `connect`), the receiver side in one worker process started with "
            "`spawn` (`init_on_receiver(model=...)`, `connect`), each scheme with a policy of "
            "its own there. Timed, per round, after an untimed training step (every weight + 1): "
            "from the trainer's `scheme.send(policy)` (what "
            "`collector.update_policy_weights_(policy)` calls) until the worker's policy holds "
            "the new weights. TorchRL's `send` waits for that itself (`sync=True`, its "
            "default: the worker's background thread applies, then acknowledges on a queue); "
            '`VarsyncWeightSyncScheme("shm://...", background=False)`\'s `send` returns once '
            "the push is stored, then the trainer waits for the worker's acknowledgement on an "
            "`mp.Queue`, sent after its `scheme.receive()` applied the version (the two "
            "timed apart, `send` and `until the worker applied`; the target takes their sum). "
            "`SharedMemWeightSyncScheme`: the trainer copies into a shared-memory buffer that "
            "the worker's policy *is* (its parameters were pointed at it at `connect`); "
            "`MultiProcessWeightSyncScheme`: the trainer's tensors go through an `mp.Queue` "
            "(torch's multiprocessing pickling, which shares CPU tensors' memory rather than "
            "their bytes) and the worker copies them into its policy. The workers' policies "
            "are checked equal to the trainer's after the rounds.",
            "",
        ]
    if "frameworks" in images:
        lines += [
            f"![PyTorch and JAX through varsync]({rel(images['frameworks'], out.parent)})",
            "",
        ]
    rows: list[list[str]] = []
    met: list[str] = []
    missed: list[str] = []
    unrun: list[str] = []
    for t in TARGETS:
        s, word = f.verdict(t)
        if s is None:
            unrun.append(t.part)
        else:
            digits = 2 if f"{s['median']:.2f}" != f"{t.limit:.2f}" else 4  # 1.3004 > 1.3
            (met if word == "**met**" else missed).append(
                f"{t.part} ({s['median']:.{digits}f} {'≤' if word == '**met**' else '>'} "
                f"{t.limit:.1f})"
            )
        rows.append(
            [
                f"14.8 {t.what}",
                t.theirs_label,
                f"≤ {t.limit:.1f}",
                time_cell(f.stat(t.part, t.mine)) if s else "–",
                time_cell(f.stat(t.part, t.theirs)) if s else "–",
                ratio_cell(s),
                word,
            ]
        )
    lines += table(
        ["target", "against", "ratio wanted", "varsync", "theirs", "ratio", "verdict"], rows
    )
    lines += [
        f"Targets met: {len(met)} of {len(TARGETS)}"
        + (f", {', '.join(met)}" if met else "")
        + (f". Missed: {', '.join(missed)}" if missed else "")
        + (f". Not run: {', '.join(unrun)}" if unrun else "")
        + ".",
        "",
    ]
    lines += _detail(f)
    return lines


def _tree(section: dict[str, Any]) -> str:
    tree = section.get("tree") or {}
    if not tree.get("commit"):
        return ""
    modified = tree.get("modified") or []
    return f"The library as in the working tree on commit {tree['commit']}" + (
        f", with uncommitted changes to {', '.join(modified)}." if modified else ", unmodified."
    )


def _detail(f: Frameworks) -> list[str]:
    """Every operation timed, and the push and pull ratios over redis:// apart."""
    rows = []
    for (part, contender, op), values in f.samples.items():
        rows.append([part, contender, op, time_cell(summary(values))])
    lines = ["Every operation timed (median and interquartile range over rounds):", ""]
    lines += table(["part", "who", "operation", "time"], rows)
    push = f.ratio("torch redis", [("varsync redis://", "push")], [("by hand", "push")])
    pull = f.ratio("torch redis", [("varsync redis://", "pull")], [("by hand", "pull")])
    if push and pull:
        lines += [
            f"- Over redis://, apart: push {ratio_cell(push)} of torch.save + SET, pull "
            f"(`update(module)`) {ratio_cell(pull)} of GET + torch.load + "
            "load_state_dict.",
            "",
        ]
    one = f.ratio(
        "torch shm, 1 thread",
        [("varsync shm://", "update(module)")],
        [("torch", "load_state_dict(copy)")],
    )
    if one:
        lines += [
            f"- Over shm://, with torch on one thread (`torch.set_num_threads(1)`; "
            f"`load_state_dict`'s `copy_` splits large tensors over torch's threads): "
            f"`update(module)` takes {ratio_cell(one)} of `load_state_dict(copy)`.",
            "",
        ]
    pulled = f.ratio(
        "torch shm", [("varsync shm://", "pull(like=module)")], [("torch", "load_state_dict(copy)")]
    )
    if pulled:
        lines += [
            f"- Over shm://, `pull(like=module)` (new tensors, copied out of the "
            f"read-only store) takes {ratio_cell(pulled)} of `load_state_dict(copy)`.",
            "",
        ]
    unaligned = f.ratio(
        "jax shm",
        [("varsync shm://", "pull(like=tree)")],
        [("jax", "device_put(numpy, unaligned)")],
    )
    aliases = f.raw.get("jax_aliases", {})
    if unaligned:
        said = "; ".join(
            f"{k}: {'shares the numpy memory' if v else 'copies'}" for k, v in aliases.items()
        )
        lines += [
            f"- JAX: against `jax.device_put` of numpy arrays 16 bytes off a 64-byte "
            f"boundary (as numpy's large arrays often are), `pull(like=tree)` takes "
            f"{ratio_cell(unaligned)}. On the CPU JAX wraps 64-byte-aligned host memory "
            f"without a copy and copies the rest; seen here: {said}.",
            "",
        ]
    mp = f.ratio(
        "torchrl",
        [("varsync shm://", "send"), ("varsync shm://", "until the worker applied")],
        [("torchrl MultiProcess", "send")],
    )
    send = f.ratio("torchrl", [("varsync shm://", "send")], [("torchrl SharedMem", "send")])
    if mp and send:
        lines += [
            f"- TorchRL: against `MultiProcessWeightSyncScheme.send` (weights through "
            f"a queue, the worker copies), varsync's send until applied takes "
            f"{ratio_cell(mp)}. varsync's trainer-side `send` alone (the push into "
            f"shm://, before any worker copies) takes {ratio_cell(send)} of "
            "`SharedMemWeightSyncScheme.send`'s whole round trip. Why 1.0 against "
            "`SharedMemWeightSyncScheme` is out of reach for a versioned store: there "
            "the worker's policy *is* the shared buffer, so a send is one copy of the "
            "weights and the worker never copies; through varsync the trainer's push "
            "is one copy into a new version (readers of the old one keep it whole) and "
            "the worker's `update` a second, out of it, so two copies are the floor "
            "(about 2x), which is where the ratio sits.",
            "",
        ]
    lines += [f"- {part}: not run: {reason}." for part, reason in f.skipped.items()]
    return lines + [""]
