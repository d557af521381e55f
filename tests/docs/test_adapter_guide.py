"""docs/adapters.md is true, and adapters load as it says.

The varsync-mlx adapter the page shows, built from its code blocks alone, installs as a
distribution and passes its own tests, with any PluginWarning an error (where MLX is
installed: the modern environment). Each code block that starts with a file-name comment
(``# pyproject.toml``, ``# src/varsync_mlx/adapter.py``, ...) is one file of the package;
it is "installed" as a plain site directory holding the modules and a ``.dist-info`` with
the entry point, which is what ``pip install`` makes, and its tests run in a fresh
interpreter.

In every environment: a third party's adapter, registered through a fake distribution,
is imported only once its framework (a fake module) is imported and one of its values is
seen; and ``import varsync``, with the adapter registry built and used, imports no
framework. (tests/adapters/test_tensorflow_values.py checks TensorFlow, Reverb and Redis stay
unimported by a numpy-only program, in the TensorFlow environment.)
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Dict, Set

import pytest
from guide_packages import build_and_test_package, files_of, install

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "adapters.md"

FRAMEWORKS = ("tensorflow", "keras", "tf_keras", "torch", "jax", "jaxlib", "flax", "optax", "mlx")


def files_of_the_guide() -> Dict[str, str]:
    """File path -> text, for every code block that names its file."""
    return files_of(GUIDE)


def test_the_guide_shows_the_whole_package() -> None:
    assert set(files_of_the_guide()) == {
        "pyproject.toml",
        "src/varsync_mlx/__init__.py",
        "src/varsync_mlx/plugin.py",
        "src/varsync_mlx/adapter.py",
        "tests/test_mlx.py",
    }


def imported_modules(text: str) -> Set[str]:
    modules: Set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
    return modules


def test_the_guide_imports_only_varsync_varsync_adapters_its_framework_and_numpy() -> None:
    # ml_dtypes: numpy's bfloat16 (a dependency of varsync). pytest: the tests.
    third_party = {"numpy", "mlx", "ml_dtypes", "pytest"}
    for path, text in files_of_the_guide().items():
        if not path.endswith(".py"):
            continue
        for module in imported_modules(text):
            top = module.partition(".")[0]
            if top == "varsync":
                assert module in ("varsync", "varsync.backend"), (
                    f"docs/adapters.md: {path} imports {module}; an adapter plugin imports "
                    "from varsync and varsync.backend only"
                )
            else:
                assert top in third_party or top in sys.stdlib_module_names, (
                    f"docs/adapters.md: {path} imports {module}"
                )
    plugin = imported_modules(files_of_the_guide()["src/varsync_mlx/plugin.py"])
    assert not {m for m in plugin if m.partition(".")[0] == "mlx"}, (
        "the entry-point module must not import the framework"
    )


def test_the_adapter_of_the_guide_passes_its_tests(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("mlx.core", reason="MLX is installed only in the modern environment")
    build_and_test_package(GUIDE, tmp_path, "varsync-mlx", at_least=15)


# A framework of its own (``fakefw``), an adapter for it and the plugin that registers
# the adapter, as a third party would ship them.
FAKE_FRAMEWORK = """
    import numpy as np

    class Tensor:
        def __init__(self, data):
            self.data = np.asarray(data)
"""

FAKE_PLUGIN = """
    import varsync

    @varsync.hookimpl
    def varsync_register_adapters(registry):
        registry.add("fakefw", "fakefw_adapter:ADAPTER", modules=["fakefw"])
"""

FAKE_ADAPTER = """
    import fakefw

    class FakeAdapter:
        def handles(self, value):
            return isinstance(value, fakefw.Tensor)

        def shape_and_dtype(self, value):
            return value.data.shape, value.data.dtype

        def to_numpy(self, value):
            return value.data

        def is_assignable(self, target):
            return False

        def assign(self, target, array):
            raise TypeError("fakefw tensors are immutable")

        def from_numpy(self, array, like):
            return fakefw.Tensor(array)

    ADAPTER = FakeAdapter()
"""

# Run in a fresh interpreter: every step says which of the modules are imported.
SCRIPT = """
    import sys
    import warnings

    import numpy as np

    warnings.simplefilter("error")  # a plugin or adapter that fails to load fails this
    FRAMEWORKS = {frameworks!r}

    def loaded():
        names = ("fakefw", "fakefw_adapter", "fakefw_plugin") + FRAMEWORKS
        return sorted(m for m in names if m in sys.modules)

    import varsync
    print("import varsync:", loaded())

    class Foreign:  # a type of no registered framework's modules
        def __array__(self, dtype=None, copy=None):
            return np.ones(2, np.float32)

    with varsync.connect("memory://adapters") as store:
        from varsync._adapters import get_adapter_registry
        assert "fakefw" in get_adapter_registry().entries
        store.create_table("t", {{"w": np.zeros(2, np.float32), "step": 0}})
        store.push({{"w": np.ones(2, np.float32), "step": 1}}, table="t")
        store.push({{"w": Foreign(), "step": 2}}, table="t")
        print("numpy and foreign values:", loaded())

        import fakefw
        store.push({{"w": np.ones(2, np.float32), "step": 3}}, table="t")
        print("fakefw imported, numpy values:", loaded())

        store.create_table("f", {{"w": fakefw.Tensor(np.zeros(3, np.int16))}})
        print("a fakefw value seen:", loaded())
        store.push({{"w": fakefw.Tensor(np.arange(3, dtype=np.int16))}}, table="f")
        pulled = store.pull("f", like={{"w": fakefw.Tensor(np.zeros(3, np.int16))}})
        assert isinstance(pulled["w"], fakefw.Tensor), pulled
        assert pulled["w"].data.tolist() == [0, 1, 2], pulled
        print("signature:", store.signature("f"))
"""


def test_a_third_party_adapter_is_imported_only_with_its_framework_and_one_of_its_values(
    tmp_path: pathlib.Path,
) -> None:
    site = tmp_path / "site"
    install(
        site,
        "fakefw-varsync",
        "fakefw = fakefw_plugin",
        {
            "fakefw.py": textwrap.dedent(FAKE_FRAMEWORK),
            "fakefw_plugin.py": textwrap.dedent(FAKE_PLUGIN),
            "fakefw_adapter.py": textwrap.dedent(FAKE_ADAPTER),
        },
    )
    script = textwrap.dedent(SCRIPT).format(frameworks=FRAMEWORKS)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "import varsync: []",  # no framework, no plugin
        # connect imports the entry-point modules; with its framework not imported, the
        # adapter is not, even for a value of a type varsync does not know.
        "numpy and foreign values: ['fakefw_plugin']",
        # Its framework imported: numpy values never reach an adapter.
        "fakefw imported, numpy values: ['fakefw', 'fakefw_plugin']",
        "a fakefw value seen: ['fakefw', 'fakefw_adapter', 'fakefw_plugin']",
        "signature: {'w': Spec(shape=(3,), dtype=int16)}",
    ], done.stdout
