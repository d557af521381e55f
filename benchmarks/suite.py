"""`make bench`: every benchmark in benchmarks/, one RESULTS.md, plots in docs/img/.

    scripts/loopback-only .venv/bin/python -m benchmarks.suite [--quick | --smoke] [--budget S]

1. ``cross_backend.py``: every backend beside its baselines from 1 KB to above 2 GiB,
   with the sizes of the backend issues' targets (40 MB, 400 MB), 500 small arrays vs 4
   large ones, fan-out to 8 reader processes, redis-server's memory under readers, client
   memory.
2. ``benchmarks/results.json`` (every sample), ``benchmarks/RESULTS.md`` (report.py) and
   the PNGs under ``docs/img/`` (plots.py; ``python -m benchmarks.plots results.json``
   redraws them).

``--smoke`` (in ``make test``): every group and stage on every backend with tiny sizes and
one or two rounds, in well under a minute; prints RESULTS.md as it would be, checks that
every figure is in it (smoke.py), and writes only to a temporary directory, removed after.

Servers (a Reverb server, a redis-server on 127.0.0.1) are started here and stopped on
the way out, also on Ctrl-C, SIGTERM or an error; every wait is bounded. Reverb listens
on every interface: run this under ``scripts/loopback-only`` (``make bench`` does).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from .common import machine, machine_line, stage

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def log(line: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {line}", flush=True)


def arguments(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite",
                                     description=(__doc__ or "").splitlines()[0])
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--quick", action="store_true",
                       help="small sizes and few rounds: tries the suite out in ~3 minutes; "
                       "writes to a temporary directory unless --out/--img are given")
    modes.add_argument("--smoke", action="store_true",
                       help="every group on every backend, tiny sizes, one or two rounds: "
                       "prints the report and checks every figure is in it; writes nothing "
                       "but a temporary directory, removed after")
    parser.add_argument("--budget", type=float, default=840,
                        help="seconds the whole suite may take (default 840); stages that no "
                        "longer fit are skipped and RESULTS.md says so")
    parser.add_argument("--out", type=Path,
                        help="RESULTS.md to write (default benchmarks/RESULTS.md)")
    parser.add_argument("--img", type=Path, help="folder for the PNGs (default docs/img)")
    args = parser.parse_args(argv)
    if args.smoke and (args.out or args.img):
        parser.error("--smoke writes to a temporary directory only: drop --out and --img")
    return args


def main(argv: Optional[List[str]] = None) -> int:
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
    from . import cross_backend, plan  # after the signal handlers: they import numpy

    started = time.monotonic()
    chosen = (plan.smoke_plan() if args.smoke else plan.quick_plan() if args.quick
              else plan.full_plan())
    results: Dict[str, Any] = {"machine": machine(), "quick": trial, "smoke": args.smoke,
                               "stage_seconds": {}, "plan": chosen.summary()}
    log(f"{machine_line(results['machine'])}; budget {args.budget:.0f} s; writing {out_path}")

    def time_left() -> float:
        return args.budget - (time.monotonic() - started) - 45  # 45 s to write and draw

    try:
        with stage("cross-backend measurements", log, results["stage_seconds"]):
            cross_backend.run(chosen, results, log, time_left)
    finally:
        for child in multiprocessing.active_children():  # none should be left; be sure
            child.kill()
            child.join(5)
        results["seconds"] = time.monotonic() - started
        (scratch / "results.json").write_text(json.dumps(results, default=str))
        if not args.smoke:
            log(f"raw results (also of an interrupted run): {scratch / 'results.json'}")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, default=str))
    from . import report

    with stage("plots and RESULTS.md", log):
        images = draw(results, img_dir, required=not args.smoke)
        report.write(results, out_path, images, json_path)
    if args.smoke:
        return smoke_verdict(results, out_path.read_text(), started)
    log(f"done in {(time.monotonic() - started) / 60:.1f} min: {out_path}, {json_path}, "
        f"{len(images)} plots in {img_dir}")
    return 0


def draw(results: Dict[str, Any], folder: Path, required: bool) -> Dict[str, Path]:
    """The PNGs; a smoke run without matplotlib (not in ``make test``'s extras) skips them."""
    try:
        from . import plots
    except ImportError as exc:
        if required:
            raise SystemExit(f"{exc}: the plots need matplotlib, "
                             'pip install -e ".[bench]" (make bench does)') from None
        log(f"   no plots ({exc}); `make bench` installs matplotlib")
        return {}
    return plots.draw_all(results, folder)


def smoke_verdict(results: Dict[str, Any], markdown: str, started: float) -> int:
    from .smoke import missing_figures

    print(markdown, flush=True)
    missing = missing_figures(results, markdown)
    for problem in missing:
        log(f"MISSING: {problem}")
    log(f"smoke run {'FAILED' if missing else 'passed'}: "
        f"{time.monotonic() - started:.0f} s, {len(missing)} figures missing")
    return 1 if missing else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; servers and child processes stopped")
        sys.exit(130)
