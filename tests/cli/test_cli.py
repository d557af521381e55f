"""The ``varsync`` command: through ``main([...])``, and as a process (``python -m
varsync.cli`` and, when installed, the ``varsync`` console script)."""

import collections
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import uuid

import numpy as np
import pytest

import varsync
from varsync import cli
from varsync import _signature as sig

Point = collections.namedtuple("Point", ["x", "y"])

SIGNATURE = {
    "policy": [varsync.Spec((64, 32), "float32"), varsync.Spec((32,), "float32")],
    "train_step": varsync.Spec((), "int64"),
}
SPEC_JSON = {
    "policy": [{"shape": [64, 32], "dtype": "float32"}, {"shape": [32], "dtype": "float32"}],
    "train_step": {"shape": [], "dtype": "int64"},
}


@pytest.fixture
def run(capsys):
    """``run(*argv) -> (exit status, stdout, stderr)`` of ``varsync argv...``."""

    def _run(*argv):
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return _run


@pytest.fixture
def url():
    """A memory:// store with table "variables" at version 1 (main() runs in-process)."""
    url = f"memory://cli-{uuid.uuid4().hex}"
    with varsync.connect(url) as store:
        store.create_table("variables", SIGNATURE)
        store.push({"policy": [np.ones((64, 32), np.float32), np.ones(32, np.float32)],
                    "train_step": 7})
        yield url


def one_line(text):
    return text.count("\n") == 1 and text.endswith("\n")


# -- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["--help"], ["backends", "--help"], ["info", "--help"], ["serve", "--help"],
    ["serve", "reverb", "--help"], ["bench", "--help"],
])
def test_every_command_has_help(run, argv):
    code, out, err = run(*argv)
    assert code == 0
    assert out.startswith("usage: varsync")
    assert err == ""


def test_version_is_printed(run):
    code, out, _ = run("--version")
    assert code == 0 and out.strip() == f"varsync {varsync.__version__}"


@pytest.mark.parametrize("argv, message", [
    ([], "a command is required"),
    (["frobnicate"], "invalid choice"),
    (["serve"], "ENGINE"),
    (["serve", "reverb"], "--table"),
    (["serve", "reverb", "--table", "no-equals-sign"], "expected NAME=SPEC_FILE"),
    (["info"], "URL"),
    (["bench", "memory://x", "--size", "12XB"], "not a size"),
    (["bench", "memory://x", "--rounds", "0"], "at least 1"),
])
def test_a_bad_command_line_is_one_line_on_stderr_and_status_2(run, argv, message):
    code, out, err = run(*argv)
    assert code == 2
    assert out == ""
    assert one_line(err) and message in err and "--help" in err


# -- varsync backends ---------------------------------------------------------------------


def test_backends_lists_each_backend_with_its_source_and_dependencies(run):
    code, out, err = run("backends")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["SCHEME", "FROM", "DEPENDENCIES", "DESCRIPTION"]
    for entry in varsync.available_backends():
        line = next(l for l in lines if l.startswith(f"{entry.scheme}://"))
        source = f"varsync {varsync.__version__} (built-in)" if entry.source == "built-in" else entry.source
        assert source in line
        assert ("ok" if entry.installed else "missing") in line


def test_backends_names_the_install_command_of_a_missing_dependency(run, monkeypatch):
    entry = varsync.BackendEntry(
        scheme="fancy", target="fancy_backend:Fancy", source="varsync-fancy 2.0",
        requires=("fancydriver",), install_hint="pip install varsync-fancy[all]",
        description="a backend whose driver is not installed", missing=("fancydriver",),
    )
    monkeypatch.setattr(varsync, "available_backends", lambda: [entry])
    code, out, _ = run("backends")
    assert code == 0
    assert "fancy://" in out and "varsync-fancy 2.0" in out
    assert "missing fancydriver (pip install varsync-fancy[all])" in out


def test_backends_as_json(run):
    code, out, _ = run("backends", "--json")
    assert code == 0
    rows = json.loads(out)
    assert {row["scheme"] for row in rows} == {e.scheme for e in varsync.available_backends()}
    memory = next(row for row in rows if row["scheme"] == "memory")
    assert memory["dependencies"] == "ok" and memory["source"].endswith("(built-in)")


# -- varsync info ---------------------------------------------------------------------------


