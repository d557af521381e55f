"""Helpers shared by the benchmark suite: the machine, nests, timing, statistics, memory.

Only numpy and the standard library are imported here (varsync only inside
``signature_of``), so that spawned worker processes can import this module cheaply.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import platform
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import numpy as np

KB, MB, GB = 10**3, 10**6, 10**9
GiB = 2**30


# -- the machine ------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What a reader needs to weigh a figure: cores, memory, platform, when."""
    import numpy

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "memory_gib": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GiB,
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "date": datetime.date.today().isoformat(),
        "started": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "load_average": os.getloadavg(),
    }


REPORTED_KIB = "/sys/module/page_reporting/parameters/reported_kib"


def fresh_memory(nbytes: int, idle: float) -> dict[str, Any]:
    """How fast this machine gives a process memory it has not written yet, which every
    pull into new arrays and every first write of a server's key pays at large sizes:
    ``nbytes`` written (``np.ones``) twice in a row, the second time into the pages the
    first freed, then again after ``idle`` seconds. A VM whose kernel reports free pages to
    its host (``page_reporting``, virtio-balloon) hands freed memory back within seconds,
    and the host faults it in again, far slower: ``reported_mib`` says how much went back
    meanwhile (``None`` where the kernel does not report)."""

    def reported() -> int | None:
        try:
            with open(REPORTED_KIB) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def write_fresh() -> float:  # not timed(): its clock would also take the free
        started = time.perf_counter()
        block = np.ones(nbytes, np.uint8)
        seconds = time.perf_counter() - started
        del block
        return nbytes / seconds / 1e9

    first = write_fresh()
    again = write_fresh()
    before = reported()
    time.sleep(idle)
    after = reported()
    return {
        "nbytes": nbytes,
        "idle_seconds": idle,
        "first_gbps": first,
        "again_gbps": again,
        "after_idle_gbps": write_fresh(),
        "reported_mib": None if before is None or after is None else (after - before) / 1024,
    }


def machine_line(m: dict[str, Any]) -> str:
    """One line for every figure and table: cores, memory, date."""
    return (
        f"{m['cores']} cores, {m['memory_gib']:.0f} GiB, measured {m['date']} "
        "(shared, noisy machine)"
    )


# -- sizes --------------------------------------------------------------------------------


def size_label(nbytes: float) -> str:
    for unit, factor in (("GB", GB), ("MB", MB), ("KB", KB)):
        if nbytes >= factor:
            value = nbytes / factor
            return f"{value:.3g} {unit}"
    return f"{int(nbytes)} B"


def parse_size(text: str) -> int:
    units = {"KB": KB, "MB": MB, "GB": GB, "KIB": 2**10, "MIB": 2**20, "GIB": GiB}
    upper = text.strip().upper().replace(" ", "")
    for unit, factor in sorted(units.items(), key=lambda item: -len(item[0])):
        if upper.endswith(unit):
            return int(float(upper[: -len(unit)]) * factor)
    return int(upper)


# -- nests --------------------------------------------------------------------------------


