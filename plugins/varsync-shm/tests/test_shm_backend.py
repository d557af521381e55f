"""What is particular to shm://: processes that crash, segments that must be reclaimed,
readers in other processes, and waiting without spinning.

Child processes are started with "spawn" and synchronised with events and queues; every
wait is bounded and every child is stopped.
"""

import fcntl
import gc
import os
import signal
import stat
import threading
import time

import numpy as np
import pytest
from shm_helpers import BIG, CONTEXT, LAYOUTS, SMALL

import varsync
import varsync_shm
from varsync.backend import check_consistent, filled
from varsync_shm import segment
from varsync_shm._inotify import Watch


@pytest.fixture
def url(store_name):
    return f"shm://{store_name}"


@pytest.fixture
def store(url):
    with varsync.connect(url) as container:
        container.create_table("variables", BIG)
        yield container


def files_of(store, table="variables"):
    return sorted(os.listdir(store.table_info(table).details["path"]))


def segments_of(store, table="variables"):
    return store.table_info(table).details["segments"]


def kill(child):
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert child.exitcode == -signal.SIGKILL


def released(path, seconds=30.0):
    """Whether a flock on ``path`` held by another process is gone within ``seconds``
    (an exclusive one taken here, then dropped). A killed process's locks can outlive
    its reaping by a moment: the kernel may close the file of a mapping it held
    asynchronously, so a dead holder's lock is waited for, not assumed gone."""
    fd = os.open(path, os.O_RDONLY)
    taken = threading.Event()

    def take():
        fcntl.flock(fd, fcntl.LOCK_EX)
        taken.set()

    threading.Thread(target=take, daemon=True).start()
    if not taken.wait(seconds):
        return False  # the thread stays blocked; the test fails on this anyway
    os.close(fd)  # drops the lock
    return True


# -- children (module level, so that "spawn" can import them) ---------------------------


def _read_until(url, signature, last, ready, results):
    """Pull until version ``last``: every pull is one version, and arrays already pulled
    never change while later versions arrive."""
    problems, reads, held = [], 0, None
    try:
        with varsync.connect(url) as container:
            ready.set()
            version, deadline = 0, time.monotonic() + 60
            while version < last and time.monotonic() < deadline:
                got = container.pull_if_newer(version)
                if got is None:
                    container.wait_for(version, timeout=10)
                    continue
                new_version, values = got
                if new_version <= version:
                    problems.append(f"version went from {version} to {new_version}")
                if check_consistent(values) != new_version:
                    problems.append(f"version {new_version} held {check_consistent(values)}")
                if held is not None and check_consistent(held[1]) != held[0]:
                    problems.append(f"arrays of version {held[0]} changed after a later pull")
                held, version, reads = (new_version, values), new_version, reads + 1
            if version != last:
                problems.append(f"stopped at version {version}, expected {last}")
    except Exception as exc:  # reported to the parent
        problems.append(f"{type(exc).__name__}: {exc}")
    results.put((reads, problems))


def _push_then_stall(url, reached, release):
    """Push versions 1 and 2, then die (when killed) half way through filling version 3."""
    real_fill = segment.fill

    def stalled_fill(buffer, plan, arrays):
        memory = np.frombuffer(buffer, np.uint8)
        memory[: len(plan.head)] = np.frombuffer(plan.head, np.uint8)
        first = plan.leaves[0]
        memory[first.offset : first.offset + first.nbytes] = arrays[0].reshape(-1).view(np.uint8)
        reached.set()
        release.wait(60)  # the parent kills this process long before
        real_fill(buffer, plan, arrays)

    with varsync.connect(url) as container:
        container.push(filled(BIG, 1))
        container.push(filled(BIG, 2))
        segment.fill = stalled_fill
        container.push(filled(BIG, 3))


def _push_forever(url, pushed):
    """Push version after version, each filled with its own version number."""
    with varsync.connect(url) as container:
        start = container.version()
        for number in range(start + 1, start + 2001):
            assert container.push(filled(BIG, number)) == number
            pushed.put(number)


def _pull_and_hold(url, holding):
    with varsync.connect(url) as container:
        values = container.pull()  # maps seg-1 and holds its shared lock
        holding.set()
        container.wait_for(1, timeout=60)  # killed while blocked here
        del values


def _push_when_told(url, go):
    go.wait(30)
    with varsync.connect(url) as container:
        container.push(filled(BIG, 2))


# -- registration -------------------------------------------------------------------------


