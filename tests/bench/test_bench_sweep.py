"""The harness's rounds and statistics (benchmarks/harness.py): each contender's
operations stay together as one turn, which turn comes first rotates from round to round
(so that no contender always pays the cold caches after a round's garbage collection),
sample i of every operation comes from round i, and a ratio is taken round by round."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Group, contender_turns, paired_ratio, run_group, summary  # noqa: E402


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
    samples = run_group(Group("g", ops, warm=1), rounds=4)

    warm, rounds = calls[:4], calls[4:]
    assert warm == [("a", "push"), ("a", "pull"), ("b", "push"), ("c", "push")]
    firsts = [rounds[i * 4] for i in range(4)]
    assert firsts == [("a", "push"), ("b", "push"), ("c", "push"), ("a", "push")]
    assert rounds[4:8] == [("b", "push"), ("c", "push"), ("a", "push"), ("a", "pull")]
    # every operation timed once per round, under its own name
    assert {key: len(values) for key, values in samples.items()} == {
        ("a", "push"): 4, ("a", "pull"): 4, ("b", "push"): 4, ("c", "push"): 4}


def test_before_runs_untimed_at_the_start_of_every_round_and_per_round_after() -> None:
    calls: List[str] = []
    group = Group("g", [("a", "op", lambda: calls.append("op"))], warm=1,
                  before=lambda: calls.append("before"),
                  per_round=[lambda: calls.append("after") or {("a", "first"): 2.0}])
    samples = run_group(group, rounds=2)
    assert calls == ["before", "op", "before", "op", "after", "before", "op", "after"]
    assert samples[("a", "first")] == [2.0, 2.0]


def test_a_ratio_is_taken_round_by_round_not_between_medians() -> None:
    # a noisy round slows both alike: round by round the ratio stays 0.5
    mine, baseline = [1.0, 10.0, 1.0, 10.0], [2.0, 20.0, 2.0, 20.0]
    ratio = paired_ratio(mine, baseline)
    assert ratio["median"] == ratio["q1"] == ratio["q3"] == 0.5
    assert ratio["n"] == 4


def test_summary_gives_the_median_and_the_interquartile_range() -> None:
    s = summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median"], s["q1"], s["q3"], s["n"]) == (3.0, 2.0, 4.0, 5)
    assert summary([]) == {}
