"""Concurrency: readers in threads never observe a mix of two versions while a writer,
in this process or another, pushes: nests of ~70 KB, and a value of several megabytes,
which an engine may store in several chunks (rows, keys, messages)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any, Callable

import pytest

import varsync
from varsync._backends.base import Backend
from varsync.testing._base import CONSISTENCY, TableMaker, _Base
from varsync.testing.values import check_consistent, filled

__all__ = ["ConcurrencyTests"]

#: A value of 8 MiB over a few leaves: engines store one this size in several chunks, and a
#: read that gathers them one request at a time can mix two versions.
MEGABYTES = {
    "a": varsync.Spec((1024, 1024), "float32"),
    "b": [varsync.Spec((512, 1024), "float32"), varsync.Spec((256, 1024), "float64")],
    "step": varsync.Spec((), "int64"),
}


def _write_versions(
    url: str, options: dict[str, Any], table: str, start: int, count: int, last: Any = None
) -> None:
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
    #: Pushes of the :data:`MEGABYTES` value, and the readers of each new version.
    LARGE_PUSHES = 24
    LARGE_READERS = 2

    def _read_until(
        self, container: Any, stop: threading.Event, final: list[int], problems: list[str]
    ) -> tuple[int, int]:
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
                # push n made version n: the head and the arrays of one version, never an
                # older push's value as newer (torn) nor a newer one's under an older head
                if number != version:
                    problems.append(f"version {version} came with the value of push {number}")
                last_version, last_number = version, number
            elif finished and (not final or last_version >= final[0]):
                break
            elif finished:  # the writer is done; the reads have yet to catch up
                try:
                    container.wait_for(last_version, timeout=max(deadline - time.monotonic(), 0.01))
                except varsync.PullTimeoutError:
                    break  # reported below as a reader short of the last version
        if reads == 0:
            problems.append("a reader saw no version at all while the writer pushed")
        return last_version, last_number

    def _run_readers(
        self, url: str, connect: Any, writer: Callable[[], int], pushes: int = 0, readers: int = 0
    ) -> list[str]:
        """Run ``readers`` reader threads (default :attr:`READERS`) while ``writer()``
        pushes ``pushes`` values (default :attr:`PUSHES`), numbered from 1, and returns its
        last push's version; the problems they saw, including a reader whose last version
        is not that final one or whose last value is not the last push's."""
        pushes, readers = pushes or self.PUSHES, readers or self.READERS
        problems: list[str] = []
        last_seen: list[tuple[int, int]] = []
        final: list[int] = []
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=self._guard, args=(connect(url), stop, final, problems, last_seen)
            )
            for _ in range(readers)
        ]
        for thread in threads:
            thread.start()
        try:
            final.append(writer())
        finally:
            stop.set()
            for thread in threads:
                thread.join(90)
        assert not any(t.is_alive() for t in threads), "a reader did not finish"
        problems += [
            f"a reader's last version was {seen}, not the writer's last push's {final[0]}"
            for seen, _ in last_seen
            if seen != final[0]
        ] + [
            f"a reader's last value was push {number}'s, not the last push's ({pushes})"
            for seen, number in last_seen
            if seen == final[0] and number != pushes
        ]
        return problems

    def _guard(
        self,
        container: Any,
        stop: threading.Event,
        final: list[int],
        problems: list[str],
        last_seen: list[tuple[int, int]],
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
            versions = [
                writer.push(filled(CONSISTENCY, number)) for number in range(1, self.PUSHES + 1)
            ]
            return versions[-1]

        assert self._run_readers(url, connect, write) == []
        assert check_consistent(writer.pull()) == self.PUSHES

    def test_readers_never_see_a_mix_of_a_value_of_several_megabytes(
        self, make_tables: TableMaker, connect: Any
    ) -> None:
        """The same with a value of 8 MiB (:data:`MEGABYTES`), which an engine may keep in
        several chunks: a version is published, and read, whole or not at all. Besides the
        readers of each new version, one more pulls again and again, so that its reads
        also fall while the writer is storing the next version's chunks."""
        url = make_tables({"variables": MEGABYTES})
        writer, puller = connect(url), connect(url)
        pulled: list[int] = []
        problems: list[str] = []
        stop = threading.Event()

        def pull_again_and_again() -> None:
            try:
                while not stop.is_set():
                    pulled.append(check_consistent(puller.pull(timeout=60)))
            except BaseException as exc:  # reported below
                problems.append(f"{type(exc).__name__}: {exc}")

        def write() -> int:
            pulling = threading.Thread(target=pull_again_and_again)
            pulling.start()
            try:
                versions = [
                    writer.push(filled(MEGABYTES, number))
                    for number in range(1, self.LARGE_PUSHES + 1)
                ]
            finally:
                stop.set()
                pulling.join(90)
            assert not pulling.is_alive(), "the pulling thread did not finish"
            return versions[-1]

        problems += self._run_readers(url, connect, write, self.LARGE_PUSHES, self.LARGE_READERS)
        assert problems == []
        assert pulled, "the pulling thread pulled nothing"
        assert check_consistent(writer.pull()) == self.LARGE_PUSHES

    def test_readers_never_see_a_mix_while_another_process_writes(
        self,
        make_tables: TableMaker,
        connect: Any,
        connect_options: dict[str, Any],
        backend_cls: type[Backend],
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
