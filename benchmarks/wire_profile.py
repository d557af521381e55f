"""Where a Redis transfer's time goes (issue 15.4), measured in the size sweep's Redis group
at the cases that ask for it (``Case.profile``: 1 KB, 100 MB and 1 GB in the full plan).

- **CPU accounting**, in the timed rounds themselves: around every timed sample of a varsync
  push and pull and of the raw TCP floor's transfer (outside its clock, divided by the
  sample's calls), the calling thread's CPU (``time.thread_time``), this process's user
  and kernel CPU and minor page faults (``getrusage``: its total is exact, its split
  between user and kernel comes from clock ticks) and the redis-server's CPU
  (``/proc/<pid>/schedstat`` of its main thread, which does its work) with its user and
  kernel ticks (``/proc/<pid>/stat``, 10 ms each: summed over the rounds, they split it).
- **A py-spy profile** of this process, after the rounds: py-spy (the ``bench`` extra)
  samples it from outside without stopping it (``--nonblocking``) while it makes a few
  more pushes and pulls, untimed. Each sample goes to the part of its innermost frame of
  varsync's code (:data:`CATEGORIES`). py-spy takes no sample of a thread waiting in the
  kernel, and fewer than its rate of a running one (reading a running process's stack
  fails at times: its count of errors is kept), so the parts are shares of the samples,
  that is of the thread's time on CPU; its time off CPU is the CPU accounting's.

Both land in results.json under ``wire_profile``: one record per case and operation.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

#: (name shown, (file, function) pairs that put a sample in it), tried on the innermost
#: frame of varsync's code on a sample's stack (:func:`_category`).
CATEGORIES: Sequence[tuple[str, Sequence[tuple[str, str]]]] = (
    ("socket receive (recv_into)", (("varsync/backends/redis/wire.py", "_recv_into"),)),
    ("socket send (sendall)", (("varsync/backends/redis/wire.py", "_send"),)),
    ("CRC-32 of the chunks", (("varsync/backends/redis/wire.py", "checksum"),)),
    ("allocating the pulled arrays", (("varsync/backends/redis/leaves.py", "fetch_whole"),)),
    (
        "reading replies (RESP parsing)",
        (
            ("varsync/backends/redis/wire.py", "bulk_length"),
            ("varsync/backends/redis/wire.py", "line"),
            ("varsync/backends/redis/wire.py", "reply"),
            ("varsync/backends/redis/wire.py", "status"),
        ),
    ),
)
OTHER = "other (varsync's checks and bookkeeping, redis-py)"
RATE = 500  # py-spy samples per second
START_TIMEOUT = 30.0  # seconds py-spy may take to attach
STOP_TIMEOUT = 30.0  # and to write its samples once told to stop
PROFILED_SECONDS = 2.0  # each operation is repeated (untimed) about this long under py-spy

_TICK = os.sysconf("SC_CLK_TCK")


def _server_cpu(pid: int | None) -> tuple[float, float, float]:
    """A process's CPU seconds on its main thread (``/proc/<pid>/schedstat``: nanoseconds),
    and its user and kernel CPU in clock ticks (``/proc/<pid>/stat``); zeros if they
    cannot be read."""
    if pid is None:
        return 0.0, 0.0, 0.0
    try:
        ran = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0, 0.0
    return ran, int(fields[11]) / _TICK, int(fields[12]) / _TICK


class CpuMeter:
    """CPU figures of this process and of the redis-server ``server_pid``, per call, for
    the operations in ``keys``: taken around a whole timed sample, outside its clock."""

    def __init__(self, server_pid: int | None, keys: set[tuple[str, str]]) -> None:
        self.server_pid, self.keys = server_pid, keys
        self.records: dict[tuple[str, str], list[dict[str, float]]] = {}

    def sample(self, key: tuple[str, str], timed: Callable[[], float], calls: int) -> float:
        """``timed()``'s seconds per call (a timed sample of ``calls`` calls), its CPU
        figures per call recorded under ``key`` (contender, operation) if it is one of
        :attr:`keys`."""
        if key not in self.keys:
            return timed()
        mine, server = resource.getrusage(resource.RUSAGE_SELF), _server_cpu(self.server_pid)
        thread = time.thread_time()
        seconds = timed()
        thread = time.thread_time() - thread
        after, server_after = (
            resource.getrusage(resource.RUSAGE_SELF),
            _server_cpu(self.server_pid),
        )
        self.records.setdefault(key, []).append(
            {
                "wall": seconds,
                "thread": thread / calls,
                "client_user": (after.ru_utime - mine.ru_utime) / calls,
                "client_kernel": (after.ru_stime - mine.ru_stime) / calls,
                "client_faults": (after.ru_minflt - mine.ru_minflt) / calls,
                "server": (server_after[0] - server[0]) / calls,
                "server_user_ticks": (server_after[1] - server[1]) / calls,
                "server_kernel_ticks": (server_after[2] - server[2]) / calls,
            }
        )
        return seconds


def py_spy() -> str | None:
    """The py-spy executable beside this Python, or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("py-spy")


