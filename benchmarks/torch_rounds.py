"""Issue 15.2 for PyTorch modules: varsync's ``update`` of a many-variable nest into a
``torch.nn.Module``, round by round beside TF-Agents' ``update`` into ``tf.Variable``s.

No one environment holds both: TF-Agents 0.19 pins ``typing-extensions==4.5.0`` and
torch 2.13 needs 4.10 or newer. So this program runs in ``make bench``'s ``.venv-torch``
(TensorFlow 2.15, dm-reverb 0.14 and torch, no TF-Agents), started by the suite's
cross-backend group (:func:`benchmarks.cross_backend.torch_many`, in the TF
environment), which times TF-Agents' update and then asks this process for one round of
its own, on the same Reverb server, turn by turn.

``python -m benchmarks.torch_rounds ADDRESS TABLE NBYTES LEAVES``: the table holds
:func:`~benchmarks.common.nest_of` ``(NBYTES, LEAVES)``, pushed by the suite. One JSON
line per message on stdout: ``{"ready": {distribution: version}}`` once warm; for each
``go`` line on stdin, ``{"reverb": s, "memory": s}`` (``update(model)`` from reverb://,
then from a memory:// store of this process holding the same nest); on ``end`` (or the
end of stdin: the suite is gone), ``{"end": n}`` once the module holds the table's values
bit for bit, ``n`` the tensors checked. ``{"error": traceback}`` if anything fails.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from importlib import metadata
from typing import Any

from .common import nest_of

WARM = 3  # untimed updates of each before the first round


def say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def module_of(nest: dict[str, Any]) -> Any:
    """A module with one parameter per leaf, zeros, registered in the table's (sorted)
    order: what an actor's copy of the policy holds before its first update."""
    import torch

    model = torch.nn.Module()
    for name in sorted(nest):
        model.register_parameter(name, torch.nn.Parameter(torch.zeros(nest[name].shape)))
    return model


def main(address: str, table: str, nbytes: int, leaves: int) -> None:
    import torch

    import varsync

    nest = nest_of(nbytes, leaves)
    model = module_of(nest)
    with (
        varsync.connect(f"reverb://{address}", timeout=300) as reverb,
        varsync.connect(f"memory://bench-torch-{table}") as memory,
    ):
        memory.create_table(table, nest)
        memory.push(nest, table)
        # every leaf each time, as the sweep's updates into tf.Variables (no delta)
        updates = {
            "reverb": lambda: reverb.update(model, table, delta_only=False),
            "memory": lambda: memory.update(model, table, delta_only=False),
        }
        for _ in range(WARM):
            for name, update in updates.items():
                with torch.no_grad():
                    for parameter in model.parameters():
                        parameter.zero_()
                update()
                check(model, nest, f"after an update from {name}://")
        say(
            {
                "ready": {
                    name: metadata.version(name)
                    for name in ("torch", "numpy", "dm-reverb", "tensorflow-cpu", "varsync")
                }
            }
        )
        for line in sys.stdin:  # bounded by the suite: it sends "end" or closes the pipe
            if line.strip() != "go":
                break
            times = {}
            for name, update in updates.items():
                started = time.perf_counter()
                update()
                times[name] = time.perf_counter() - started
            say(times)
        check(model, nest, "after the timed updates")
        say({"end": len(nest)})


def check(model: Any, nest: dict[str, Any], when: str) -> None:
    """The module holds ``nest`` bit for bit, or AssertionError naming a tensor."""
    import numpy as np

    held = model.state_dict()
    wrong = [name for name in nest if not np.array_equal(held[name].numpy(), nest[name])]
    if wrong:
        raise AssertionError(
            f"{when}, {len(wrong)} tensors differ from the table's values (first: {wrong[0]!r})"
        )


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    except BaseException:
        say({"error": traceback.format_exc()})
        raise
