"""Cold start (issue 15.5): a new process's first ``varsync.connect(url)`` + ``pull`` of a
table, per backend, and the heavy modules that process imported.

Each sample is a fresh interpreter (``python -m benchmarks.cold_start URL TABLE``) that
starts its clock just before ``import varsync`` (Python's own start-up is not counted; the
backend's imports are) and stops it when the pull returns, then prints one JSON line. The
parent (``run``) fills the tables first. memory:// holds nothing across processes: its
child creates the table and pushes before it pulls (the nest is built off the clock).

This module imports only the standard library at the top: the child's clock must see
every import varsync causes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List

#: Modules a backend should import only if it uses them (issue 15.5).
HEAVY = ("tensorflow", "reverb", "redis", "torch", "jax")
#: What each backend needs of them.
NEEDS = {"memory": (), "reverb": ("tensorflow", "reverb"), "redis": ("redis",), "shm": ()}
TABLE = "cold"
ROOT = Path(__file__).resolve().parent.parent


def child(url: str, table: str, nbytes: int, leaves: int) -> Dict[str, Any]:
    """In the fresh process: import, connect, (memory://: create and push,) pull."""
    started = time.perf_counter()
    import varsync

    imported = time.perf_counter()
    store = varsync.connect(url, timeout=120)
    connected = time.perf_counter()
    built = 0.0
    if url.startswith("memory://"):
        import numpy as np

        t0 = time.perf_counter()
        nest = {f"v{i}": np.ones(nbytes // 4 // leaves, np.float32) for i in range(leaves)}
        built = time.perf_counter() - t0
        store.create_table(table, nest)
        store.push(nest, table)
    pushed = time.perf_counter()
    pulled = store.pull(table)
    done = time.perf_counter()
    payload = sum(leaf.nbytes for leaf in pulled.values())
    store.close()
    return {"seconds": done - started - built, "import": imported - started,
            "connect": connected - imported, "create + push": pushed - connected - built,
            "pull": done - pushed, "bytes": payload,
            "heavy": sorted(name for name in HEAVY if name in sys.modules)}


def run(urls: Dict[str, str], nbytes: int, samples: int, out: Dict[str, Any],
        log: Callable[[str], None]) -> None:
    """``urls``: {backend: URL of a store whose table ``TABLE`` holds ``nbytes`` in 4
    leaves} (memory://'s is empty: its child fills it). ``samples`` fresh processes each,
    taking turns between backends; the records go to ``out["cold_start"]``."""
    records: Dict[str, List[Dict[str, Any]]] = {name: [] for name in urls}
    for _ in range(samples):
        for name, url in urls.items():
            records[name].append(sample(url, nbytes))
    for name, got in records.items():
        median = statistics.median(r["seconds"] for r in got)
        out["cold_start"].append({"backend": name, "url": url_shown(urls[name]),
                                  "bytes": nbytes, "samples": got})
        log(f"   cold start {name}: median {median * 1e3:.0f} ms, "
            f"imported {', '.join(got[0]['heavy']) or 'none of ' + '/'.join(HEAVY)}")


def sample(url: str, nbytes: int) -> Dict[str, Any]:
    if url.startswith("memory://"):  # a store of its own each time
        url = f"memory://cold-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-m", "benchmarks.cold_start", url, TABLE,
                           str(nbytes)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"cold start of {url} failed ({done.returncode}):\n"
                           f"{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def url_shown(url: str) -> str:
    return url.split("?")[0]


if __name__ == "__main__":
    print(json.dumps(child(sys.argv[1], sys.argv[2], int(sys.argv[3]), 4)), flush=True)
    os._exit(0)  # measured and reported: skip TensorFlow's seconds of teardown at exit
