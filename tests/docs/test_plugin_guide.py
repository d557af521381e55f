"""docs/plugins.md is true: the varsync-dirstore plugin it shows, built from its code
blocks alone, installs as a distribution and passes its own tests, the whole conformance
suite among them, with any PluginWarning an error (how: tests/docs/guide_packages.py).
"""

from __future__ import annotations

import pathlib
import re
from typing import Dict

from guide_packages import build_and_test_package, files_of

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def files_of_the_guide() -> Dict[str, str]:
    """File path -> text, for every code block that names its file."""
    return files_of(GUIDE)


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
    build_and_test_package(GUIDE, tmp_path, "varsync-dirstore", at_least=51)
