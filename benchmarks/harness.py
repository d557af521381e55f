"""The harness every benchmark runs on: nests, timing, rounds with a baseline in them,
statistics and the machine.

A benchmark is a function that returns a :class:`Group`: the operations to time, each
named ``(contender, operation)``, and for each operation the baseline it is compared
with. :func:`run_group` times them in rounds: within a round every contender takes a
turn, the first turn rotating from round to round, so that a noisy neighbour slows them
alike; a ratio is then the median over rounds of (time / the baseline's time in the same
round). Only numpy and the standard library are imported here (child processes import it).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import itertools
import os
import platform
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

KB, MB, GB = 10**3, 10**6, 10**9
ROOT = Path(__file__).resolve().parent.parent

Op = tuple[str, str, Callable[[], Any]]  # (contender, operation, call)
Key = tuple[str, str]  # (contender, operation)
Timings = dict[Key, float]


# -- the machine ------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What a reader needs to weigh a figure: cores, memory, platform, when, the load."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), cpu)
    return {
        "cores": os.cpu_count(),
        "memory_gib": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30,
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "started": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "load_average": os.getloadavg(),
        "tree": working_tree(),
    }


def working_tree() -> dict[str, Any]:
    """The commit measured and the library files that differed from it (uncommitted)."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=20
            )
            return done.stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = git("status", "--porcelain", "--", "varsync", "plugins/varsync-shm/varsync_shm")
    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "modified": [line[3:] for line in changed.splitlines()],
    }


def fresh_memory(nbytes: int, idle: float) -> dict[str, float]:
    """How fast this machine hands out memory not yet written: ``nbytes`` written twice in a
    row (the second time into pages the first freed), then again after ``idle`` seconds. A
    VM that reports free pages to its host faults them in again far slower; every pull into
    new arrays and a redis-server's first write of a key pay this at large sizes."""

    def gbps() -> float:
        started = time.perf_counter()
        block = np.ones(nbytes, np.uint8)
        seconds = time.perf_counter() - started
        del block
        return nbytes / seconds / 1e9

    first, again = gbps(), gbps()
    time.sleep(idle)
    return {"nbytes": nbytes, "first": first, "again": again, "after_idle": gbps()}


# -- sizes and nests -------------------------------------------------------------------


def size_label(nbytes: float) -> str:
    for unit, factor in (("GB", GB), ("MB", MB), ("KB", KB)):
        if nbytes >= factor:
            return f"{nbytes / factor:.3g} {unit}"
    return f"{int(nbytes)} B"