def test_installing_the_package_registers_shm_through_its_entry_point():
    entries = {entry.scheme: entry for entry in varsync.available_backends()}
    assert entries["shm"].source == f"varsync-shm {varsync_shm.__version__}"
    assert entries["shm"].installed
    assert entries["shm"].target == "varsync_shm.backend:ShmBackend"


# -- readers in other processes --------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
def test_readers_in_other_processes_never_see_a_mix_of_two_versions(url, children, kind):
    signature, pushes = LAYOUTS[kind], 80
    with varsync.connect(url) as writer:
        writer.create_table("variables", signature)
        writer.push(filled(signature, 1))
        results = CONTEXT.Queue()
        readies = [CONTEXT.Event() for _ in range(2)]
        for ready in readies:
            children(_read_until, url, signature, pushes, ready, results)
        for ready in readies:
            assert ready.wait(60), "a reader process did not start"
        for number in range(2, pushes + 1):
            writer.push(filled(signature, number))
        outcomes = [results.get(timeout=90) for _ in readies]
    for reads, problems in outcomes:
        assert problems == []
        assert reads >= 1


def test_a_reader_keeps_its_version_while_writers_go_on(store):
    store.push(filled(BIG, 1))
    held = store.pull()
    for number in range(2, 7):  # the reader's shared lock does not hold writers up
        assert store.push(filled(BIG, number)) == number
    assert check_consistent(held) == 1  # its segment was not reused under it
    assert "seg-1" in segments_of(store)
    del held
    gc.collect()
    store.push(filled(BIG, 7))
    assert "seg-1" not in segments_of(store)
    assert check_consistent(store.pull()) == 7


def test_any_view_of_a_pulled_array_keeps_its_version_in_place(store):
    store.push(filled(BIG, 1))
    piece = store.pull()["b"][0][10:20]  # the nest and its other leaves are garbage now
    gc.collect()
    for number in range(2, 6):
        store.push(filled(BIG, number))
    assert "seg-1" in segments_of(store)
    assert piece.tolist() == [1.0] * 10
    del piece
    gc.collect()
    store.push(filled(BIG, 6))
    assert "seg-1" not in segments_of(store)


# -- reclamation ---------------------------------------------------------------------------


def test_old_segments_are_reclaimed_and_their_pages_reused(store):
    size = segment.plan(varsync.flatten(BIG)).size
    for number in range(1, 31):
        store.push(filled(BIG, number))
        assert check_consistent(store.pull()) == number
        segments = segments_of(store)
        assert segments[0] == f"seg-{number}"
        assert len(segments) <= 2
        assert all(s.startswith("spare-") for s in segments[1:])
        assert store.table_info().details["bytes_in_shm"] <= 2 * size + 64 * 1024
    assert files_of(store)[:3] == ["current", "lock", f"seg-{30}"]


def test_deleted_segments_do_not_stay_mapped(store):
    """Pulls and pushes keep the mappings of recent segments (so the next ones skip the
    page faults), but never hold on to a deleted segment's memory."""
    table = store.table_info().details["path"]

    def mapped(deleted):
        with open("/proc/self/maps") as maps:
            return {
                line.split()[5]
                for line in maps
                if table in line and line.rstrip().endswith("(deleted)") == deleted
            }

    store.push(filled(BIG, 1))
    held = store.pull()
    store.push(filled(BIG, 2))
    store.push(filled(BIG, 3))  # seg-1 stays (held); seg-2 turns spare
    kept = store.pull()
    store.push(filled(BIG, 4))  # the spare is refilled: its mapping is reused
    assert len(mapped(deleted=False)) <= 3  # seg-1 (held), seg-3 (held), seg-4
    del held
    store.push(filled(BIG, 5))  # seg-1 is free again: turned spare or deleted
    del kept
    for number in range(6, 9):
        store.push(filled(BIG, number))
        assert check_consistent(store.pull()) == number
    assert mapped(deleted=True) == set()
    assert len(mapped(deleted=False)) <= 2  # the current segment and the spare


def test_pulled_arrays_are_read_only_views_that_cannot_be_made_writable(url):
    with varsync.connect(url) as store:
        for name, signature in LAYOUTS.items():
            store.create_table(name, signature)
            store.push(filled(signature, 3), table=name)
            for leaf in varsync.flatten(store.pull(name)):
                assert not leaf.flags.writeable
                with pytest.raises(ValueError, match="WRITEABLE"):
                    leaf.flags.writeable = True


# -- crashes -------------------------------------------------------------------------------


