"""The packages the plugin guides show (docs/plugins.md, docs/adapters.md), built from the
pages' code blocks alone, "installed" and tested as their authors would.

Each code block of a page that starts with a file-name comment (``# pyproject.toml``,
``# src/varsync_dirstore/backend.py``, ...) is one file of the package. The package is
"installed" as a plain site directory holding the modules and a ``.dist-info`` with the
entry point, which is what ``pip install`` makes; its tests run in a fresh interpreter,
with any PluginWarning an error.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from typing import Dict

BLOCK = re.compile(r"```(?:python|toml)\n# (?P<path>[\w./-]+\.(?:py|toml))\n(?P<body>.*?)```", re.S)
ENTRY_POINT = re.compile(r"\[project\.entry-points\.varsync\]\n(\w+) = \"([\w.:]+)\"")


def files_of(page: pathlib.Path) -> Dict[str, str]:
    """File path -> text, for every code block of ``page`` that names its file."""
    files: Dict[str, str] = {}
    for match in BLOCK.finditer(page.read_text(encoding="utf-8")):
        path = match["path"]
        assert path not in files, f"{page.name} shows {path} twice"
        files[path] = match["body"]
    return files


def install(site: pathlib.Path, dist: str, entry_points: str, modules: Dict[str, str]) -> None:
    """Write ``modules`` (relative path -> text) and ``<dist>-0.1.0.dist-info`` with the
    ``[varsync]`` entry points ``entry_points`` into the directory ``site``."""
    for path, text in modules.items():
        target = site / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[varsync]\n{entry_points}\n")


def build_and_test_package(
    page: pathlib.Path, tmp_path: pathlib.Path, dist: str, at_least: int
) -> None:
    """Build ``page``'s package ``dist`` (its modules under ``src/<dist as module>/``),
    install it in a site directory under ``tmp_path`` and run its tests there; assert they
    pass, and that at least ``at_least`` ran."""
    files = files_of(page)
    entry = ENTRY_POINT.search(files["pyproject.toml"])
    assert entry, f"pyproject.toml of {page.name} declares no varsync entry point"
    project = tmp_path / dist
    for path, text in files.items():
        target = project / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    module = dist.replace("-", "_")
    package = project / "src" / module
    install(
        tmp_path / "site",
        dist,
        f"{entry[1]} = {entry[2]}",
        {f"{module}/{m.name}": m.read_text() for m in package.iterdir() if m.is_file()},
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "-W", "error::varsync.PluginWarning", "tests"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600,
    )
    tail = "\n".join(done.stdout.splitlines()[-30:])
    assert done.returncode == 0, (
        f"the package of {page.name} failed its tests:\n{tail}\n{done.stderr[-2000:]}"
    )
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed[1]) >= at_least, f"too few tests ran:\n{tail}"