def leaf_sizes(nbytes: int, leaves: int) -> list[int]:
    """float32 elements per leaf, ``leaves`` leaves of ``nbytes`` bytes in all."""
    floats = max(nbytes // 4, leaves)
    return [floats // leaves + (1 if i < floats % leaves else 0) for i in range(leaves)]


def leaf_names(leaves: int) -> list[str]:
    return [f"v{i:0{len(str(leaves - 1))}d}" for i in range(leaves)]


def nest_of(nbytes: int, leaves: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``leaves`` float32 vectors, ``nbytes`` in all, random (weights do not compress)."""
    rng = np.random.default_rng(seed)
    sizes = zip(leaf_names(leaves), leaf_sizes(nbytes, leaves))
    return {name: rng.standard_normal(n, dtype=np.float32) for name, n in sizes}


def signature_of(nbytes: int, leaves: int) -> dict[str, Any]:
    """``{leaf: varsync.Spec}``: what a Reverb server needs to make the table."""
    import varsync

    sizes = zip(leaf_names(leaves), leaf_sizes(nbytes, leaves))
    return {name: varsync.Spec((n,), "float32") for name, n in sizes}


# -- timing ----------------------------------------------------------------------------


def timed(fn: Callable[[], Any], repeat: int = 1) -> float:
    """Seconds per call of ``fn`` over ``repeat`` back-to-back calls, the collector off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        started = time.perf_counter()
        for _ in range(repeat):
            result = fn()
            del result
        return (time.perf_counter() - started) / repeat
    finally:
        if enabled:
            gc.enable()


@dataclass
class Group:
    """One benchmark at one size: what to time, and what each operation is compared with.

    ``baselines`` maps an operation to the one timed beside it in the same rounds (its
    floor, or what a user writes without varsync). ``per_round`` measurements time
    themselves (their setup untimed), once per round after the turns; ``before`` runs
    untimed at the start of every round (a learner's push of a new version); ``polls``
    are timed call by call after the rounds: ``(contender, operation, call, count)``."""

    name: str
    ops: list[Op]
    baselines: dict[Key, list[Key]] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None
    warm: int = 1
    per_round: list[Callable[[], Timings]] = field(default_factory=list)
    before: Callable[[], Any] | None = None
    polls: list[tuple[str, str, Callable[[], Any], int]] = field(default_factory=list)


def contender_turns(ops: Sequence[Op]) -> list[list[Op]]:
    """``ops`` as one turn per contender (its operations in order), in the order the
    contenders first appear. The first calls after a round's ``gc.collect()`` find cold
    caches: a turn that always went first would pay that alone."""
    turns: dict[str, list[Op]] = {}
    for op in ops:
        turns.setdefault(op[0], []).append(op)
    return list(turns.values())


def run_group(group: Group, rounds: int, inner: int = 1) -> dict[Key, list[float]]:
    """``group.warm`` untimed rounds, then ``rounds`` timed ones, the turns rotating by one
    each round; sample ``i`` of every operation comes from round ``i``."""
    for _ in range(group.warm):
        if group.before is not None:
            group.before()
        for _, _, call in group.ops:
            call()
    samples: dict[Key, list[float]] = {(c, o): [] for c, o, _ in group.ops}
    turns = contender_turns(group.ops)
    for number in range(rounds):
        gc.collect()
        if group.before is not None:
            group.before()
        shift = number % len(turns)
        for contender, op, call in itertools.chain(*turns[shift:], *turns[:shift]):
            samples[(contender, op)].append(timed(call, inner))
        for measure in group.per_round:
            for key, seconds in measure().items():
                samples.setdefault(key, []).append(seconds)
    return samples


def time_polls(poll: Callable[[], Any], count: int, who: str) -> list[float]:
    """Seconds of each of ``count`` calls of ``pull_if_newer`` when nothing changed, one by
    one; a poll that finds a newer version is an error (nothing was pushed)."""
    values = []
    for _ in range(count):
        started = time.perf_counter_ns()
        result = poll()
        values.append((time.perf_counter_ns() - started) / 1e9)
        if result is not None:
            raise RuntimeError(f"{who}: pull_if_newer found a version while nothing was pushed")
    return values


# -- statistics --------------------------------------------------------------------------


def summary(samples: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, p90 and count of ``samples`` (empty: {})."""
    values = sorted(samples)
    if not values:
        return {}
    if len(values) == 1:
        q1 = q3 = p90 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        p90 = statistics.quantiles(values, n=10, method="inclusive")[-1]
    median = statistics.median(values)
    return {"median": median, "q1": q1, "q3": q3, "p90": p90, "n": len(values)}


def paired_ratio(mine: Sequence[float], other: Sequence[float]) -> dict[str, float]:
    """Median and IQR over rounds of ``mine[i] / other[i]``, both timed in round ``i``."""
    return summary([a / b for a, b in zip(mine, other) if b > 0])


def seconds_text(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def spread_text(s: dict[str, float]) -> str:
    """``median (q1–q3)`` in readable units."""
    return f"{seconds_text(s['median'])} ({seconds_text(s['q1'])}–{seconds_text(s['q3'])})"


def ratio_text(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} ({s['q1']:.2f}–{s['q3']:.2f})"


# -- processes and memory --------------------------------------------------------------


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def allocated_bytes_under(path: str) -> int:
    """Bytes the files under ``path`` hold (tmpfs pages, not sizes)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


class Sampler:
    """Samples ``measure()`` on a thread every ``interval`` s; ``growth`` is the highest
    value seen above the first. A measure that raises ends the sampling quietly."""

    def __init__(self, measure: Callable[[], int], interval: float = 0.002) -> None:
        self.measure, self.interval = measure, interval
        self.baseline = self.highest = measure()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.highest = max(self.highest, self.measure())
            except Exception:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def growth(self) -> int:
        return self.highest - self.baseline


@contextlib.contextmanager
def stage(name: str, log: Callable[[str], None], record: dict[str, float]) -> Iterator[None]:
    """Log a stage's start and duration; keep the duration in ``record``."""
    started = time.monotonic()
    log(f"-- {name} ...")
    try:
        yield
    finally:
        record[name] = time.monotonic() - started
        log(f"-- {name}: {record[name]:.0f} s")


def log(line: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {line}", flush=True)
