"""Concurrency: readers in threads never observe a mix of two versions while a writer,
in this process or another, pushes."""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any, Callable, Dict, List, Type

import pytest

import varsync
from varsync.backends.base import Backend
from varsync.testing._base import CONSISTENCY, TableMaker, _Base
from varsync.testing.values import check_consistent, filled

__all__ = ["ConcurrencyTests"]


def _write_versions(url: str, options: Dict[str, Any], table: str, start: int, count: int) -> None:
    """Child process: push ``count`` consistent nests (the numbers after ``start``)."""
    with varsync.connect(url, **options) as container:
        for number in range(start + 1, start + count + 1):
            container.push(filled(CONSISTENCY, number), table=table)


class ConcurrencyTests(_Base):
    """Readers never observe a mix of two versions while a writer pushes."""

    PUSHES = 150
    READERS = 3

    def _read_until(self, container: Any, stop: threading.Event, problems: List[str]) -> int:
        """Pull every new version until ``stop`` is set and nothing newer is left; return
        the last version seen (0 if none was)."""
        last_version, reads = 0, 0
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
                last_version = version
            elif finished:
                break
        if reads == 0:
            problems.append("a reader saw no version at all while the writer pushed")
        return last_version

    def _run_readers(self, url: str, connect: Any, writer: Callable[[], None]) -> List[str]:
        """Run :attr:`READERS` reader threads while ``writer()`` pushes; the problems they
        saw, including a reader whose last version is not the table's final one."""
        problems: List[str] = []
        last_seen: List[int] = []
        stop = threading.Event()
        readers = [
            threading.Thread(target=self._guard, args=(connect(url), stop, problems, last_seen))
            for _ in range(self.READERS)
        ]
        for thread in readers:
            thread.start()
        try:
            writer()
        finally:
            stop.set()
            for thread in readers:
                thread.join(90)
        assert not any(t.is_alive() for t in readers), "a reader did not finish"
        final = connect(url).version()
        problems += [
            f"a reader's last version was {seen}, not the table's final {final}"
            for seen in last_seen if seen != final
        ]
        return problems

    def _guard(
        self, container: Any, stop: threading.Event, problems: List[str], last_seen: List[int]
    ) -> None:
        try:
            last_seen.append(self._read_until(container, stop, problems))
        except AssertionError as exc:
            problems.append(str(exc))
        except Exception as exc:
            problems.append(f"{type(exc).__name__}: {exc}")

    def test_readers_never_see_a_mix_of_two_versions(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        url = make_tables({"variables": CONSISTENCY})
        writer = connect(url)

        def write() -> None:
            for number in range(1, self.PUSHES + 1):
                writer.push(filled(CONSISTENCY, number))

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

        def write() -> None:
            child = context.Process(
                target=_write_versions,
                args=(url, dict(connect_options), "variables", 0, self.PUSHES),
            )
            child.start()
            child.join(120)
            if child.is_alive():
                child.kill()
                child.join()
            assert child.exitcode == 0, f"writer process exited with {child.exitcode}"

        assert self._run_readers(url, connect, write) == []
        assert check_consistent(connect(url).pull()) == self.PUSHES
