"""shm:// under interrupts, hostile directories, a recreated table, and two writers.

Interrupts are SIGINTs sent to the main thread by a timer thread after a seeded random
delay, while the main thread repeats a call until one lands (``KeyboardInterrupt``), so
they fall at random points of the calls. After thousands of them: no descriptor or file
is left behind, none was closed twice, and the table still reads one whole version.
"""

import gc
import os
import random
import resource
import signal
import stat
import sys
import threading
import time

import pytest
from shm_helpers import BIG, CONTEXT, SMALL, open_fds

import varsync
import varsync_shm
from varsync.backend import check_consistent, filled
from varsync.testing.faults import settled_fds
from varsync_shm import backend as shm_backend

ROUND_SECONDS = 10  # a round waits at most this long for its interrupt to land
IS_ROOT = os.geteuid() == 0
NOBODY = 65534


@pytest.fixture
def url(store_name):
    return f"shm://{store_name}"


class Interrupts:
    """Interrupt repeated calls at seeded random moments, and watch for descriptors
    closed twice: a double close raises in a finalizer (reported as unraisable) or
    closes a file someone else opened (the sentinels, checked after every round)."""

    def __init__(self, seed):
        self.random = random.Random(seed)
        self.landed = 0
        self.unraisable = []
        self._sentinels = []

    def __enter__(self):
        self._hook, sys.unraisablehook = sys.unraisablehook, self.unraisable.append
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-4)  # the timer thread gets the GIL soon after its delay
        return self

    def __exit__(self, *exc_info):
        sys.setswitchinterval(self._interval)
        sys.unraisablehook = self._hook
        for fd, _ in self._sentinels:
            os.close(fd)

    def round(self, call, most_seconds):
        """Repeat ``call`` until a SIGINT sent after up to ``most_seconds`` lands."""
        main = threading.main_thread().ident
        timer = threading.Timer(
            self.random.uniform(0, most_seconds), signal.pthread_kill, (main, signal.SIGINT)
        )
        deadline = time.monotonic() + ROUND_SECONDS
        try:
            timer.start()
            while time.monotonic() < deadline:  # bounded; the interrupt lands long before
                call()
            raise AssertionError(f"no interrupt landed within {ROUND_SECONDS} s")
        except KeyboardInterrupt:
            self.landed += 1
        finally:
            timer.join(ROUND_SECONDS)
        self._check_sentinels()

    def _check_sentinels(self):
        """The last few descriptors opened here still name their files."""
        for fd, inode in self._sentinels:
            assert os.fstat(fd).st_ino == inode, f"descriptor {fd} was closed under its owner"
        fd = os.open(__file__, os.O_RDONLY | os.O_CLOEXEC)  # most likely a number just freed
        self._sentinels.append((fd, os.fstat(fd).st_ino))
        if len(self._sentinels) > 16:
            os.close(self._sentinels.pop(0)[0])


def fill_files(container, table="variables"):
    path = container.table_info(table).details["path"]
    return sorted(f for f in os.listdir(path) if f.startswith((".fill-", ".link-")))


# -- interrupts (issue 11, items 6 and 7) ------------------------------------------------------


@pytest.mark.parametrize("signature", [BIG, SMALL], ids=["mapped", "copied"])
def test_interrupted_pulls_leak_no_descriptor_and_close_none_twice(url, signature):
    with varsync.connect(url) as writer, varsync.connect(url) as reader:
        writer.create_table("variables", signature)
        writer.push(filled(signature, 1))
        kept = []

        def pull():
            kept[:] = [reader.pull()]  # an actor keeps its last pull

        for _ in range(5):  # warm up the mapping caches
            pull()
            writer.push(filled(signature, writer.version() + 1))
        kept.clear()
        gc.collect()
        before = open_fds()
        with Interrupts(seed=6) as interrupts:
            for index in range(1500):
                interrupts.round(pull, most_seconds=0.002)
                if index % 50 == 0:  # new versions: segments retired, spares reused
                    writer.push(filled(signature, writer.version() + 1))
        kept.clear()
        gc.collect()
        assert interrupts.unraisable == [], "a descriptor was closed twice"
        assert settled_fds(before + 2) <= before + 2  # the mapping caches may have turned over
        assert check_consistent(reader.pull()) == writer.version()
        assert writer.push(filled(signature, writer.version() + 1)) == writer.version()
        assert check_consistent(reader.pull()) == writer.version()


