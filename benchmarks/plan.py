"""What a run measures: the cases of the size sweep, and the sizes, readers and rounds of
the stages that follow it. ``full_plan`` is ``make bench``'s; ``quick_plan`` tries the
suite out in a few minutes; ``smoke_plan`` is the check ``make test`` runs (every group,
every backend, tiny sizes, one or two rounds).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .common import GB, KB, MB


@dataclass
class Case:
    """One workload of the sweep: ``leaves`` float32 vectors of ``nbytes`` in all.

    ``targets``: also run what the backend issues set targets on (issues 3, 4, 5): ``version``
    on Redis, and shm://'s pull + read, update into numpy arrays and cold paths.
    ``first_push`` (issue 15.3): the Redis group also times, once per round, the first push
    into a table made for it (made untimed, deleted after)."""

    layout: str  # "few": 4 large arrays; "many": 500 small ones
    leaves: int
    nbytes: int
    rounds: int
    inner: int = 1  # back-to-back calls per timed sample (small sizes)
    update: bool = True  # also time update() into tf.Variables
    targets: bool = False
    first_push: bool = False  # Redis: also a new table's first push, once per round
    dropin: bool = True  # Reverb, 4 arrays: also varsync's drop-in for TF-Agents' container
    profile: bool = False  # Redis: where push, pull and the floor spend their time (15.4)

    @property
    def name(self) -> str:
        return f"{self.layout}_{self.nbytes}"


@dataclass
class Readers:
    """Reader processes pulling one table at once: ``counts`` runs, ``pulls`` each."""

    nbytes: int
    counts: list[int]
    pulls: int


@dataclass
class Frameworks:
    """The framework group (frameworks.py): a policy of ``tensors`` float32 tensors,
    ``nbytes`` in all, ``rounds`` timed rounds after ``warm`` untimed ones."""

    nbytes: int
    tensors: int
    rounds: int
    warm: int = 2


@dataclass
class Plan:
    cases: list[Case]
    big: Case | None  # the run above 2 GiB
    fanout: Readers  # reverb, redis and shm readers
    reader_memory: Readers  # redis-server's memory under varsync vs hand-written readers
    probe_bytes: int  # the client-memory probes' nest
    polls: int = 1000
    reverb_polls: int = 300
    versions: int = 1000  # `version` calls timed at a target size (Redis)
    # issue 15.1: pull_if_newer on one of `tables` Reverb tables of `table_leaves` leaves
    tables: int = 50
    table_leaves: int = 20
    # issue 15.5: a fresh process's import + connect + pull of a table this large, per backend
    cold_bytes: int = 10 * MB
    cold_samples: int = 4
    # issue 14.8: a 100 MB state_dict of 50 tensors
    frameworks: Frameworks = field(default_factory=lambda: Frameworks(100 * MB, 50, 15))
    # the machine: bytes of fresh memory written, and the idle seconds before the last time
    # (common.fresh_memory)
    fresh_memory: tuple[int, float] = (512 * MB, 5.0)

    def summary(self) -> dict[str, Any]:
        """What results.json and RESULTS.md record of the plan."""
        return {
            "fanout_bytes": self.fanout.nbytes,
            "fanout_readers": self.fanout.counts,
            "fanout_pulls": self.fanout.pulls,
            "reader_memory": asdict(self.reader_memory),
            "probe_bytes": self.probe_bytes,
            "polls": self.polls,
            "reverb_polls": self.reverb_polls,
            "versions": self.versions,
            "target_bytes": [c.nbytes for c in self.cases if c.targets],
            "tables": self.tables,
            "table_leaves": self.table_leaves,
            "cold_bytes": self.cold_bytes,
            "cold_samples": self.cold_samples,
        }


def full_plan() -> Plan:
    """`make bench`'s cross-backend group: about 15 minutes on 2 cores (more under load:
    the budget then skips the last stages). 40 MB and 400 MB are the sizes of the backend
    issues' targets (their groups run more: 400 MB takes two to four minutes). Issue 15's
    additions (the drop-in at every size, the pipelined and TCP baselines, first pushes, 50
    tables, cold starts) take about two minutes; to make room, 400 MB runs 4 rounds (was 5),
    the 500-array 100 MB case 3 (was 5), the one above 2 GiB 2 (was 3), and the cold start
    4 processes per backend. The drop-in is not run at 1 GB: the 1 GB case took 352 s with
    it (the whole sweep 809 s, and the 840 s budget then skipped every stage after it),
    and the drop-in's target from 10 MB up is measured at 10, 40, 100 and 400 MB."""
    few = [
        Case("few", 4, 1 * KB, 15, 20, profile=True),
        Case("few", 4, 10 * KB, 15, 20),
        Case("few", 4, 100 * KB, 15, 10),
        Case("few", 4, 1 * MB, 11, 3),
        Case("few", 4, 10 * MB, 7),
        Case("few", 4, 40 * MB, 9, targets=True),
        Case("few", 4, 100 * MB, 5, profile=True),
        Case("few", 4, 400 * MB, 4, targets=True, first_push=True),
        Case("few", 4, 1 * GB, 3, first_push=True, dropin=False, profile=True),
    ]
    many = [Case("many", 500, 1 * MB, 11), Case("many", 500, 100 * MB, 3)]
    return Plan(
        cases=few + many,
        big=Case("few", 4, 2200 * MB, 2, update=False),
        fanout=Readers(100 * MB, [1, 2, 4, 8], 3),
        reader_memory=Readers(400 * MB, [4], 2),
        probe_bytes=400 * MB,
    )


def quick_plan() -> Plan:
    """Minutes become seconds: for trying the suite out, not for figures."""
    return Plan(
        cases=[
            Case("few", 4, 1 * KB, 3, 5),
            Case("few", 4, 1 * MB, 3, targets=True),
            Case("few", 4, 10 * MB, 3, targets=True, first_push=True),
            Case("many", 500, 1 * MB, 3),
        ],
        big=None,
        fanout=Readers(10 * MB, [1, 2], 2),
        reader_memory=Readers(10 * MB, [2], 2),
        probe_bytes=20 * MB,
        polls=200,
        reverb_polls=100,
        versions=200,
        cold_samples=3,
        frameworks=Frameworks(10 * MB, 50, 5),
        fresh_memory=(64 * MB, 2.0),
    )


def smoke_plan() -> Plan:
    """Every group and stage on every backend, tiny, to check that every figure comes out
    (not the run above 2 GiB: that size is the point of it)."""
    return Plan(
        cases=[
            Case("few", 4, 10 * KB, 1, targets=True, first_push=True),
            Case("few", 4, 100 * KB, 2, targets=True, profile=True),
            Case("many", 50, 100 * KB, 1),
        ],
        big=None,
        fanout=Readers(100 * KB, [1, 2], 1),
        reader_memory=Readers(100 * KB, [2], 1),
        probe_bytes=1 * MB,
        polls=20,
        reverb_polls=20,
        versions=20,
        cold_bytes=100 * KB,
        cold_samples=1,
        frameworks=Frameworks(100 * KB, 50, 2, warm=1),
        fresh_memory=(16 * MB, 0.2),
    )