def profile(
    calls: dict[tuple[str, str], Callable[[], Any]], seconds_per_call: dict[tuple[str, str], float]
) -> dict[tuple[str, str], dict[str, Any]]:
    """Each of ``calls`` repeated about :data:`PROFILED_SECONDS` (at least twice) under
    py-spy; per call, its samples by category and the wall time they cover. An entry
    ``{"skipped": why}`` where py-spy is missing or failed."""
    exe = py_spy()
    if exe is None:
        return {
            key: {"skipped": "py-spy is not installed here (the bench extra has it)"}
            for key in calls
        }
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for key, call in calls.items():
        repeats = max(2, round(PROFILED_SECONDS / max(seconds_per_call.get(key, 1.0), 1e-6)))
        try:
            out[key] = _profiled(exe, call, repeats)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            out[key] = {"skipped": f"py-spy failed: {type(exc).__name__}: {exc}"}
    return out


def _profiled(exe: str, call: Callable[[], Any], repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="varsync-bench-spy-") as folder:
        raw = Path(folder) / "samples.txt"
        log = Path(folder) / "py-spy.log"
        with open(log, "wb") as sink:
            spy = subprocess.Popen(
                [
                    exe,
                    "record",
                    "--pid",
                    str(os.getpid()),
                    "--nonblocking",
                    "--rate",
                    str(RATE),
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                ],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_for_sampling(spy, log)
            started = time.perf_counter()
            for _ in range(repeats):
                result = call()
                del result
            wall = time.perf_counter() - started
        finally:
            with contextlib.suppress(ProcessLookupError):
                spy.send_signal(signal.SIGINT)
            try:
                spy.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait(STOP_TIMEOUT)
        if not raw.exists():
            raise RuntimeError(f"no samples written; py-spy said: {_tail(log)}")
        counts = categorize(raw.read_text(errors="replace").splitlines())
        said = re.search(r"Samples: (\d+) Errors: (\d+)", log.read_text(errors="replace"))
    return {
        "calls": repeats,
        "wall": wall,
        "rate": RATE,
        "samples": dict(counts),
        "errors": int(said.group(2)) if said else None,
    }


def _wait_for_sampling(spy: subprocess.Popen, log: Path) -> None:
    """Until py-spy says it samples (bounded): samples before that would be lost."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if spy.poll() is not None:
            raise RuntimeError(f"py-spy exited with {spy.returncode}: {_tail(log)}")
        if b"Sampling process" in log.read_bytes():
            return
        time.sleep(0.02)  # polling py-spy's log, bounded by the deadline
    raise RuntimeError(f"py-spy did not start sampling within {START_TIMEOUT:.0f} s")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace").strip()[-300:] if log.exists() else "(no output)"


def categorize(lines: Sequence[str]) -> Counter:
    """Samples per category from py-spy's raw (collapsed) lines: ``frame;frame;... N``,
    outermost frame first, each ``function (file:line)``. Stacks outside varsync's
    transfer (py-spy's own attach, other threads) count as ``"elsewhere"``."""
    counts: Counter = Counter()
    for line in lines:
        stack, _, number = line.rpartition(" ")
        if not stack or not number.isdigit():
            continue
        frames = stack.split(";")
        counts[_category(frames) if _in_transfer(frames) else "elsewhere"] += int(number)
    return counts


def _in_transfer(frames: list[str]) -> bool:
    return any("varsync/container.py" in frame for frame in frames)


def _category(frames: list[str]) -> str:
    """By the innermost frame of varsync's code: what runs below it is C (the socket
    call, the CRC, numpy's allocation), which py-spy shows as the frame that called it.
    py-spy names a method by its class too (``Wire._recv_into``)."""
    for frame in reversed(frames):
        function, _, place = frame.partition(" (")
        if "varsync/" not in place:
            continue
        for name, places in CATEGORIES:
            if any(
                path in place and function.rpartition(".")[2] == wanted for path, wanted in places
            ):
                return name
        return OTHER
    return OTHER