def leaf_sizes(nbytes: int, leaves: int) -> list[int]:
    """float32 elements per leaf, ``leaves`` leaves of ``nbytes`` bytes in all."""
    floats = max(nbytes // 4, leaves)
    return [floats // leaves + (1 if i < floats % leaves else 0) for i in range(leaves)]


def leaf_names(leaves: int) -> list[str]:
    width = len(str(leaves - 1))
    return [f"v{i:0{width}d}" for i in range(leaves)]


def signature_of(nbytes: int, leaves: int) -> dict[str, Any]:
    """``{leaf name: varsync.Spec}``: what a Reverb server needs to make the table."""
    import varsync

    return {
        name: varsync.Spec((n,), "float32")
        for name, n in zip(leaf_names(leaves), leaf_sizes(nbytes, leaves))
    }


def nest_of(nbytes: int, leaves: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A dict of ``leaves`` float32 vectors, ``nbytes`` bytes in all, random values (so
    that compression in an engine gains nothing, as with real weights)."""
    rng = np.random.default_rng(seed)
    return {
        name: rng.standard_normal(n, dtype=np.float32)
        for name, n in zip(leaf_names(leaves), leaf_sizes(nbytes, leaves))
    }


def payload_of(nest: dict[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in nest.values())


# -- timing and statistics ---------------------------------------------------------------------


def timed(fn: Callable[[], Any], repeat: int = 1) -> float:
    """Seconds per call of ``fn``, averaged over ``repeat`` back-to-back calls, with the
    garbage collector off while timing."""
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


def summary(samples: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, p90, min, max and count of ``samples``."""
    values = sorted(samples)
    if not values:
        return {}
    if len(values) == 1:
        q1 = q3 = p90 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        p90 = statistics.quantiles(values, n=10, method="inclusive")[-1]
    return {
        "median": statistics.median(values),
        "q1": q1,
        "q3": q3,
        "p90": p90,
        "min": values[0],
        "max": values[-1],
        "n": len(values),
    }


def paired_ratio(mine: Sequence[float], other: Sequence[float]) -> dict[str, float]:
    """Median and IQR over rounds of ``mine[i] / other[i]``: both were timed in round i, so
    a noisy neighbour slowed them alike."""
    return summary([a / b for a, b in zip(mine, other) if b > 0])


def seconds_text(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def spread_text(s: dict[str, float]) -> str:
    """``median (IQR q1–q3)`` in readable units."""
    return f"{seconds_text(s['median'])} ({seconds_text(s['q1'])}–{seconds_text(s['q3'])})"


# -- memory -----------------------------------------------------------------------------------


def memory_status(field: str, pid: str = "self") -> int:
    """``VmRSS`` or ``VmHWM`` (peak RSS) of a process, in bytes, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def reset_peak_rss() -> None:
    """Make VmHWM start again from the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def peak_above_baseline(fn: Callable[[], Any]) -> int:
    """Peak resident memory of this process during ``fn`` minus its resident memory just
    before, in bytes. What ``fn`` returns is kept until the peak is read."""
    gc.collect()
    reset_peak_rss()
    baseline = memory_status("VmRSS")
    kept = fn()
    peak = memory_status("VmHWM")
    del kept
    return peak - baseline


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def allocated_bytes_under(path: str) -> int:
    """Bytes actually allocated by the files under ``path`` (tmpfs pages, not sizes)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


class Sampler:
    """Samples ``measure()`` on a thread every ``interval`` seconds; ``highest`` is the
    largest value seen. A measure that raises stops the sampling quietly (the process it
    watched is gone) and is recorded in ``error``."""

    def __init__(self, measure: Callable[[], int], interval: float = 0.002) -> None:
        self.measure, self.interval = measure, interval
        self.baseline = measure()
        self.highest = self.baseline
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.highest = max(self.highest, self.measure())
            except Exception as exc:
                self.error = repr(exc)
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join(10)
        with contextlib.suppress(Exception):
            self.highest = max(self.highest, self.measure())

    @property
    def growth(self) -> int:
        return self.highest - self.baseline


@contextlib.contextmanager
def stage(
    name: str, log: Callable[[str], None], record: dict[str, float] | None = None
) -> Iterator[None]:
    """Log the start and the duration of a stage; keep the duration in ``record``."""
    started = time.monotonic()
    log(f"-- {name} ...")
    try:
        yield
    finally:
        seconds = time.monotonic() - started
        if record is not None:
            record[name] = seconds
        log(f"-- {name}: {seconds:.0f} s")


# -- names shown in tables and plots ---------------------------------------------------------------

LABELS = {
    "memory": "varsync memory://",
    "reverb": "varsync reverb://",
    "redis": "varsync redis://",
    "shm": "varsync shm://",
    "varsync drop-in": "varsync.compat.tf_agents drop-in (tf.Variables)",
    "tf-agents": "TF-Agents ReverbVariableContainer",
    "redis-py": "redis-py SET/GET by hand",
    "redis-py pipelined": "redis-py SETs by hand, one pipeline",
    "tcp loopback": "raw loopback TCP, sendall / recv_into",
    "np.copyto": "np.copyto into existing arrays",
    "np.copyto fresh": "np.copyto into new arrays",
    "tf assign": "tf.Variable.assign from numpy",
}

BACKENDS = ["memory", "reverb", "redis", "shm"]
BASELINES = ["tf-agents", "redis-py", "np.copyto", "np.copyto fresh", "tf assign"]
