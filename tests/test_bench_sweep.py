"""The size sweep's rounds (benchmarks/sweep.py): each contender's operations stay together
as one turn, and which turn comes first rotates from round to round, so that no contender
always pays the cold caches that follow a round's garbage collection."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.sweep import Group, Sweep, contender_turns  # noqa: E402


def recording(calls: List[Tuple[str, str]], contender: str, op: str
              ) -> Tuple[str, str, Callable[[], Any]]:
    return (contender, op, lambda: calls.append((contender, op)))


def test_turns_group_a_contenders_operations_in_order_of_first_appearance() -> None:
    calls: List[Tuple[str, str]] = []
    ops = [recording(calls, "varsync", "push"), recording(calls, "np.copyto", "push"),
           recording(calls, "varsync", "pull"), recording(calls, "redis-py", "push")]
    turns = contender_turns(ops)
    assert [[(c, o) for c, o, _ in turn] for turn in turns] == [
        [("varsync", "push"), ("varsync", "pull")],
        [("np.copyto", "push")],
        [("redis-py", "push")],
    ]


def test_each_round_starts_with_the_next_contenders_turn() -> None:
    calls: List[Tuple[str, str]] = []
    ops = [recording(calls, "a", "push"), recording(calls, "a", "pull"),
           recording(calls, "b", "push"), recording(calls, "c", "push")]
    group = Group("g", ops, [], lambda: None, warm=1)
    case = SimpleNamespace(rounds=4, inner=1, name="case", layout="few", leaves=1, nbytes=8)
    sweep = SimpleNamespace(out={"sweep": [], "polls": []})
    Sweep.run_group(sweep, case, group)  # type: ignore[arg-type]

    warm, rounds = calls[:4], calls[4:]
    assert warm == [("a", "push"), ("a", "pull"), ("b", "push"), ("c", "push")]
    firsts = [rounds[i * 4] for i in range(4)]
    assert firsts == [("a", "push"), ("b", "push"), ("c", "push"), ("a", "push")]
    assert rounds[4:8] == [("b", "push"), ("c", "push"), ("a", "push"), ("a", "pull")]
    # every operation timed once per round, recorded under its own name
    recorded = {(row["contender"], row["op"]): len(row["samples"]) for row in sweep.out["sweep"]}
    assert recorded == {("a", "push"): 4, ("a", "pull"): 4, ("b", "push"): 4, ("c", "push"): 4}