@pytest.mark.parametrize("signature", [BIG, SMALL], ids=["mapped", "copied"])
def test_interrupted_pushes_leave_no_fill_file_descriptor_or_lock(url, signature):
    with varsync.connect(url) as writer, varsync.connect(url) as reader:
        writer.create_table("variables", signature)
        returned = [writer.push(filled(signature, 1))]
        attempts = [1]

        def push():
            attempts[0] += 1
            returned.append(writer.push(filled(signature, attempts[0])))

        for _ in range(6):  # warm up the mapping caches of both
            push()
            reader.pull()
        gc.collect()
        before = open_fds()
        with Interrupts(seed=7) as interrupts:
            for _ in range(400):
                interrupts.round(push, most_seconds=0.004)
                held = reader.pull()  # one whole version, of a push made so far
                assert 1 <= check_consistent(held) <= attempts[0]
        assert interrupts.unraisable == []
        assert returned == sorted(set(returned)), "a version was returned twice"
        gc.collect()
        assert settled_fds(before + 2) <= before + 2
        push()  # not blocked by a lock an interrupted push kept, and reclaims its files
        assert check_consistent(reader.pull()) == attempts[0]
        assert reader.version() == returned[-1]
        assert fill_files(writer) == []
        assert len(writer.table_info().details["segments"]) <= 2


def test_interrupted_waits_leak_no_watch(url):
    with varsync.connect(url) as store:
        store.create_table("variables", SMALL)
        version = store.push(filled(SMALL, 1))
        store.wait_for(0, timeout=1)
        before = open_fds()
        with Interrupts(seed=8) as interrupts:
            for _ in range(300):
                interrupts.round(lambda: store.wait_for(version, timeout=5), most_seconds=0.001)
        assert interrupts.unraisable == []
        assert settled_fds(before) <= before
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(version, timeout=0.05)


def _push_stalled_until(url, reached, release, results):
    """Push one version whose fill stops half way until ``release`` is set."""
    from varsync_shm import segment

    real_fill = segment.fill

    def stalled_fill(buffer, plan, arrays):
        reached.set()
        release.wait(60)
        real_fill(buffer, plan, arrays)

    try:
        with varsync.connect(url) as container:
            segment.fill = stalled_fill
            results.put(container.push(filled(BIG, 100)))
    except Exception as exc:  # reported to the parent
        results.put(f"{type(exc).__name__}: {exc}")


def test_pushes_reclaim_dead_writers_files_but_never_a_live_writers(url, children):
    with varsync.connect(url) as store:
        store.create_table("variables", BIG)
        store.push(filled(BIG, 1))
        store.push(filled(BIG, 2))  # a spare now: the child fills it through a mapping
        reached, release, results = CONTEXT.Event(), CONTEXT.Event(), CONTEXT.Queue()
        children(_push_stalled_until, url, reached, release, results)
        assert reached.wait(60), "the writer process did not start filling"
        live = fill_files(store)
        assert len(live) == 1
        for number in range(3, 6):  # these reclaim, and must leave the live fill alone
            store.push(filled(BIG, number))
        assert live[0] in fill_files(store)
        release.set()
        assert results.get(timeout=60) == 6
        assert check_consistent(store.pull()) == 100
        assert fill_files(store) == []


# -- descriptors of kept pulls (item 8) --------------------------------------------------------


