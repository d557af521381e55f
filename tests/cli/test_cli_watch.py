"""``varsync watch``: the view ``--once`` prints, its errors, Ctrl-C when piped, and the live
view in a real terminal (tmux, on a private socket) while a writer pushes."""

import contextlib
import json
import math
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import numpy as np
import pytest

import varsync
from varsync import cli
from varsync.cli.watch import Watcher
from varsync._readers import history_key

# tox.ini's tf and modern environments install the extra: there a missing one fails.
if os.environ.get("TOX_ENV_NAME") in ("tf", "modern"):
    import rich  # noqa: F401
else:
    pytest.importorskip("rich")

SIGNATURE = {
    "policy": [varsync.Spec((64, 32), "float32"), varsync.Spec((32,), "float32")],
    "train_step": varsync.Spec((), "int64"),
}


def values(step):
    return {"policy": [np.full((64, 32), step, np.float32), np.zeros(32, np.float32)],
            "train_step": step}


@pytest.fixture
def run(capsys):
    """``run(*argv) -> (exit status, stdout, stderr)`` of ``varsync argv...``."""

    def _run(*argv):
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return _run


@pytest.fixture
def store():
    """A memory:// store: "variables" at version 3, "stats" empty (main() runs in-process)."""
    with varsync.connect(f"memory://watch-{uuid.uuid4().hex}") as store:
        store.create_table("variables", SIGNATURE)
        store.create_table("stats", {"mean": varsync.Spec((3,), "float64")})
        for step in (1, 2, 3):
            store.push(values(step))
        yield store


def row(out, table):
    """The cells of ``table``'s row in the first table of the view."""
    for line in out.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line)]
        if cells and cells[0] == table:
            return cells
    raise AssertionError(f"no row for {table!r} in:\n{out}")


def no_readers(monkeypatch, how):
    if how == "absent":  # a varsync older than the reader registry
        monkeypatch.delattr(varsync.VariableContainer, "readers", raising=False)
    else:
        def refuse(self, table="variables"):
            raise varsync.UnsupportedError("keeps no reader registry")

        monkeypatch.setattr(varsync.VariableContainer, "readers", refuse, raising=False)


# -- --once -----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["unsupported", "absent"])
def test_once_shows_every_table_with_version_leaves_size_and_no_readers(run, store, monkeypatch,
                                                                        how):
    no_readers(monkeypatch, how)
    code, out, err = run("watch", store.backend.url, "--once", "--interval", "0.05")
    assert (code, err) == (0, "")
    assert out.splitlines()[0].startswith(f"{store.backend.url}  (MemoryBackend, 2 tables)")
    header = row(out, "TABLE")
    assert header == ["TABLE", "VERSION", "PUSHES/S", "LEAVES", "SIZE", "READERS", "MAX LAG"]
    assert row(out, "variables") == ["variables", "3", "0.0", "3", "8.1 KiB", "n/a", "n/a"]
    assert row(out, "stats") == ["stats", "empty", "0.0", "1", "24 B", "n/a", "n/a"]


def test_once_lists_the_readers_with_their_lag(run, store):
    if not store.backend.supports_reader_registry:
        pytest.skip("this memory backend keeps no reader registry yet")
    with varsync.connect(store.backend.url) as actor:
        actor.report_as("actor-1")
        actor.pull()
        store.wait_for_readers(3, 1, timeout=10)
        store.push(values(4))
        store.push(values(5))
        code, out, err = run("watch", store.backend.url, "--once", "--interval", "0.05",
                             "--table", "variables")
    assert (code, err) == (0, "")
    assert row(out, "variables")[5:] == ["1", "2"]  # one reader, 5 - 3 versions behind
    lines = [line for line in out.splitlines() if "actor-1" in line]
    assert len(lines) == 1
    cells = [c.strip() for c in re.split(r"[│|]", lines[0])]
    assert cells[:2] == ["variables", "actor-1"] and cells[3:5] == ["3", "2"]


def test_only_the_tables_asked_for_are_shown(run, store):
    code, out, _ = run("watch", store.backend.url, "--once", "--interval", "0.05", "-t", "stats")
    assert code == 0 and "(MemoryBackend, 1 table)" in out
    row(out, "stats")
    with pytest.raises(AssertionError):
        row(out, "variables")


def test_the_push_rate_is_versions_per_second_over_the_window_and_a_reset_is_named(store):
    watcher = Watcher(store, ["variables"])
    assert watcher.look()[0].rate is None  # one look: no window yet
    for step in (4, 5, 6, 7):
        store.push(values(step))
    view = watcher.look()[0]
    assert view.version == 7 and view.rate is not None and view.rate > 0
    watcher._last["variables"] = (99, watcher._last["variables"][1] - 1.0)  # as if it was 99
    view = watcher.look()[0]
    assert view.reset and view.rate is None


# -- strings from the store ------------------------------------------------------------

