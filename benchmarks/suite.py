"""`make bench`: every benchmark in benchmarks/, one RESULTS.md, plots in docs/img/.

    scripts/loopback-only .venv/bin/python benchmarks/suite.py [--quick] [--budget SECONDS]

1. The per-backend scripts, each in its own process, with fewer rounds than their
   defaults so that the whole suite fits in 15 minutes: ``reverb_bench.py`` (varsync vs
   TF-Agents' container), ``redis_bench.py`` (vs hand-written redis-py and np.copyto, with
   the issue-4 targets), ``shm_bench.py`` (vs np.copyto).
2. ``cross_backend.py``: every backend beside its baselines from 1 KB to above 2 GiB,
   500 small arrays vs 4 large ones, fan-out to 8 reader processes, client memory.
3. ``benchmarks/results.json`` (every sample), ``benchmarks/RESULTS.md`` (report.py) and
   the PNGs under ``docs/img/`` (plots.py; ``plots.py results.json`` redraws them).

Servers (a Reverb server, a redis-server on 127.0.0.1) are started here and stopped on
the way out, also on Ctrl-C, SIGTERM or an error; every wait is bounded. Reverb listens
on every interface: run this under ``scripts/loopback-only`` (``make bench`` does).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from common import machine, machine_line, stage  # noqa: E402

#: The per-backend scripts and the rounds they get here (their defaults are larger).
SCRIPTS = {
    "reverb": ["reverb_bench.py", "--rounds", "15", "--polls", "300"],
    "redis": ["redis_bench.py", "--repeat", "9"],
    "shm": ["shm_bench.py", "--repeats", "7"],
}
QUICK_SCRIPTS = {
    "reverb": ["reverb_bench.py", "--rounds", "2", "--polls", "50"],
    "redis": ["redis_bench.py", "--repeat", "2", "--sizes", "4", "40"],
    "shm": ["shm_bench.py", "--repeats", "2", "--sizes", "4MB,40MB"],
}
SCRIPT_TIMEOUT = 300  # seconds one script may run before it is stopped


def log(line: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {line}", flush=True)


def run_script(name: str, argv: List[str], workdir: Path) -> Dict[str, Any]:
    """Run one per-backend script in its own session (so that it and every process it
    starts can be stopped together); return its markdown, JSON figures and wall time."""
    figures, markdown = workdir / f"{name}.json", workdir / f"{name}.md"
    command = [sys.executable, str(HERE / argv[0]), *argv[1:], "--json", str(figures)]
    if name == "reverb":
        command += ["--markdown", str(markdown)]
    started = time.monotonic()
    with open(workdir / f"{name}.out", "w") as stdout, open(workdir / f"{name}.err", "w") as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, cwd=ROOT, start_new_session=True)
        try:
            returncode = process.wait(SCRIPT_TIMEOUT)
        except BaseException:  # timeout, Ctrl-C, SIGTERM: stop it and all it started
            stop_session(process)
            raise
    seconds = time.monotonic() - started
    result: Dict[str, Any] = {"command": " ".join(["benchmarks/" + argv[0], *argv[1:]]),
                              "seconds": seconds, "returncode": returncode}
    text = markdown.read_text() if markdown.exists() else (workdir / f"{name}.out").read_text()
    result["markdown"] = text
    result["figures"] = json.loads(figures.read_text()) if figures.exists() else {}
    if returncode != 0:
        result["error"] = (workdir / f"{name}.err").read_text()[-3000:]
    return result


def stop_session(process: subprocess.Popen) -> None:
    """SIGINT to the script's whole process group (its finally blocks stop its servers),
    then SIGKILL to whatever is left of the group."""
    for sig, grace in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGINT:  # the leader is gone; make sure its children are too
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and few rounds: tries the suite out in ~3 minutes; "
                        "writes to a temporary directory unless --out/--img are given")
    parser.add_argument("--budget", type=float, default=780,
                        help="seconds the whole suite may take (default 780); stages that no "
                        "longer fit are skipped and RESULTS.md says so")
    parser.add_argument("--out", type=Path, help="RESULTS.md to write (default benchmarks/RESULTS.md)")
    parser.add_argument("--img", type=Path, help="folder for the PNGs (default docs/img)")
    parser.add_argument("--skip-scripts", action="store_true", help="do not run the per-backend scripts")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="varsync-bench-"))
    out_path = args.out or (scratch / "RESULTS.md" if args.quick else HERE / "RESULTS.md")
    img_dir = args.img or (scratch / "img" if args.quick else ROOT / "docs" / "img")
    json_path = out_path.parent / "results.json"

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter, in every process
    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    import cross_backend  # after the signal handlers: it imports numpy

    started = time.monotonic()
    results: Dict[str, Any] = {"machine": machine(), "quick": args.quick, "scripts": {}, "stage_seconds": {}}
    log(f"{machine_line(results['machine'])}; budget {args.budget:.0f} s; writing {out_path}")
    try:
        if not args.skip_scripts:
            for name, script in (QUICK_SCRIPTS if args.quick else SCRIPTS).items():
                with stage(script[0], log, results["stage_seconds"]):
                    results["scripts"][name] = run_script(name, script, scratch)
                    if results["scripts"][name]["returncode"] != 0:
                        log(f"   {script[0]} failed:\n{results['scripts'][name].get('error', '')}")
        plan = cross_backend.quick_plan() if args.quick else cross_backend.full_plan()
        results["plan"] = {"fanout_bytes": plan.fanout_bytes, "fanout_readers": plan.fanout_readers,
                           "fanout_pulls": plan.fanout_pulls, "probe_bytes": plan.probe_bytes,
                           "polls": plan.polls, "reverb_polls": plan.reverb_polls}

        def time_left() -> float:
            return args.budget - (time.monotonic() - started) - 45  # 45 s to write and draw

        with stage("cross-backend measurements", log, results["stage_seconds"]):
            cross_backend.run(plan, results, log, time_left)
    finally:
        for child in multiprocessing.active_children():  # none should be left; be sure
            child.kill()
            child.join(5)
        results["seconds"] = time.monotonic() - started
        (scratch / "results.json").write_text(json.dumps(results, default=str))
        log(f"raw results (also of an interrupted run): {scratch / 'results.json'}")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, default=str))
    import plots
    import report

    with stage("plots and RESULTS.md", log):
        images = plots.draw_all(results, img_dir)
        report.write(results, out_path, images, json_path)
    log(f"done in {(time.monotonic() - started) / 60:.1f} min: {out_path}, {json_path}, "
        f"{len(images)} plots in {img_dir}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; servers and child processes stopped")
        sys.exit(130)