def test_kept_mapped_pulls_of_one_version_share_one_descriptor(url):
    with varsync.connect(url) as store:
        store.create_table("variables", BIG)
        store.push(filled(BIG, 1))
        store.pull()
        before = open_fds()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (before + 64, hard))
        try:
            kept = [store.pull() for _ in range(2000)]
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert settled_fds(before + 1) <= before + 1  # the version's pin
        store.push(filled(BIG, 2))
        assert "seg-1" in store.table_info().details["segments"]  # still held, by the pin
        assert all(check_consistent(values) == 1 for values in kept[::100])
        del kept
        gc.collect()
        assert settled_fds(before) <= before
        store.push(filled(BIG, 3))
        assert "seg-1" not in store.table_info().details["segments"]


# -- a table created again with another signature (item 11) ------------------------------------


def test_a_table_recreated_with_another_signature_is_a_reset_for_old_containers(url, store_name):
    with varsync.connect(url) as old:
        old.create_table("variables", BIG)
        old.push(filled(BIG, 1))
        assert old.version() == 1
        varsync_shm.remove_store(store_name)
        with varsync.connect(url) as new:
            new.create_table("variables", SMALL)
            new.push(filled(SMALL, 7))
            calls = {
                "push": lambda: old.push(filled(BIG, 2)),
                "pull": lambda: old.pull(timeout=1),
                "pull_if_newer": lambda: old.pull_if_newer(1),
                "wait_for": lambda: old.wait_for(1, timeout=1),
                "version": lambda: old.version(),
                "update": lambda: old.update(filled(BIG, 0)),
            }
            refused = r"'variables'.*another signature.*connect again"
            for call in calls.values():
                with pytest.raises(varsync.TableResetError, match=refused):
                    call()
            assert new.version() == 1
            assert check_consistent(new.pull()) == 7  # nothing published
        with varsync.connect(url) as again:
            assert check_consistent(again.pull()) == 7


def test_a_table_recreated_with_the_same_signature_is_no_reset_for_pull(url, store_name):
    with varsync.connect(url) as old:
        old.create_table("variables", SMALL)
        old.push(filled(SMALL, 1))
        old.push(filled(SMALL, 2))
        varsync_shm.remove_store(store_name)
        with varsync.connect(url) as new:
            new.create_table("variables", SMALL)
            new.push(filled(SMALL, 5))
        assert check_consistent(old.pull()) == 5
        with pytest.raises(varsync.TableResetError):
            old.pull_if_newer(2)  # the version it holds means nothing now
        assert old.push(filled(SMALL, 6)) == 2


def test_holders_of_a_version_see_a_reset_even_when_the_new_history_is_further_on(url, store_name):
    with varsync.connect(url) as old, varsync.connect(url) as reader:
        old.create_table("variables", SMALL)
        old.push(filled(SMALL, 1))
        old.push(filled(SMALL, 2))
        assert check_consistent(reader.pull()) == 2
        varsync_shm.remove_store(store_name)
        with varsync.connect(url) as new:
            new.create_table("variables", SMALL)
            for number in (5, 6, 7):  # version 3: above the held 2, but of another history
                new.push(filled(SMALL, number))
        for holder in (old, reader):
            with pytest.raises(varsync.TableResetError, match=r"'variables'.*new history"):
                holder.pull_if_newer(2)
        assert check_consistent(reader.pull()) == 7  # pull() resynchronises
        assert reader.pull_if_newer(3) is None


def test_a_wait_by_a_holder_of_the_old_history_is_a_reset_not_a_timeout(url, store_name):
    with varsync.connect(url) as reader:
        with varsync.connect(url) as old:
            old.create_table("variables", SMALL)
            old.push(filled(SMALL, 1))
        assert check_consistent(reader.pull()) == 1
        varsync_shm.remove_store(store_name)
        with varsync.connect(url) as new:
            new.create_table("variables", SMALL)
            new.push(filled(SMALL, 9))  # version 1 again, of another history
        with pytest.raises(varsync.TableResetError, match=r"'variables'.*new history"):
            reader.wait_for(1, timeout=60)


