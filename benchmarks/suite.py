"""`make bench`: every benchmark in benchmarks/, one RESULTS.md, plots in docs/img/.

    scripts/loopback-only .venv/bin/python -m benchmarks.suite [--smoke | --quick] [--group G]

Groups: ``cross-backend`` (cross_backend.py, groups.py, readers.py; needs TensorFlow,
Reverb, TF-Agents: the TF env), ``frameworks`` (PyTorch, JAX: the modern env) and
``delta`` (either env). A group whose frameworks do not import is skipped, the reason
printed (not a failure, also under ``--smoke``).

One report path: the raw samples go to ``benchmarks/out/results.json`` (git-ignored), and
RESULTS.md and the plots are rendered from it (report.py, plots.py). A run of some groups
keeps the other groups' results from the results.json there, so the two environments' runs
merge. ``--report`` renders RESULTS.md again from results.json without measuring.
``--smoke``: every group tiny, prints the report, fails if a section is empty; writes only
to a temporary directory. ``--backends``/``--sizes`` (and ``--rounds``) make a focused run
of the sweep, whose report goes to benchmarks/out/ (RESULTS.md is not touched).

Servers are started here and stopped on the way out, also on Ctrl-C, SIGTERM or an error.
Reverb listens on every interface: run this under ``scripts/loopback-only``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import GB, KB, MB, ROOT, fresh_memory, log, machine, stage

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
GROUPS = ("cross-backend", "frameworks", "delta")
BACKENDS = ("memory", "reverb", "redis", "shm")


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.suite", description=(__doc__ or "").splitlines()[0]
    )
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--quick", action="store_true", help="small sizes, few rounds (~3 min)")
    modes.add_argument("--smoke", action="store_true", help="every group tiny; checks the report")
    modes.add_argument("--report", action="store_true", help="render RESULTS.md from results.json")
    parser.add_argument(
        "--group", action="append", choices=GROUPS, help="only this group (repeatable)"
    )
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, help="sweep only these backends")
    parser.add_argument("--sizes", nargs="+", help="sweep only these sizes (1MB, 100MB, ...)")
    parser.add_argument("--rounds", type=int, help="timed rounds of every size swept")
    parser.add_argument("--out", type=Path, help="RESULTS.md to write")
    return parser.parse_args(argv)


def parse_size(text: str) -> int:
    units = {"KB": KB, "MB": MB, "GB": GB}
    upper = text.strip().upper()
    return int(float(upper[:-2]) * units[upper[-2:]]) if upper[-2:] in units else int(upper)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    focused = bool(args.backends or args.sizes)
    scratch = Path(tempfile.mkdtemp(prefix="varsync-bench-")) if args.smoke else OUT
    raw = scratch / "results.json"
    out_path = args.out or (
        scratch / "RESULTS.md" if args.smoke or args.quick or focused else HERE / "RESULTS.md"
    )
    try:
        if args.report:
            results = json.loads(raw.read_text())
        else:
            results = measure(args, focused)
            if not (args.smoke or args.quick or focused):
                results = merged(results, raw)
            scratch.mkdir(parents=True, exist_ok=True)
            raw.write_text(json.dumps(results, default=str))
        from . import report

        draw(results, ROOT / "docs" / "img" if out_path.parent == HERE else out_path.parent / "img")
        markdown = report.render(results)
        out_path.write_text(markdown)
        log(f"wrote {out_path} and {raw}")
        if args.smoke:
            print(markdown, flush=True)
            missing = report.missing(results, markdown)
            for problem in missing:
                log(f"MISSING: {problem}")
            log(f"smoke run {'FAILED' if missing else 'passed'}: {len(missing)} missing")
            return 1 if missing else 0
        return 0
    finally:
        if args.smoke:
            shutil.rmtree(scratch, ignore_errors=True)


def measure(args: argparse.Namespace, focused: bool) -> dict[str, Any]:
    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    started = time.monotonic()
    groups = args.group or (["cross-backend"] if focused else list(GROUPS))
    results: dict[str, Any] = {
        "machine": machine(),
        "smoke": args.smoke,
        "skipped": {},
        "stage_seconds": {},
    }
    log(f"{results['machine']['cores']} cores, load {results['machine']['load_average'][0]:.1f}")
    try:
        for group in groups:
            reason = run_group(group, args, results)
            if group in results:
                results[group]["load_average_end"] = os.getloadavg()
            if reason:
                results["skipped"][group] = reason
                log(f"-- group {group} skipped: {reason}")
    finally:
        for child in multiprocessing.active_children():  # none should be left; be sure
            child.kill()
            child.join(5)
    results["seconds"] = time.monotonic() - started
    results["load_average_end"] = os.getloadavg()
    return results


def run_group(group: str, args: argparse.Namespace, results: dict[str, Any]) -> str | None:
    """Run one group into ``results[group]``; the reason it cannot run here, or None."""
    timings = results["stage_seconds"]
    if group == "cross-backend":
        from . import cross_backend

        backends = args.backends or list(BACKENDS)
        reason = cross_backend.unavailable(backends)
        if reason:
            return reason
        plan = (
            cross_backend.smoke_plan()
            if args.smoke
            else cross_backend.quick_plan()
            if args.quick
            else cross_backend.full_plan()
        )
        sizes = [parse_size(s) for s in args.sizes] if args.sizes else None
        for case in plan.cases if args.rounds else ():
            case.rounds = args.rounds
        if not (args.smoke or args.backends or args.sizes):
            results["fresh_memory"] = fresh_memory(16 * MB if args.quick else 512 * MB, 5.0)
        out = results.setdefault(group, {"machine": results["machine"]})
        with stage("cross-backend", log, timings):
            cross_backend.run(plan, out, log, backends, sizes)
    elif group == "frameworks":
        from . import frameworks

        reason = frameworks.unavailable()
        if reason:
            return reason + " (the frameworks group runs in the modern env: torch, jax)"
        fw = frameworks.Frameworks()
        if args.smoke or args.quick:
            fw = frameworks.Frameworks(100 * KB if args.smoke else 10 * MB, 50, 2, warm=1)
        with contextlib.ExitStack() as servers, stage("frameworks", log, timings):
            results[group] = {}
            frameworks.run(fw, results[group], log, lazy_redis_server(servers))
    else:
        from . import delta

        with contextlib.ExitStack() as servers, stage("delta", log, timings):
            results[group] = {}
            delta.run(delta.plan_for(args.smoke, args.quick), results[group], log, servers)
    return None


def lazy_redis_server(servers: contextlib.ExitStack) -> Any:
    """A call returning the URL of a redis-server it starts on first call."""
    started: list[Any] = []

    def url() -> str:
        if not started:
            from .servers import running_redis_server

            started.append(servers.enter_context(running_redis_server()))
        return str(started[0].url)

    return url


def merged(results: dict[str, Any], raw: Path) -> dict[str, Any]:
    """This run's results with the groups it did not run taken from ``raw``."""
    try:
        old = json.loads(raw.read_text())
    except (OSError, ValueError):
        return results
    for group in GROUPS:
        if group not in results and old.get(group):
            results[group] = old[group]
            results["skipped"].pop(group, None)
            started = old[group].get("machine", {}).get("started")
            log(f"   kept the {group} group's results of {started}")
    if "fresh_memory" not in results and "fresh_memory" in old:
        results["fresh_memory"] = old["fresh_memory"]
    return results


def draw(results: dict[str, Any], folder: Path) -> None:
    """The PNGs of the results (none without matplotlib, not in ``make test``'s extras)."""
    try:
        from . import plots
    except ImportError as exc:
        log(f"   no plots ({exc}); `make bench` installs matplotlib")
        return
    plots.draw_all(results, folder)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; servers and child processes stopped")
        sys.exit(130)
