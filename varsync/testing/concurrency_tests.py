"""Concurrency: readers in threads never observe a mix of two versions while a writer,
in this process or another, pushes."""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any, Callable, Dict, List, Tuple, Type

import pytest

import varsync
from varsync.backends.base import Backend
from varsync.testing._base import CONSISTENCY, TableMaker, _Base
from varsync.testing.values import check_consistent, filled

__all__ = ["ConcurrencyTests"]


def _write_versions(url: str, options: Dict[str, Any], table: str, start: int, count: int,
                    last: Any = None) -> None:
    """Child process: push ``count`` consistent nests (the numbers after ``start``); the
    last push's version goes into ``last`` (a shared ``multiprocessing.Value``) if given."""
    with varsync.connect(url, **options) as container:
        for number in range(start + 1, start + count + 1):
            version = container.push(filled(CONSISTENCY, number), table=table)
            if last is not None:
                last.value = version


class ConcurrencyTests(_Base):
    """Readers never observe a mix of two versions while a writer pushes."""

    PUSHES = 150
    READERS = 3

    def _read_until(
        self, container: Any, stop: threading.Event, final: List[int], problems: List[str]
    ) -> Tuple[int, int]:
        """Pull every new version until ``stop`` is set and the writer's last version
        (``final``, once the writer has finished) has been seen; return the last version
        seen and the number of the push its value came from (0, 0 if none was). A backend
        whose reads may lag its writes (replicas) answers 'nothing newer' for a while after
        the last push: readers wait for it, bounded by the deadline."""
        last_version, last_number, reads = 0, 0, 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and reads < 10_000:
            finished = stop.is_set()
            got = container.pull_if_newer(last_version)
            if got is not None:
                version, values = got
                reads += 1
                if version <= last_version:
                    problems.append(f"version went from {last_version} to {version}")
                number = check_consistent(values)
                if number < version:  # push n made version n: never an older value as newer
                    problems.append(f"version {version} came with the value of push {number}")
                last_version, last_number = version, number
            elif finished and (not final or last_version >= final[0]):
                break
            elif finished:  # the writer is done; the reads have yet to catch up
                try:
                    container.wait_for(
                        last_version, timeout=max(deadline - time.monotonic(), 0.01))
                except varsync.PullTimeoutError:
                    break  # reported below as a reader short of the last version
        if reads == 0:
            problems.append("a reader saw no version at all while the writer pushed")
        return last_version, last_number

    def _run_readers(self, url: str, connect: Any, writer: Callable[[], int]) -> List[str]:
        """Run :attr:`READERS` reader threads while ``writer()`` pushes and returns its last
        push's version; the problems they saw, including a reader whose last version is not
        that final one or whose last value is not the last push's."""
        problems: List[str] = []
        last_seen: List[Tuple[int, int]] = []
        final: List[int] = []
        stop = threading.Event()
        readers = [
            threading.Thread(
                target=self._guard, args=(connect(url), stop, final, problems, last_seen)
            )
            for _ in range(self.READERS)
        ]
        for thread in readers:
            thread.start()
        try:
            final.append(writer())
        finally:
            stop.set()
            for thread in readers:
                thread.join(90)
        assert not any(t.is_alive() for t in readers), "a reader did not finish"
        problems += [
            f"a reader's last version was {seen}, not the writer's last push's {final[0]}"
            for seen, _ in last_seen if seen != final[0]
        ] + [
            f"a reader's last value was push {number}'s, not the last push's ({self.PUSHES})"
            for seen, number in last_seen if seen == final[0] and number != self.PUSHES
        ]
        return problems

    def _guard(
        self, container: Any, stop: threading.Event, final: List[int], problems: List[str],
        last_seen: List[Tuple[int, int]],
    ) -> None:
        try:
            last_seen.append(self._read_until(container, stop, final, problems))
        except AssertionError as exc:
            problems.append(str(exc))
        except Exception as exc:
            problems.append(f"{type(exc).__name__}: {exc}")

    def test_readers_never_see_a_mix_of_two_versions(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        url = make_tables({"variables": CONSISTENCY})
        writer = connect(url)

        def write() -> int:
            versions = [writer.push(filled(CONSISTENCY, number))
                        for number in range(1, self.PUSHES + 1)]
            return versions[-1]

        assert self._run_readers(url, connect, write) == []
        assert check_consistent(writer.pull()) == self.PUSHES

    def test_readers_never_see_a_mix_while_another_process_writes(
        self, make_tables: TableMaker, connect: Any, connect_options: Dict[str, Any],
        backend_cls: Type[Backend],
    ) -> None:
        if not backend_cls.shared_across_processes:
            pytest.skip("backend is not shared across processes")
        url = make_tables({"variables": CONSISTENCY})
        context = multiprocessing.get_context("spawn")

        last = context.Value("q", 0)

        def write() -> int:
            child = context.Process(
                target=_write_versions,
                args=(url, dict(connect_options), "variables", 0, self.PUSHES, last),
            )
            child.start()
            child.join(120)
            if child.is_alive():
                child.kill()
                child.join()
            assert child.exitcode == 0, f"writer process exited with {child.exitcode}"
            return int(last.value)

        assert self._run_readers(url, connect, write) == []