def test_a_writer_of_a_recreated_table_publishes_nothing_of_the_old_layout(url, store_name):
    with varsync.connect(url) as old, varsync.connect(url) as other:
        old.create_table("variables", BIG)
        old.push(filled(BIG, 1))
        varsync_shm.remove_store(store_name)
        other.create_table("fresh", SMALL)  # the store exists again; "variables" does not
        with pytest.raises(varsync.BackendConnectionError, match="create_table"):
            old.push(filled(BIG, 2))
        assert other.tables() == ["fresh"]


# -- timeout=0 (item 12) ------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["inotify", "polling"])
def test_wait_with_timeout_0_checks_once_and_does_not_wait(url, engine, monkeypatch):
    if engine == "polling":  # as where inotify is missing or exhausted
        monkeypatch.setattr(shm_backend.Watch, "open", classmethod(lambda cls, *a, **k: None))
    with varsync.connect(url) as store:
        store.create_table("variables", SMALL)
        started = time.monotonic()
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(0, timeout=0)
        store.push(filled(SMALL, 1))
        assert store.wait_for(0, timeout=0) == 1
        with pytest.raises(varsync.PullTimeoutError):
            store.wait_for(1, timeout=0)
        assert time.monotonic() - started < 5  # far below any wait (the default is 30 s)


# -- names that are not text (item 15) -----------------------------------------------------------


def test_store_names_that_are_not_valid_text_are_configuration_errors(url):
    for bad in ("shm://a\udc80b", "shm://\ud800", "shm://%ED%A0%80", "shm://ok%FF"):
        with pytest.raises(varsync.ConfigurationError, match="valid"):
            varsync.connect(bad)  # the core may refuse the first two before the plugin
        with pytest.raises(varsync.ConfigurationError, match="not valid text"):
            shm_backend.ShmBackend(bad, timeout=1.0, namespace="")
    for bad in ("\ud800", "x\udfff"):
        with pytest.raises(varsync.ConfigurationError, match="not valid text"):
            varsync_shm.remove_store(bad)
        with pytest.raises(varsync.ConfigurationError, match="not valid text"):
            varsync_shm.store_path(bad)
    with pytest.raises(varsync.ConfigurationError, match="not a directory"):
        varsync.connect(url, root="/dev/shm/\ud800")


# -- directories (item 5) -------------------------------------------------------------------------


def _modes(store_name):
    store = varsync_shm.store_path(store_name)
    namespace = os.path.join(store, "n_")
    table = os.path.join(namespace, "t_variables")
    return [stat.S_IMODE(os.lstat(p).st_mode) for p in (store, namespace, table)]


@pytest.mark.parametrize("umask", [0o022, 0o000, 0o077])
def test_every_directory_of_a_store_is_made_private_whatever_the_umask(url, store_name, umask):
    previous = os.umask(umask)
    try:
        with varsync.connect(url) as store:
            store.create_table("variables", SMALL)
            store.push(filled(SMALL, 1))
    finally:
        os.umask(previous)
    assert _modes(store_name) == [0o700, 0o700, 0o700]


@pytest.mark.skipif(not IS_ROOT, reason="needs root to make a directory of another user")
def test_a_store_planted_by_another_user_is_refused(url, store_name):
    path = varsync_shm.store_path(store_name)
    with varsync.connect(url) as planter:  # what another user's process would make
        planter.create_table("variables", SMALL)
        planter.push(filled(SMALL, 666))
    for root, dirs, files in os.walk(path):
        for name in [root] + [os.path.join(root, f) for f in dirs + files]:
            os.chown(name, NOBODY, NOBODY)
    os.chmod(path, 0o777)
    with varsync.connect(url) as victim:
        refused = rf"{path} is owned by uid {NOBODY}.*mode 0777"
        for call in (
            lambda: victim.pull(timeout=1),
            lambda: victim.create_table("variables", SMALL),
            victim.tables,
        ):
            with pytest.raises(varsync.ConfigurationError, match=refused):
                call()