MARKUP = ["[/]", "[bold]x[/bold]"]
#: clears the screen, sets the window title (ESC ] ... BEL), returns the carriage, and
#: starts a CSI in its one-byte C1 form
HOSTILE = "evil\x1b[2J\x1b]0;pwned\x07\r\x9bend"
#: any C0 control but the newline, DEL, or C1 control
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def interrupt_cleanly(process):
    """Ctrl-C a running ``varsync watch``: it must end with status 0 and no traceback."""
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)
    err = process.stderr.read()  # stdout is the pump's: read stderr only
    assert process.returncode == 0, err
    assert "Traceback" not in err


def kill_if_running(process):
    """After a test that failed before its Ctrl-C: stop the command anyway."""
    if process.poll() is None:
        process.kill()
        process.wait()


def report(store, table, reader, host="node-1", version=3):
    """Put ``reader``'s entry for ``table`` in the store's reader registry as any client
    that can write there could (another varsync, or a hostile one): straight through the
    backend, whatever ``report_as`` would accept."""
    if not store.backend.supports_reader_registry:
        pytest.skip(f"{type(store.backend).__name__} keeps no reader registry")
    now = time.time()
    epoch = history_key(store.backend.head(table, math.inf).epoch)  # listed: of its history
    record = json.dumps({"host": host, "pid": 1, "version": version, "at": now,
                         "reported": now, "expires": now + 60, "epoch": epoch})
    store.backend.report_reader(table, reader, record, 60, math.inf)


def reader_rows(out):
    """The (table, reader, host) cells of each line of the readers' table."""
    rows = set()
    for line in out.splitlines():
        cells = [c.strip() for c in re.split(r"[│|]", line)]
        if len(cells) == 6:
            rows.add(tuple(cells[:3]))
    return rows


def test_markup_in_table_names_reader_ids_and_hosts_is_shown_literally(run, store):
    for name in MARKUP:
        store.create_table(name, {"mean": varsync.Spec((3,), "float64")})
        for reader in MARKUP:
            report(store, name, reader, host="[red]node[/red]", version=0)
    tables = [arg for name in MARKUP for arg in ("--table", name)]
    code, out, err = run("watch", store.backend.url, "--once", "--interval", "0.05", *tables)
    assert (code, err) == (0, "")
    for name in MARKUP:
        assert row(out, name) == [name, "empty", "0.0", "1", "24 B", "2", "0"]
    assert reader_rows(out) == {(name, reader, "[red]node[/red]")
                                for name in MARKUP for reader in MARKUP}


def test_control_characters_in_reader_ids_and_hosts_are_shown_escaped_never_sent_raw(
    run, store,
):
    report(store, "variables", HOSTILE, host="node\x1b]0;host\x07\u202e")
    code, out, err = run("watch", store.backend.url, "--once", "--interval", "0.05")
    assert (code, err) == (0, "")
    assert RAW_CONTROL.search(out) is None and "\u202e" not in out, ascii(out)
    assert reader_rows(out) == {
        ("variables", r"evil\x1b[2J\x1b]0;pwned\x07\r\x9bend", r"node\x1b]0;host\x07\u202e")
    }


