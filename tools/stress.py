"""Run pytest selections many times while CPU-bound processes compete for the cores.

A test that passes only on a quiet machine is a bug (in the code or in the test): CI
shares its 2 cores. This runs the given pytest arguments ``--runs`` times, each in a fresh
pytest process, with ``--burners`` busy-looping processes beside them, and prints one
line per run and a tally; it exits 1 if any run failed. The burners are stopped however
the run ends (Ctrl-C included). Used by ``make stress``::

    python -m tools.stress --runs 50 --burners 2 -- \
        tests/backends/redis/test_redis_replicas.py -k eight
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Sequence


def burn() -> None:
    """Spin until killed (a CPU-bound neighbour)."""
    x = 0
    while True:
        x = (x * 7 + 1) % 1000003


def start_burners(count: int) -> list[multiprocessing.Process]:
    burners = []
    try:
        for _ in range(count):
            process = multiprocessing.Process(target=burn, daemon=True)
            process.start()
            burners.append(process)
    except BaseException:
        stop_burners(burners)
        raise
    return burners


def stop_burners(burners: Sequence[multiprocessing.Process]) -> None:
    for process in burners:
        process.kill()
    for process in burners:
        process.join(10)


def last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.stress", description=__doc__)
    parser.add_argument("--runs", type=int, default=50, help="pytest runs (default 50)")
    parser.add_argument(
        "--burners", type=int, default=2, help="CPU-bound processes beside them (default 2)"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one pytest run may take (default 600)"
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="run all --runs even after a failure (default: stop at the first)",
    )
    parser.add_argument(
        "pytest_args", nargs=argparse.REMAINDER, help="after --: the arguments for pytest"
    )
    args = parser.parse_args(argv)
    pytest_args = [a for a in args.pytest_args if a != "--"] or ["tests"]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
    print(
        f"stress: {args.runs} runs of {' '.join(command[1:])} beside {args.burners} "
        f"CPU-bound processes (load average {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    failed = 0
    burners = start_burners(args.burners)
    try:
        for run in range(1, args.runs + 1):
            began = time.monotonic()
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
                code, output = done.returncode, done.stdout + done.stderr
            except subprocess.TimeoutExpired as exc:
                code = -1
                partial = exc.stdout or ""
                if isinstance(partial, bytes):
                    partial = partial.decode(errors="replace")
                output = f"timed out after {args.timeout:g} s\n{partial}"
            took = time.monotonic() - began
            verdict = "ok" if code == 0 else "FAILED"
            print(
                f"run {run:3d}/{args.runs}: {verdict} in {took:.1f} s: {last_line(output)}",
                flush=True,
            )
            if code != 0:
                failed += 1
                print(output[-6000:], flush=True)
                if not args.keep_going:
                    break
    finally:
        stop_burners(burners)
    ran = run if args.runs else 0
    print(
        f"stress: {ran - failed} passed, {failed} failed of {ran} runs "
        f"(load average at the end {os.getloadavg()[0]:.1f})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