@pytest.mark.parametrize("level", ["store", "namespace", "table"])
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_directories_others_can_write_to_are_refused(url, store_name, level, mode):
    with varsync.connect(url) as store:
        store.create_table("variables", SMALL)
        store.push(filled(SMALL, 1))
    path = varsync_shm.store_path(store_name)
    path = {
        "store": path,
        "namespace": os.path.join(path, "n_"),
        "table": os.path.join(path, "n_", "t_variables"),
    }[level]
    os.chmod(path, mode)
    with varsync.connect(url) as store:
        refused = rf"{path} has mode {mode:04o}.*chmod 700"
        with pytest.raises(varsync.ConfigurationError, match=refused):
            store.pull()
        os.chmod(path, 0o750)  # readable by others is the owner's choice; writable is not
        assert check_consistent(store.pull()) == 1


@pytest.mark.parametrize("level", ["store", "namespace"])
def test_a_symbolic_link_in_place_of_a_directory_is_refused(url, store_name, level):
    store_path = varsync_shm.store_path(store_name)
    elsewhere = f"{store_name}-elsewhere"
    try:
        with varsync.connect(f"shm://{elsewhere}") as real:
            real.create_table("variables", SMALL)  # a real table, where the link leads
            real.push(filled(SMALL, 9))
        if level == "store":
            link, target = store_path, varsync_shm.store_path(elsewhere)
        else:
            os.mkdir(store_path, 0o700)
            link, target = os.path.join(store_path, "n_"), varsync_shm.store_path(elsewhere) + "/n_"
        os.symlink(target, link)
        with varsync.connect(url) as store:
            with pytest.raises(varsync.ConfigurationError, match=rf"{link} is a symbolic link"):
                store.pull(timeout=1)
            with pytest.raises(varsync.ConfigurationError, match="symbolic link"):
                store.create_table("variables", SMALL)
    finally:
        if os.path.islink(store_path):
            os.unlink(store_path)
        varsync_shm.remove_store(elsewhere)


def test_a_root_others_can_replace_stores_in_is_refused(store_name):
    root = varsync_shm.store_path(store_name)  # removed with the store
    os.mkdir(root, 0o700)
    os.chmod(root, 0o777)
    with pytest.raises(varsync.ConfigurationError, match="not sticky"):
        varsync.connect(f"shm://x?root={root}")
    os.chmod(root, 0o1777)  # sticky, as /dev/shm: others cannot rename what is ours
    with varsync.connect(f"shm://x?root={root}") as store:
        store.create_table("variables", SMALL)


# -- two writer processes --------------------------------------------------------------------------


def _push_many(url, first, count, start, results):
    versions = []
    try:
        with varsync.connect(url) as container:
            container.version()
            start.wait(60)
            for number in range(first, first + count):
                versions.append(container.push(filled(BIG, number)))
        results.put((first, versions, None))
    except Exception as exc:  # reported to the parent
        results.put((first, versions, f"{type(exc).__name__}: {exc}"))


def test_two_writer_processes_never_get_the_same_version(url, children):
    count = 150
    with varsync.connect(url) as store:
        store.create_table("variables", BIG)
        start, results = CONTEXT.Barrier(2), CONTEXT.Queue()
        for first in (1, 1001):
            children(_push_many, url, first, count, start, results)
        reports = [results.get(timeout=180) for _ in range(2)]
        returned = []
        for first, versions, error in reports:
            assert error is None, f"writer {first}: {error}"
            assert versions == sorted(versions)
            returned += versions
        assert sorted(returned) == list(range(1, 2 * count + 1))  # each number once
        assert store.version() == 2 * count
        number = check_consistent(store.pull())
        assert number in (count, 1000 + count)
        assert fill_files(store) == []
