"""docs/architecture.md puts every file in its place, and the layers hold: backends and
plugins reach the core only through ``varsync`` and ``varsync.backend``."""

from __future__ import annotations

import ast
import pathlib
import subprocess
from typing import List

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
#: Where the modules that must be on the page live.
PLACES = ("varsync", "plugins/varsync-shm/varsync_shm", "benchmarks", "tools")
#: What a plugin may import of varsync.
PLUGIN_API = ("varsync", "varsync.backend")


def tracked(*places: str) -> List[pathlib.Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--", *places], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [pathlib.Path(p) for p in listed if p.endswith(".py")]


def test_every_module_is_named_on_the_architecture_page() -> None:
    text = PAGE.read_text(encoding="utf-8")
    missing = [
        str(path) for path in tracked(*PLACES)
        # named by its path, or by its name in a row that names its directory
        if str(path) not in text and not (path.name in text and f"{path.parent}/" in text)
    ]
    assert not missing, f"docs/architecture.md does not place: {missing}"


def _varsync_imports(path: pathlib.Path) -> List[str]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [n for n in names if n == "varsync" or n.startswith("varsync.")]


@pytest.mark.parametrize("path", tracked("plugins"), ids=str)
def test_the_plugin_imports_only_varsync_and_varsync_backend(path: pathlib.Path) -> None:
    allowed = PLUGIN_API + (("varsync.testing",) if "/tests/" in str(path) else ())
    wrong = [m for m in _varsync_imports(path) if not m.startswith(allowed) or (
        m not in PLUGIN_API and not m.startswith("varsync.testing")
    )]
    assert not wrong, f"{path} imports {wrong}; a plugin imports from {PLUGIN_API} only"
