"""Nests and checks the plugin's test modules share (importable by spawned children)."""

import multiprocessing
import os

import numpy as np

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


def filled(signature, number):
    """A nest of ``signature``'s structure whose every element equals ``number``."""
    leaves = [np.full(spec.shape, number, spec.dtype) for spec in varsync.flatten(signature)]
    return varsync.unflatten(signature, leaves)


def number_in(values):
    """The one number every element of a :func:`filled` nest holds; fails on a mix."""
    numbers = {int(x) for leaf in varsync.flatten(values) for x in np.unique(leaf)}
    assert len(numbers) == 1, f"a pull mixed versions: elements hold {sorted(numbers)}"
    return numbers.pop()


def open_fds():
    return len(os.listdir("/proc/self/fd"))
