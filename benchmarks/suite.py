"""`make bench`: every benchmark in benchmarks/, one RESULTS.md, plots in docs/img/.

    scripts/loopback-only .venv/bin/python -m benchmarks.suite [--quick | --smoke] [--budget S]

1. ``cross_backend.py`` (group ``cross-backend``, needs TensorFlow, Reverb, TF-Agents:
   the TF env, .venv): every backend beside its baselines from 1 KB to above 2 GiB,
   with the sizes of the backend issues' targets (40 MB, 400 MB), 500 small arrays vs 4
   large ones, fan-out to 8 reader processes, redis-server's memory under readers, client
   memory; for issue 15 also the pipelined redis-py and raw-TCP baselines, a Reverb server
   of 50 tables and fresh processes' cold starts.
2. ``frameworks.py`` (group ``frameworks``, needs torch and/or jax: the modern env): a
   100 MB PyTorch state_dict over shm:// and redis:// and a JAX pytree over shm://, beside
   what their users write by hand (issue 14.8).
3. ``delta.py`` (group ``delta``, issue 16, needs redis-py and the shm plugin for those
   backends: ``make bench`` runs it in the modern env): delta sync on memory://, redis://
   and shm://, bytes moved against bytes changed, delta pulls and updates against a whole
   pull, a push where everything changed with and without change detection.
4. ``benchmarks/results.json`` (every sample), ``benchmarks/RESULTS.md`` (report.py) and
   the PNGs under ``docs/img/`` (plots.py; ``python -m benchmarks.plots results.json``
   redraws them). results.json also keeps, under "previous", issue 15's target figures of
   the results.json that was there when the run started (the committed run, in a fresh
   clone), which RESULTS.md shows beside this run's.

A group whose frameworks do not import here is skipped with the reason printed (not a
failure, also under ``--smoke``). ``--group NAME`` runs only that group; a full run (not
``--quick``/``--smoke``) keeps the sections of results.json of the groups it did not run
and regenerates RESULTS.md from every group present, so the two environments' runs merge:

    scripts/loopback-only .venv/bin/python -m benchmarks.suite --group cross-backend   # TF env
    scripts/loopback-only .tox/modern/bin/python -m benchmarks.suite --group frameworks \
        --group delta

``--smoke`` (in ``make test``): every group and stage on every backend with tiny sizes and
one or two rounds, in well under a minute; prints RESULTS.md as it would be, checks that
every figure is in it (smoke.py), and writes only to a temporary directory, removed after.

Servers (a Reverb server, a redis-server on 127.0.0.1) are started here and stopped on
the way out, also on Ctrl-C, SIGTERM or an error; every wait is bounded. Reverb listens
on every interface: run this under ``scripts/loopback-only`` (``make bench`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from .common import fresh_memory, machine, machine_line, stage

HERE = Path(__file__).resolve().parent
GROUPS = ("cross-backend", "frameworks", "delta")
#: results.json's key of each group but cross-backend, whose keys are all the others
OWN_KEYS = {"frameworks": "frameworks", "delta": "delta"}
CROSS_BACKEND_MODULES = ("tensorflow", "reverb", "tf_agents")
FRAMEWORKS_SECONDS = 150  # the frameworks group at 100 MB, about (15 rounds)
ROOT = HERE.parent


def log(line: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {line}", flush=True)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.suite", description=(__doc__ or "").splitlines()[0]
    )
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and few rounds: tries the suite out in ~3 minutes; "
        "writes to a temporary directory unless --out/--img are given",
    )
    modes.add_argument(
        "--smoke",
        action="store_true",
        help="every group on every backend, tiny sizes, one or two rounds: "
        "prints the report and checks every figure is in it; writes nothing "
        "but a temporary directory, removed after",
    )
    parser.add_argument(
        "--group",
        action="append",
        choices=GROUPS,
        help="run only this group (repeatable; default: every group); a full "
        "run keeps the other groups' results from results.json",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=1500,
        help="seconds the whole suite may take (default 1500); stages that no "
        "longer fit are skipped and RESULTS.md says so",
    )
    parser.add_argument(
        "--out", type=Path, help="RESULTS.md to write (default benchmarks/RESULTS.md)"
    )
    parser.add_argument("--img", type=Path, help="folder for the PNGs (default docs/img)")
    args = parser.parse_args(argv)
    if args.smoke and (args.out or args.img):
        parser.error("--smoke writes to a temporary directory only: drop --out and --img")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    scratch = Path(tempfile.mkdtemp(prefix="varsync-bench-"))
    try:
        return _run(args, scratch)
    finally:
        if args.smoke:
            shutil.rmtree(scratch, ignore_errors=True)


def _run(args: argparse.Namespace, scratch: Path) -> int:
    trial = args.quick or args.smoke
    out_path = args.out or (scratch / "RESULTS.md" if trial else HERE / "RESULTS.md")
    img_dir = args.img or (scratch / "img" if trial else ROOT / "docs" / "img")
    json_path = out_path.parent / "results.json"

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's chatter, in every process
    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    from . import plan  # after the signal handlers: it imports numpy

    started = time.monotonic()
    chosen = (
        plan.smoke_plan() if args.smoke else plan.quick_plan() if args.quick else plan.full_plan()
    )
    groups = args.group or list(GROUPS)
    # the machine's fresh memory, for the figures of the sweep (RESULTS.md's header)
    memory = fresh_memory(*chosen.fresh_memory) if "cross-backend" in groups else None
    results: dict[str, Any] = {
        "machine": machine(),
        "quick": trial,
        "smoke": args.smoke,
        "fresh_memory": memory,
        "stage_seconds": {},
        "plan": chosen.summary(),
        "tree": working_tree(),
        "previous": previous_run(json_path if json_path.exists() else HERE / "results.json"),
    }
    log(f"{machine_line(results['machine'])}; budget {args.budget:.0f} s; writing {out_path}")

    def time_left() -> float:
        return args.budget - (time.monotonic() - started) - 45  # 45 s to write and draw

    ran: list[str] = []
    try:
        run_groups(groups, chosen, results, time_left, ran)
    finally:
        results["seconds"] = time.monotonic() - started
        results["load_average_end"] = os.getloadavg()
        (scratch / "results.json").write_text(json.dumps(results, default=str))
        if not args.smoke:
            log(f"raw results (also of an interrupted run): {scratch / 'results.json'}")
    if not trial:
        results = merged(results, json_path, ran)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, default=str))
    from . import report

    with stage("plots and RESULTS.md", log):
        plotted = any(g in ran for g in ("cross-backend", "frameworks"))  # delta: no plots
        images = draw(results, img_dir, required=plotted and not args.smoke, groups=ran)
        if trial or "cross-backend" in ran:
            report.write(results, out_path, images, json_path)
        else:  # only sections 8 and 10 are new: the rest of RESULTS.md stays as written
            report.splice(results, out_path, images, ran)
    if args.smoke:
        return smoke_verdict(results, out_path.read_text(), started, groups)
    log(
        f"done in {(time.monotonic() - started) / 60:.1f} min: {out_path}, {json_path}, "
        f"{len(images)} plots in {img_dir}"
    )
    return 0


def previous_run(path: Path) -> dict[str, Any] | None:
    """The figures of issue 15's targets in the run whose results.json is at ``path`` (the
    one this run replaces, or else the committed one: in a fresh clone, both), kept in this
    run's results for the report's "previous run" column; None without one."""
    from .report_targets import previous_figures

    previous = previous_figures(path)
    if previous:
        log(f"   previous run: {previous['started']}, {len(previous['figures'])} target figures")
    return previous


def working_tree() -> dict[str, Any]:
    from .frameworks import working_tree as tree

    return tree()


def missing_modules(names: Sequence[str]) -> list[str]:
    return [name for name in names if importlib.util.find_spec(name) is None]


def run_groups(
    groups: list[str],
    chosen: Any,
    results: dict[str, Any],
    time_left: Callable[[], float],
    ran: list[str],
) -> None:
    """Run the groups that can run here, in order; append their names to ``ran``. A group
    that cannot is recorded in ``results["groups_skipped"]`` with the reason, and printed."""
    results["groups_skipped"] = {}
    try:
        for group in GROUPS:
            if group not in groups:
                continue
            if group == "cross-backend":
                missing = missing_modules(CROSS_BACKEND_MODULES)
                if missing:
                    skip(
                        results,
                        group,
                        f"{', '.join(missing)} not installed here "
                        "(the cross-backend group runs in the TF env, .venv)",
                    )
                    continue
                from . import cross_backend

                with stage("cross-backend measurements", log, results["stage_seconds"]):
                    cross_backend.run(chosen, results, log, time_left)
            elif group == "delta":
                if not run_delta(results, time_left):
                    continue
            else:
                from . import frameworks

                reason = frameworks.unavailable()
                if reason is None and time_left() < FRAMEWORKS_SECONDS:
                    reason = (
                        f"{time_left():.0f} s of the time budget left and it needs "
                        f"about {FRAMEWORKS_SECONDS} s"
                    )
                elif reason:
                    reason += " (the frameworks group runs in the modern env: torch, jax)"
                if reason:
                    skip(results, group, reason)
                    continue
                with (
                    contextlib.ExitStack() as servers,
                    stage("frameworks (PyTorch, JAX)", log, results["stage_seconds"]),
                ):
                    results["frameworks"] = {}
                    frameworks.run(
                        chosen.frameworks, results["frameworks"], log, lazy_redis_server(servers)
                    )
            ran.append(group)
    finally:
        for child in multiprocessing.active_children():  # none should be left; be sure
            child.kill()
            child.join(5)


def run_delta(results: dict[str, Any], time_left: Callable[[], float]) -> bool:
    """The delta group, into ``results["delta"]``, with a redis-server of its own; False
    (and the reason recorded) if it did not run."""
    from . import delta

    plan = delta.plan_for(smoke=results["smoke"], quick=results["quick"] and not results["smoke"])
    if time_left() < plan.seconds:
        skip(
            results,
            "delta",
            f"{time_left():.0f} s of the time budget left and it needs about {plan.seconds:.0f} s",
        )
        return False
    with (
        contextlib.ExitStack() as servers,
        stage("delta sync (issue 16)", log, results["stage_seconds"]),
    ):
        results["delta"] = {}
        delta.run(plan, results["delta"], log, servers)
    return True


def lazy_redis_server(servers: contextlib.ExitStack) -> Callable[[], str]:
    """A function returning the URL of a redis-server it starts on first call (loopback, a
    free port, no persistence), stopped when ``servers`` closes."""
    started: list[Any] = []

    def url() -> str:
        if not started:
            from .servers import running_redis_server

            started.append(servers.enter_context(running_redis_server()))
            log(f"   redis-server at {started[0].url}")
        return str(started[0].url)

    return url


def skip(results: dict[str, Any], group: str, reason: str) -> None:
    results["groups_skipped"][group] = reason
    log(f"-- group {group} skipped: {reason}")


def merged(results: dict[str, Any], json_path: Path, ran: list[str]) -> dict[str, Any]:
    """This run's results with the sections of the groups it did not run taken from the
    results.json already there: each of OWN_KEYS' groups has its key ("frameworks",
    "delta"), the cross-backend group every other top-level key."""
    try:
        old = json.loads(json_path.read_text())
    except (OSError, ValueError):
        return results
    skipped = dict(results.get("groups_skipped", {}))
    if "cross-backend" not in ran and old.get("sweep"):
        kept = {k: v for k, v in old.items() if k not in (*OWN_KEYS.values(), "groups_skipped")}
        kept.update({key: results[key] for key in OWN_KEYS.values() if key in results})
        skipped.pop("cross-backend", None)
        results = kept
        log(
            "   kept the cross-backend group's results from the results.json there "
            f"(run {old.get('machine', {}).get('started', '?')})"
        )
    for group, key in OWN_KEYS.items():
        if group not in ran and old.get(key):
            results[key] = old[key]
            skipped.pop(group, None)
            log(
                f"   kept the {group} group's results from the results.json there "
                f"(run {old[key].get('machine', {}).get('started', '?')})"
            )
        if results.get(key) is None:
            results.pop(key, None)
    results["groups_skipped"] = skipped
    return results


def draw(
    results: dict[str, Any], folder: Path, required: bool, groups: Sequence[str] = GROUPS
) -> dict[str, Path]:
    """The PNGs of the groups run now (a smoke run without matplotlib, not in ``make
    test``'s extras, skips them); with the PNGs already in ``folder`` for the others."""
    try:
        from . import plots
    except ImportError as exc:
        if required:
            raise SystemExit(
                f'{exc}: the plots need matplotlib, pip install -e ".[bench]" (make bench does)'
            ) from None
        log(f"   no plots ({exc}); `make bench` installs matplotlib")
        return {}
    images = {p.stem: p for p in folder.glob("*.png")} if folder.is_dir() else {}
    images.update(plots.draw_all(results, folder, groups))
    return images


def smoke_verdict(
    results: dict[str, Any], markdown: str, started: float, groups: Sequence[str]
) -> int:
    from .smoke import missing_figures

    print(markdown, flush=True)
    missing = missing_figures(results, markdown, groups)
    for problem in missing:
        log(f"MISSING: {problem}")
    log(
        f"smoke run {'FAILED' if missing else 'passed'}: "
        f"{time.monotonic() - started:.0f} s, {len(missing)} figures missing"
    )
    return 1 if missing else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; servers and child processes stopped")
        sys.exit(130)
