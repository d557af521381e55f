"""Nests and checks the plugin's test modules share (importable by spawned children).
Nests of one number and the check that a pull holds one version are varsync.backend's
``filled`` and ``check_consistent``."""

import multiprocessing
import os

import varsync

CONTEXT = multiprocessing.get_context("spawn")

#: ~3.3 MB: above MAP_ABOVE, so pulls map the segment.
BIG = {
    "a": varsync.Spec((512, 1024), "float32"),
    "b": [varsync.Spec((300_000,), "float32"), varsync.Spec((), "int64")],
}
#: A few hundred bytes: pulls copy the segment.
SMALL = {"w": varsync.Spec((16, 4), "float32"), "step": varsync.Spec((), "int64")}
LAYOUTS = {"mapped": BIG, "copied": SMALL}


def open_fds():
    return len(os.listdir("/proc/self/fd"))
