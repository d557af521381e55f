"""The benchmark's fan-out readers (benchmarks/readers.py) move the whole table on every
fill: the table does not change between them, so a delta update would move nothing and
the fan-out's throughput would count bytes never sent."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import varsync  # noqa: E402
from benchmarks import readers  # noqa: E402


def test_each_fill_assigns_every_leaf_again_though_nothing_changed() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    writer = varsync.connect(url)
    nest = {"a": np.arange(6, dtype=np.float32), "b": np.ones(3, np.float32)}
    writer.create_table("t", nest)
    writer.push(nest, "t")
    fill, mine = readers._filler("varsync", varsync.connect(url), "t")
    fill()
    for array in mine.values():
        array[...] = -1  # changed behind the reader's back: only a whole update restores it
    fill()
    for name, leaf in nest.items():
        np.testing.assert_array_equal(mine[name], leaf)
