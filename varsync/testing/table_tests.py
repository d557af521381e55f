"""Tables: creation (also by two processes at once), listing, info, and errors that name
the tables there are."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

import varsync
from varsync._backends.base import Backend
from varsync.testing._base import SMALL, TableMaker, _Base
from varsync.testing.values import assert_bit_equal, filled

__all__ = ["TableTests"]

#: Tables the racers create at once (``race0``, ``race1``, ...), one per round: every
#: fourth round all racers ask for one signature, the others each for its own. Racers:
#: two spawned processes, each with four threads of a container each.
RACE_ROUNDS = 200
RACERS_PER_PROCESS = 4
#: Round r starts at ``start + r * RACE_PERIOD`` (``start`` agreed once, the clock the
#: processes of a host share) and, within a process, once its racers are all there. A
#: racer sleeps until RACE_SPIN before the instant, then spins: on a quiet machine the
#: two processes leave within microseconds of each other, where a barrier per round
#: releases its parties one by one, a wake-up apart. On a loaded one the processes take
#: turns, but each one's threads still race (the GIL handed over every 10 us). A racer
#: behind the schedule goes at once: a round less contested, never a wrong one. A
#: check-then-insert in two steps (tests/conformance/mutants/broken.py's) lost 7 to 88 of 100 fully
#: contested rounds on a loaded 2-core machine.
RACE_PERIOD = 0.010
RACE_SPIN = 0.002

#: What a racer reports of one create_table: ``("created", shape)`` with the shape of the
#: signature returned, ``("exists", None)`` for TableExistsError, ``("error", text)``.
Outcome = tuple[str, Any]


def _race_signature(round_: int, racer: int) -> dict[str, varsync.Spec]:
    """The signature racer ``racer`` asks for in round ``round_``."""
    return {"x": varsync.Spec((2,) if round_ % 4 == 0 else (3 + racer,), "float32")}


def _at(instant: float) -> None:
    """Return at ``instant`` (``time.monotonic()``, the same clock in every process of the
    host): a sleep until shortly before, then a spin. Pacing, not synchronisation: the
    checks hold whenever each call is made."""
    left = instant - time.monotonic()
    if left > RACE_SPIN:
        time.sleep(left - RACE_SPIN)
    while time.monotonic() < instant:
        pass


def _create_in_rounds(
    url: str, options: dict[str, Any], process: int, barrier: Any, start: Any, results: Any
) -> None:
    """Child process: :data:`RACERS_PER_PROCESS` threads, each with a container of its own,
    create table ``race<round>`` at each round's instant; report ``{racer: [outcome per
    round]}`` and an error or ``None``. ``barrier``: every racer connected; ``start``: a
    shared double, the first round's instant, which one racer sets between two waits."""
    sys.setswitchinterval(1e-5)  # the threads' calls interleave, not take turns
    outcomes: dict[int, list[Outcome]] = {}
    errors: list[str] = []
    here = threading.Barrier(RACERS_PER_PROCESS)

    def race(racer: int, container: Any) -> None:
        mine = outcomes.setdefault(racer, [])
        try:
            if barrier.wait(60) == 0:
                start.value = time.monotonic() + 0.05
            barrier.wait(60)
            for round_ in range(RACE_ROUNDS):
                _at(start.value + round_ * RACE_PERIOD)
                here.wait(60)
                try:
                    got = container.create_table(f"race{round_}", _race_signature(round_, racer))
                    mine.append(("created", tuple(varsync.flatten(got)[0].shape)))
                except varsync.TableExistsError:
                    mine.append(("exists", None))
                except Exception as exc:  # reported to the parent, which fails the test
                    mine.append(("error", f"{type(exc).__name__}: {exc}"))
        except BaseException as exc:  # reported to the parent, which fails the test
            errors.append(f"racer {racer}: {type(exc).__name__}: {exc}")
            barrier.abort()
            here.abort()

    try:
        racers = range(process * RACERS_PER_PROCESS, (process + 1) * RACERS_PER_PROCESS)
        containers = [varsync.connect(url, **options) for _ in racers]
        try:
            for container in containers:
                container.tables()  # connected, imports done: the creates will overlap
            threads = [
                threading.Thread(target=race, args=(racer, container))
                for racer, container in zip(racers, containers)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            for container in containers:
                container.close()
        results.put((process, outcomes, "; ".join(errors) or None))
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put((process, outcomes, f"{type(exc).__name__}: {exc}"))


class TableTests(_Base):
    """Tables: creation, listing, info, unknown names."""

    def test_created_table_is_listed_with_its_signature(self, store: Any) -> None:
        assert "variables" in store.tables()
        info = store.table_info("variables")
        assert info.name == "variables"
        assert info.version == 0
        assert info.nbytes == 3 * 2 * 4 + 2 * 4 + 8
        assert varsync.flatten(info.signature) == varsync.flatten(SMALL)

    @pytest.fixture
    def created_by_client(self, url: str, connect: Any, backend_cls: type[Backend]) -> Any:
        """A container with table ``t`` created by ``create_table`` (skips where clients
        cannot create tables)."""
        if not backend_cls.supports_create_table:
            pytest.skip("backend cannot create tables from a client")
        container = connect(url)
        container.create_table("t", SMALL)
        return container

    def test_create_table_again_with_same_signature_is_a_no_op(
        self, url: str, connect: Any, created_by_client: Any
    ) -> None:
        container = created_by_client
        container.push(filled(SMALL, 3), table="t")
        again = connect(url).create_table(
            "t",
            {
                "train_step": np.int64(0),
                "policy": (np.zeros((3, 2), np.float32), np.zeros(2, np.float32)),
            },
        )
        assert varsync.flatten(again) == varsync.flatten(SMALL)
        assert container.version("t") == 1

    def test_create_table_with_another_signature_is_refused(
        self, url: str, connect: Any, created_by_client: Any
    ) -> None:
        container = created_by_client
        container.push(filled(SMALL, 5), table="t")
        with pytest.raises(varsync.TableExistsError):
            connect(url).create_table("t", {"train_step": varsync.Spec((), "int32")})
        assert container.version("t") == 1
        assert_bit_equal(connect(url).pull("t"), filled(SMALL, 5))

    def test_unknown_table_raises_key_error_naming_existing_tables(self, store: Any) -> None:
        for call in (
            lambda: store.pull("missing", timeout=1),
            lambda: store.push(filled(SMALL, 1), table="missing"),
            lambda: store.version("missing"),
            lambda: store.pull_if_newer(0, "missing"),
            lambda: store.table_info("missing"),
        ):
            with pytest.raises(varsync.TableNotFoundError) as caught:
                call()
            assert isinstance(caught.value, KeyError)
            assert "missing" in str(caught.value)
            assert "variables" in str(caught.value)

    def test_tables_are_independent(self, make_tables: TableMaker, connect: Any) -> None:
        container = connect(make_tables({"a": SMALL, "b": {"x": varsync.Spec((4,), "int32")}}))
        assert container.push(filled(SMALL, 1), table="a") == 1
        assert container.push(filled(SMALL, 2), table="a") == 2
        assert container.version("b") == 0
        assert container.push({"x": np.arange(4, dtype=np.int32)}, table="b") == 1
        assert container.version("a") == 2
        assert_bit_equal(container.pull("a"), filled(SMALL, 2))
        assert_bit_equal(container.pull("b"), {"x": np.arange(4, dtype=np.int32)})

    def test_two_processes_creating_one_table_at_once_end_with_one_signature(
        self,
        url: str,
        connect: Any,
        connect_options: dict[str, Any],
        backend_cls: type[Backend],
    ) -> None:
        """``create_table`` is atomic across processes and threads. Racers (two processes,
        two threads each) create the same tables at the same instants: asking
        for one signature, all succeed; asking for different ones, exactly one succeeds
        and the others get TableExistsError. Either way the table has the signature that
        succeeded."""
        if not backend_cls.supports_create_table:
            pytest.skip("backend cannot create tables from a client")
        if not backend_cls.shared_across_processes:
            pytest.skip("backend is not shared across processes")
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        barrier = context.Barrier(2 * RACERS_PER_PROCESS)
        start = context.RawValue("d", 0.0)
        processes = [
            context.Process(
                target=_create_in_rounds,
                args=(url, dict(connect_options), index, barrier, start, results),
            )
            for index in (0, 1)
        ]
        for process in processes:
            process.start()
        try:
            reports = [results.get(timeout=120) for _ in processes]
        finally:
            for process in processes:
                process.join(30)
                if process.is_alive():
                    process.kill()
                    process.join()
        assert [error for _, _, error in reports] == [None, None]
        outcomes = {racer: got for _, by_racer, _ in reports for racer, got in by_racer.items()}
        stored = connect(url)
        problems: list[str] = []
        for round_ in range(RACE_ROUNDS):
            got = {racer: outcomes[racer][round_] for racer in sorted(outcomes)}
            held = tuple(varsync.flatten(stored.signature(f"race{round_}"))[0].shape)
            created = {racer: shape for racer, (kind, shape) in got.items() if kind == "created"}
            if round_ % 4 == 0:  # one signature: every racer succeeds
                right = set(created) == set(got) and set(created.values()) == {(2,)}
            else:  # racer i asks for shape (3 + i): exactly one succeeds, the others are told
                right = (
                    len(created) == 1
                    and all(shape == (3 + racer,) for racer, shape in created.items())
                    and sum(kind == "exists" for kind, _ in got.values()) == len(got) - 1
                )
            if not right or held not in created.values():
                problems.append(f"race{round_}: the racers got {got}, the table holds shape {held}")
        assert not problems, (
            f"racers creating a table at once, {len(problems)} rounds of {RACE_ROUNDS} wrong "
            "(every fourth round one signature, shape (2,); the others: racer i asks for "
            "shape (3 + i)): " + "; ".join(problems[:3])
        )