def test_info_shows_versions_sizes_and_the_signature_as_a_tree(run, url):
    code, out, err = run("info", url)
    assert code == 0 and err == ""
    assert f"{url}  (MemoryBackend, 1 table)" in out
    assert "table 'variables': version 1, 8328 bytes (8.1 KiB), 3 leaves" in out
    assert "├── policy  (list[2])" in out
    assert "│   ├── [0]  float32  (64, 32)  8192 bytes (8.0 KiB)" in out
    assert "│   └── [1]  float32  (32,)  128 bytes" in out
    assert "└── train_step  int64  ()  8 bytes" in out


def test_info_of_one_table_as_json(run, url):
    with varsync.connect(url) as store:
        store.create_table("other", {"p": Point(x=np.zeros(3), y=[np.int8(1)])})
    code, out, _ = run("info", url, "--table", "other", "--json")
    assert code == 0
    document = json.loads(out)
    (table,) = document["tables"]
    assert table["name"] == "other" and table["version"] == 0 and table["nbytes"] == 25
    assert [leaf["path"] for leaf in table["leaves"]] == ["['p'].x", "['p'].y[0]"]
    assert table["leaves"][0] == {"path": "['p'].x", "dtype": "float64", "shape": [3], "nbytes": 24}
    assert sig.same_structure(sig.from_json(json.dumps(table["signature"])),
                              {"p": Point(x=varsync.Spec((3,), "float64"), y=[varsync.Spec((), "int8")])})


def test_info_of_an_empty_store(run):
    code, out, _ = run("info", f"memory://empty-{uuid.uuid4().hex}")
    assert code == 0 and "0 tables" in out


@pytest.mark.parametrize("argv, message", [
    (["--table", "missing"], "no table 'missing'"),
])
def test_info_of_an_unknown_table_is_one_line_and_status_1(run, url, argv, message):
    code, out, err = run("info", url, *argv)
    assert code == 1 and out == ""
    assert one_line(err) and err.startswith("varsync: error:") and message in err
    assert "variables" in err  # it names the tables that exist


@pytest.mark.parametrize("target, message", [
    ("not-a-url", "is not a varsync URL"),
    ("nope://x", "no varsync backend for nope://"),
    ("memory://", "names no store"),
])
def test_info_of_a_bad_url_is_one_line_and_status_1(run, target, message):
    code, _, err = run("info", target)
    assert code == 1 and one_line(err) and message in err


def test_traceback_shows_the_whole_traceback(run):
    code, _, err = run("--traceback", "info", "nope://x")
    assert code == 1
    assert "Traceback (most recent call last)" in err and "UnknownBackendError" in err


# -- varsync bench --------------------------------------------------------------------------


def test_bench_times_push_pull_update_and_polls(run):
    target = f"memory://bench-{uuid.uuid4().hex}"
    code, out, err = run("bench", target, "--size", "1MB", "--rounds", "2", "--polls", "20")
    assert code == 0 and err == ""  # no progress bar when stderr is not a terminal
    assert "table 'varsync_bench' created; 1000000 bytes (976.6 KiB) in 4 leaves, 2 rounds" in out
    for operation in ("push", "pull", "update", "pull_if_newer (nothing newer, mean of 20)",
                      "version (mean of 20)"):
        assert any(line.startswith(operation) for line in out.splitlines()), operation
    with varsync.connect(target) as store:
        assert store.table_info("varsync_bench").nbytes == 1_000_000
        assert store.version("varsync_bench") == 5  # 3 warm-up rounds, then 2 timed ones


def test_bench_as_json_with_a_progress_bar_on_stderr(run):
    target = f"memory://bench-{uuid.uuid4().hex}"
    code, out, err = run("bench", target, "--size", "64KiB", "--rounds", "3", "--polls", "5",
                         "--progress", "--json")
    assert code == 0
    document = json.loads(out)
    assert document["nbytes"] == 65536 and document["rounds"] == 3
    assert set(document["results"]) == {"push", "pull", "update", "pull_if_newer", "version"}
    assert all(r["min_s"] <= r["median_s"] <= r["max_s"] for r in document["results"].values())
    assert "bench [" in err and "12/12" in err and "\r" in err


def test_bench_uses_an_existing_table_with_its_own_signature(run, url):
    code, out, _ = run("bench", url, "--table", "variables", "--rounds", "1", "--polls", "5")
    assert code == 0
    assert "existing table 'variables' (its own signature: --size does not apply); 8328 bytes" in out


@pytest.mark.parametrize("text, expected", [
    ("40MB", 40_000_000), ("400mb", 400_000_000), ("1GiB", 2**30), ("512KB", 512_000),
    ("1.5MiB", 1_572_864), ("1000", 1000), ("2k", 2048), ("10 B", 10),
])
def test_sizes_are_read_in_decimal_and_binary_units(text, expected):
    assert cli.parse_size(text) == expected