def test_a_writer_killed_mid_push_leaves_the_last_complete_version_readable(store, url, children):
    reached, release = CONTEXT.Event(), CONTEXT.Event()
    child = children(_push_then_stall, url, reached, release)
    assert reached.wait(60), "the writer process did not reach the middle of its push"
    assert any(f.startswith(".fill-") for f in files_of(store)), "no half-written segment"
    kill(child)

    assert store.version() == 2
    assert check_consistent(store.pull()) == 2
    assert store.push(filled(BIG, 3)) == 3  # the dead writer holds no lock
    assert check_consistent(store.pull()) == 3
    assert not any(f.startswith(".fill-") for f in files_of(store))
    assert len(segments_of(store)) <= 2


def test_a_writer_killed_at_an_arbitrary_moment_leaves_a_complete_version(store, url, children):
    for _ in range(2):
        pushed = CONTEXT.Queue()
        child = children(_push_forever, url, pushed)
        first = number = pushed.get(timeout=60)
        while number < first + 2:  # bounded by the queue's timeout
            number = pushed.get(timeout=60)
        kill(child)  # most likely while it fills the next version
        version = store.version()
        assert version >= number
        assert check_consistent(store.pull()) == version
        assert store.push(filled(BIG, version + 1)) == version + 1
        assert check_consistent(store.pull()) == version + 1
        assert not any(f.startswith((".fill-", ".link-")) for f in files_of(store))
        assert len(segments_of(store)) <= 2


def test_a_killed_reader_leaves_nothing_locked(store, url, children):
    store.push(filled(BIG, 1))
    holding = CONTEXT.Event()
    child = children(_pull_and_hold, url, holding)
    assert holding.wait(60), "the reader process did not pull"
    kill(child)
    segment_file = os.path.join(store.table_info().details["path"], "seg-1")
    assert released(segment_file), "the killed reader's lock on seg-1 stayed"

    assert store.push(filled(BIG, 2)) == 2
    # The dead reader's lock on seg-1 is gone: the push could reclaim it at once.
    assert segments_of(store)[0] == "seg-2"
    assert "seg-1" not in segments_of(store)
    assert len(segments_of(store)) == 2  # seg-2 and seg-1 turned spare
    assert store.push(filled(BIG, 3)) == 3  # and reuse it
    assert check_consistent(store.pull()) == 3


# -- waiting ---------------------------------------------------------------------------------


def test_wait_for_wakes_when_another_process_pushes(store, url, children):
    store.push(filled(BIG, 1))
    go = CONTEXT.Event()
    children(_push_when_told, url, go)
    go.set()
    assert store.wait_for(1, timeout=60) == 2
    assert check_consistent(store.pull()) == 2


def test_wait_for_sleeps_on_an_inotify_watch_instead_of_spinning(store):
    table = store.table_info().details["path"]
    watch = Watch.open(table)
    assert watch is not None, "inotify should be usable on Linux"
    watch.close()
    store.push(filled(BIG, 1))
    cpu = {}

    def wait():
        started = time.thread_time()
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(1, timeout=1.0)
        cpu["seconds"] = time.thread_time() - started

    thread = threading.Thread(target=wait)
    thread.start()
    thread.join(30)
    assert cpu["seconds"] < 0.25  # a spinning wait would burn the whole second


@pytest.mark.parametrize("engine", ["inotify", "polling"])
def test_wait_for_wakes_on_a_push_without_spinning(store, url, engine, monkeypatch):
    if engine == "polling":  # as where inotify is missing or exhausted
        monkeypatch.setattr(Watch, "open", classmethod(lambda cls, *a, **k: None))
    store.push(filled(BIG, 1))
    woken = {}

    def wait():
        started = time.thread_time()
        woken["version"] = store.wait_for(1, timeout=60)
        woken["cpu"] = time.thread_time() - started

    thread = threading.Thread(target=wait)
    thread.start()
    with varsync.connect(url) as pusher:
        pusher.push(filled(BIG, 2))
    thread.join(60)
    assert woken["version"] == 2
    assert woken["cpu"] < 0.25  # a spinning wait burns its thread's whole wait


def test_block_returns_at_once_when_the_version_already_differs(store):
    store.push(filled(BIG, 1))
    deadline = time.monotonic() + 600
    thread = threading.Thread(target=store.backend.block, args=("variables", 0, deadline))
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "block slept although the table was past version 0"