def test_a_piped_live_watch_shows_stored_strings_as_escaped_text_too(redis_namespace):
    url = redis_namespace()
    with varsync.connect(url) as writer:
        writer.create_table("[/]", SIGNATURE)
        writer.push(values(1), "[/]")
        report(writer, "[/]", HOSTILE)
        process = subprocess.Popen(
            [sys.executable, "-m", "varsync.cli", "watch", url, "--interval", "0.1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8",
            env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        )
        try:
            lines = lines_of(process)
            line = next_line_with(lines, "pwned")
            assert RAW_CONTROL.search(line) is None, ascii(line)
            assert reader_rows(line) == {("[/]", r"evil\x1b[2J\x1b]0;pwned\x07\r\x9bend",
                                          "node-1")}
            interrupt_cleanly(process)
        finally:
            kill_if_running(process)


# -- errors -----------------------------------------------------------------------------


def test_a_bad_url_is_the_usual_one_line_error(run):
    code, out, err = run("watch", "not-a-url", "--once")
    assert code == 1 and out == ""
    assert err.startswith("varsync: error: 'not-a-url' is not a varsync URL")
    assert err.count("\n") == 1


def test_an_unknown_table_is_an_error_naming_the_tables(run, store):
    code, _, err = run("watch", store.backend.url, "--once", "--table", "nope")
    assert code == 1 and "no table 'nope'" in err and "variables" in err


@pytest.mark.parametrize("interval", ["0", "-1", "soon", "nan"])
def test_a_bad_interval_does_not_parse(run, interval):
    code, _, err = run("watch", "memory://x", "--interval", interval)
    assert code == 2 and "--interval" in err


def test_without_rich_the_error_names_the_extra_to_install():
    script = textwrap.dedent(
        """
        import sys
        sys.modules["rich"] = None  # as if not installed
        from varsync import cli
        sys.exit(cli.main(["watch", "memory://norich", "--once"]))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1, result.stderr
    assert 'pip install "varsync[watch]"' in result.stderr and "Traceback" not in result.stderr


def test_ctrl_c_ends_a_piped_watch_with_status_0_and_no_traceback():
    process = subprocess.Popen(
        [sys.executable, "-m", "varsync.cli", "watch", "memory://piped", "--interval", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = process.stdout.readline()
        assert first.startswith("memory://piped  (MemoryBackend, 0 tables)")
        assert process.stdout.readline() == "(no tables)\n"
        assert process.stdout.readline() == "\n"  # the first view is out: the loop runs
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def lines_of(process):
    """A queue that receives ``process``'s stdout line by line (``None`` at its end)."""
    lines = queue.Queue()

    def pump():
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def next_line_with(lines, text, seconds=30.0):
    deadline = time.monotonic() + seconds
    seen = []
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            line = None
        if line is None:
            raise AssertionError(f"{text!r} not printed; got:\n{''.join(seen)}")
        seen.append(line)
        if text in line:
            return line


def test_a_server_that_goes_away_is_reported_and_the_watch_goes_on(redis_servers):
    server = redis_servers()
    with varsync.connect(server.url) as writer:
        writer.create_table("variables", SIGNATURE)
        writer.push(values(1))
    process = subprocess.Popen(
        [sys.executable, "-m", "varsync.cli", "watch", server.url, "--interval", "0.1",
         "--timeout", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        lines = lines_of(process)
        next_line_with(lines, "variables │       1 │")
        server.stop()
        failed = next_line_with(lines, "last refresh failed:")
        assert "127.0.0.1" in failed or "connect" in failed.lower()
        next_line_with(lines, "variables │       1 │")  # the last figures stay shown
        interrupt_cleanly(process)
    finally:
        kill_if_running(process)


# -- a real terminal --------------------------------------------------------------------


class Tmux:
    """A tmux server of this test's own (``-L``: a private socket; no configuration file),
    killed at the end."""

    def __init__(self):
        self.socket = f"varsync-test-{uuid.uuid4().hex[:12]}"

    def __call__(self, *args):
        done = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"tmux {' '.join(args)}: {done.stderr.strip()}"
        return done.stdout

    def screen(self):
        return self("capture-pane", "-p", "-t", "watch")

    def until(self, predicate, what, seconds=30.0):
        deadline = time.monotonic() + seconds
        while True:
            screen = self.screen()
            found = predicate(screen)
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not seen in {seconds:g} s; the pane:\n{screen}")
            time.sleep(0.05)  # polling the pane: tmux has no way to wait for a change

    def kill(self):
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=30)
        folder = os.path.join(os.environ.get("TMUX_TMPDIR") or "/tmp", f"tmux-{os.getuid()}")
        with contextlib.suppress(FileNotFoundError):  # tmux leaves its socket file behind
            os.unlink(os.path.join(folder, self.socket))


def version_on(screen):
    for line in screen.splitlines():
        found = re.match(r"\s*variables\s*│\s*(\d+)\s*│", line)
        if found:
            return int(found[1])
    return None


def test_the_live_view_in_a_real_terminal_shows_rising_versions_and_quits_on_ctrl_c(
    redis_namespace,
):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (Debian: apt-get install tmux); the live view's "
                    "terminal test needs a real terminal")
    url = redis_namespace()
    stop = threading.Event()
    with varsync.connect(url) as writer:
        writer.create_table("variables", SIGNATURE)
        writer.push(values(1))

        def push():
            step = 2
            while not stop.is_set():
                writer.push(values(step))
                step += 1
                stop.wait(0.02)

        pusher = threading.Thread(target=push, daemon=True)
        tmux = Tmux()
        pusher.start()
        try:
            command = " ".join(shlex.quote(a) for a in [
                sys.executable, "-m", "varsync.cli", "watch", url, "--interval", "0.2"
            ])
            # The shell outlives the Ctrl-C (a trap, not an ignore, which the watch would
            # inherit) to say how the watch ended and keep the pane for a last look.
            shell = f"trap : INT; {command}; echo \"watch exited with status $?\"; sleep 600"
            tmux("new-session", "-d", "-x", "120", "-y", "40", "-s", "watch", "sh", "-c", shell)
            first = tmux.until(version_on, "the table 'variables' with a version")
            screen = tmux.screen()
            assert "TABLE" in screen and "PUSHES/S" in screen and "Ctrl-C to quit" in screen
            later = tmux.until(lambda s: (version_on(s) or 0) > first and version_on(s),
                               f"a version above {first}")
            assert later > first
            tmux.until(lambda s: re.search(r"variables\s*│\s*\d+\s*│\s*[1-9][\d.]*\s*│", s),
                       "a push rate above 0")
            assert tmux("display-message", "-p", "-t", "watch", "#{cursor_flag}").strip() == "0"
            tmux("send-keys", "-t", "watch", "C-c")
            screen = tmux.until(lambda s: "watch exited with status" in s and s,
                                "the watch process exiting")
            assert "watch exited with status 0" in screen
            history = tmux("capture-pane", "-p", "-t", "watch", "-S", "-")
            assert "Traceback" not in history and "KeyboardInterrupt" not in history
            # the terminal is as it was: the cursor Live hid is shown again
            assert tmux("display-message", "-p", "-t", "watch", "#{cursor_flag}").strip() == "1"
        finally:
            tmux.kill()
            stop.set()
            pusher.join(timeout=30)