# -- spec files and varsync serve -------------------------------------------------------------


def test_a_json_spec_file_of_shape_and_dtype_leaves(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(SPEC_JSON))
    assert sig.same_structure(cli.load_spec_file(str(path)), SIGNATURE)


def test_a_spec_file_in_varsyncs_signature_format(tmp_path):
    nested = {"p": Point(x=varsync.Spec((3,), "float64"), y=(varsync.Spec((), "int8"),))}
    path = tmp_path / "spec.json"
    path.write_text(sig.to_json(nested))
    loaded = cli.load_spec_file(str(path))
    assert sig.same_structure(loaded, nested) and type(loaded["p"]).__name__ == "Point"


def test_an_npz_spec_file_of_example_arrays(tmp_path):
    path = tmp_path / "example.npz"
    np.savez(path, weights=np.zeros((4, 2), np.float32), step=np.int64(0))
    assert sig.same_structure(
        cli.load_spec_file(str(path)),
        {"step": varsync.Spec((), "int64"), "weights": varsync.Spec((4, 2), "float32")},
    )


@pytest.mark.parametrize("name, content, message", [
    ("bad.json", "{not json", "is not JSON"),
    ("leaf.json", json.dumps({"w": {"shape": [2], "dtype": "float128"}}), "leaf ['w']"),
    ("shape.json", json.dumps({"w": {"shape": [-1], "dtype": "float32"}}), "leaf ['w']"),
    ("scalar.json", json.dumps({"w": 3}), "expected a leaf"),
    ("format.json", json.dumps({"format": "varsync.signature", "version": 99}), "format version"),
])
def test_bad_spec_files_are_clear_errors(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(varsync.VarsyncError, match=message.replace("[", r"\[").replace("]", r"\]")):
        cli.load_spec_file(str(path))


def test_npz_spec_files_are_never_unpickled(tmp_path):
    path = tmp_path / "objects.npz"
    np.savez(path, w=np.array([None, 1], dtype=object))
    with pytest.raises(varsync.SignatureError, match="not a .npz of numeric arrays"):
        cli.load_spec_file(str(path))


def test_serve_with_a_missing_spec_file_is_one_line_and_status_1(run, tmp_path):
    code, _, err = run("serve", "reverb", "--table", f"variables={tmp_path / 'nope.json'}")
    assert code == 1 and one_line(err) and "does not exist" in err


def test_a_served_reverb_table_is_usable_until_interrupted(run, tmp_path):
    pytest.importorskip("reverb")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC_JSON))
    server = subprocess.Popen(
        [sys.executable, "-m", "varsync.cli", "serve", "reverb", "--port", "0",
         "--table", f"variables={spec}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        ready, _, _ = select.select([server.stdout], [], [], 120)
        assert ready, "the server printed no URL within 120 s"
        address = server.stdout.readline().strip()
        assert address.startswith("reverb://localhost:")
        with varsync.connect(address) as store:
            assert sig.same_structure(store.signature(), SIGNATURE)
            values = {"policy": [np.full((64, 32), 2, np.float32), np.full(32, 2, np.float32)],
                      "train_step": 5}
            assert store.push(values) == 1
            assert int(store.pull()["train_step"]) == 5
        code, out, _ = run("info", address)
        assert code == 0 and "table 'variables': version 1" in out
        code, out, _ = run("bench", address, "--table", "variables", "--rounds", "1",
                           "--polls", "5")
        assert code == 0 and "existing table 'variables'" in out
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=60)
        assert server.returncode == 0, err
        assert f"stopped {address}" in err
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate(timeout=30)


# -- as a process ---------------------------------------------------------------------------


def test_python_m_varsync_cli_runs_the_command():
    done = subprocess.run([sys.executable, "-m", "varsync.cli", "info", "nope://x"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert one_line(done.stderr) and "no varsync backend for nope://" in done.stderr


def test_the_installed_console_script_runs():
    script = shutil.which("varsync", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip('the varsync console script is not installed ([project.scripts] '
                    'varsync = "varsync.cli:main", then pip install -e .)')
    done = subprocess.run([script, "backends"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert any(line.startswith("memory://") for line in done.stdout.splitlines())
    failed = subprocess.run([script, "info", "nope://x"], capture_output=True, text=True,
                            timeout=120)
    assert failed.returncode == 1 and one_line(failed.stderr)