def test_a_deleted_table_reads_as_empty_until_it_is_made_again(store, store_name, url):
    store.push(filled(BIG, 1))
    varsync_shm.remove_store(store_name)
    with pytest.raises(varsync.TableResetError):  # a holder of version 1 is told at once
        store.wait_for(1, timeout=60)
    with pytest.raises(varsync.PullTimeoutError, match="stayed at version 0"):
        store.wait_for(0, timeout=0.3)  # a wait for a first push waits, boundedly
    with varsync.connect(url) as again:
        again.create_table("variables", BIG)
        waiter = threading.Thread(target=lambda: woken.append(store.wait_for(0, timeout=60)))
        woken: list = []
        waiter.start()
        again.push(filled(BIG, 7))
        waiter.join(60)
    assert woken == [1]


# -- stores, namespaces, files ---------------------------------------------------------------


def test_stores_and_namespaces_are_separate(url):
    other = url[len("shm://") :] + "-other"
    try:
        with (
            varsync.connect(url) as a,
            varsync.connect(url, namespace="b") as b,
            varsync.connect(f"shm://{other}") as c,
        ):
            a.create_table("variables", SMALL)
            assert b.tables() == []
            assert c.tables() == []
            b.create_table("variables", {"x": varsync.Spec((2,), "int8")})
            assert a.push(filled(SMALL, 4)) == 1
            assert b.version() == 0
            assert varsync.flatten(b.signature()) == [varsync.Spec((2,), "int8")]
    finally:
        varsync_shm.remove_store(other)


def test_any_table_name_is_a_safe_file_name(url):
    with varsync.connect(url) as store:
        for name in ("../escape", ".", "a/b", "ünï cødé", "%2F"):
            store.create_table(name, SMALL)
            store.push(filled(SMALL, 2), table=name)
        assert store.tables() == sorted(["../escape", ".", "a/b", "ünï cødé", "%2F"])
        assert all(
            os.path.dirname(store.table_info(n).details["path"]).endswith("/n_")
            for n in store.tables()
        )
        with pytest.raises(varsync.ConfigurationError, match="too long"):
            store.create_table("x" * 300, SMALL)


def test_files_are_private_to_the_user(store):
    store.push(filled(BIG, 1))
    table = store.table_info().details["path"]
    assert stat.S_IMODE(os.stat(table).st_mode) == 0o700
    for name in ("seg-1", "signature.json", "lock"):
        assert stat.S_IMODE(os.stat(os.path.join(table, name)).st_mode) == 0o600


def test_remove_store_deletes_every_file(url):
    store_name = url[len("shm://") :]
    with varsync.connect(url) as store:
        store.create_table("variables", SMALL)
        store.push(filled(SMALL, 1))
    assert os.path.isdir(varsync_shm.store_path(store_name))
    assert varsync_shm.remove_store(store_name) is True
    assert not os.path.exists(varsync_shm.store_path(store_name))
    assert varsync_shm.remove_store(store_name) is False


# -- errors --------------------------------------------------------------------------------


def test_bad_urls_and_options_are_configuration_errors(url, tmp_path):
    with pytest.raises(varsync.ConfigurationError, match="shm://<store>"):
        varsync.connect("shm://")
    with pytest.raises(varsync.ConfigurationError, match="not a directory"):
        varsync.connect(f"{url}?root={tmp_path / 'missing'}")
    with pytest.raises(varsync.ConfigurationError, match=r"bogus.*its options are root"):
        varsync.connect(f"{url}?bogus=1")


def test_a_store_under_another_root(tmp_path):
    with varsync.connect(f"shm://elsewhere?root={tmp_path}") as store:
        store.create_table("variables", SMALL)
        store.push(filled(SMALL, 5))
        assert check_consistent(store.pull()) == 5
    assert os.path.isdir(varsync_shm.store_path("elsewhere", str(tmp_path)))


def test_damaged_files_are_reported_as_corrupt_data(store):
    store.push(filled(BIG, 1))
    table = store.table_info().details["path"]
    with open(os.path.join(table, "seg-1"), "r+b") as f:
        f.write(b"NOTASEGM")
    with pytest.raises(varsync.CorruptDataError, match="not a varsync-shm segment"):
        store.pull()
    os.replace(os.path.join(table, "seg-1"), os.path.join(table, "elsewhere"))
    with pytest.raises(varsync.CorruptDataError, match="missing"):
        store.pull()
    os.unlink(os.path.join(table, "current"))
    os.symlink("not-a-segment", os.path.join(table, "current"))
    with pytest.raises(varsync.CorruptDataError, match="not a segment"):
        store.version()
