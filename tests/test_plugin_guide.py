"""docs/plugins.md is true: the varsync-dirstore plugin it shows, built from its code
blocks alone, installs as a distribution and passes its own tests, the whole conformance
suite among them, with any PluginWarning an error.

Each code block of the guide that starts with a file-name comment (``# pyproject.toml``,
``# src/varsync_dirstore/backend.py``, ...) is one file of the package. The package is
"installed" as a plain site directory holding the modules and a ``.dist-info`` with the
entry point, which is what ``pip install`` makes; the tests run in a fresh interpreter.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from typing import Dict

GUIDE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "plugins.md"
BLOCK = re.compile(r"```(?:python|toml)\n# (?P<path>[\w./-]+\.(?:py|toml))\n(?P<body>.*?)```", re.S)


def files_of_the_guide() -> Dict[str, str]:
    """File path -> text, for every code block that names its file."""
    files: Dict[str, str] = {}
    for match in BLOCK.finditer(GUIDE.read_text(encoding="utf-8")):
        path = match["path"]
        assert path not in files, f"docs/plugins.md shows {path} twice"
        files[path] = match["body"]
    return files


def test_the_guide_shows_the_whole_package() -> None:
    assert set(files_of_the_guide()) == {
        "pyproject.toml",
        "src/varsync_dirstore/__init__.py",
        "src/varsync_dirstore/plugin.py",
        "src/varsync_dirstore/backend.py",
        "tests/test_conformance.py",
    }


def test_the_guide_imports_only_from_varsync_and_varsync_backend() -> None:
    for path, text in files_of_the_guide().items():
        for module in re.findall(r"^\s*(?:from|import) (varsync[\w.]*)", text, re.M):
            assert module in ("varsync", "varsync.backend", "varsync.testing"), (
                f"docs/plugins.md: {path} imports {module}; a plugin imports from varsync, "
                "varsync.backend and (its tests) varsync.testing only"
            )


def test_the_plugin_of_the_guide_passes_its_tests(tmp_path: pathlib.Path) -> None:
    files = files_of_the_guide()
    entry = re.search(
        r"\[project\.entry-points\.varsync\]\n(\w+) = \"([\w.:]+)\"", files["pyproject.toml"]
    )
    assert entry, "pyproject.toml of the guide declares no varsync entry point"
    project = tmp_path / "varsync-dirstore"
    site = tmp_path / "site"
    for path, text in files.items():
        target = project / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    (site / "varsync_dirstore").mkdir(parents=True)
    for module in (project / "src" / "varsync_dirstore").iterdir():
        (site / "varsync_dirstore" / module.name).write_text(module.read_text())
    info = site / "varsync_dirstore-0.1.0.dist-info"
    info.mkdir()
    metadata = "Metadata-Version: 2.1\nName: varsync-dirstore\nVersion: 0.1.0\n"
    (info / "METADATA").write_text(metadata)
    (info / "entry_points.txt").write_text(f"[varsync]\n{entry[1]} = {entry[2]}\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "-W", "error::varsync.PluginWarning", "tests"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600,
    )
    tail = "\n".join(done.stdout.splitlines()[-30:])
    assert done.returncode == 0, (
        f"the guide's plugin failed its tests:\n{tail}\n{done.stderr[-2000:]}"
    )
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed[1]) > 50, f"too few tests ran:\n{tail}"
