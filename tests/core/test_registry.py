"""The backend registry: real entry-point discovery of fake installed distributions.

Each test "installs" distributions by writing ``<name>-<version>.dist-info`` directories
and plugin modules into a temporary directory on ``sys.path``; ``importlib.metadata``
and pluggy then find them exactly as they find a pip-installed plugin.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
import warnings
from pathlib import Path
from typing import Dict, Iterator

import numpy as np
import pytest

import varsync
from varsync._backends.memory import MemoryBackend
from varsync._registry import reset_registry

# Any warning from plugin loading that a test does not expect with pytest.warns fails it.
pytestmark = pytest.mark.filterwarnings("error::varsync.PluginWarning")

MODULE_PREFIX = "fakeplug"

FAKE_PLUGIN = """
    import varsync

    @varsync.hookimpl
    def varsync_register_backends(registry):
        registry.add("fake", "fakeplug_backend:FakeBackend", requires=["numpy"])
        registry.add(
            "needsdriver",
            "fakeplug_driven:DrivenBackend",
            requires=["fakeplug_no_such_driver"],
            install_hint="pip install fakeplug[driver]",
        )
        registry.add(
            "nohint", "fakeplug_driven:DrivenBackend", requires=["fakeplug_no_such_driver"]
        )
        registry.add("noclass", "fakeplug_backend:NoSuchBackend")
"""

FAKE_BACKEND = """
    from varsync._backends.memory import MemoryBackend

    class FakeBackend(MemoryBackend):
        \"\"\"The in-process memory store, served under the fake:// scheme.\"\"\"
"""

DRIVEN_BACKEND = """
    import fakeplug_no_such_driver

    class DrivenBackend:
        pass
"""


class FakeSite:
    """A site-packages directory on sys.path that fake distributions are written into."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def install(
        self,
        dist: str,
        version: str,
        plugins: Dict[str, str],
        modules: Dict[str, str],
    ) -> None:
        info = self.path / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
        )
        (info / "entry_points.txt").write_text(
            "[varsync]\n" + "".join(f"{name} = {target}\n" for name, target in plugins.items())
        )
        for module, source in modules.items():
            (self.path / f"{module}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()

    def install_fakeplug(self) -> None:
        self.install(
            "fakeplug",
            "1.2",
            {"fake": "fakeplug_mod"},
            {
                "fakeplug_mod": FAKE_PLUGIN,
                "fakeplug_backend": FAKE_BACKEND,
                "fakeplug_driven": DRIVEN_BACKEND,
            },
        )


def _purge_fake_modules() -> None:
    for name in [m for m in sys.modules if m.startswith(MODULE_PREFIX)]:
        del sys.modules[name]


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    """An empty site directory on sys.path and a registry that will rescan it."""
    path = tmp_path / "site-packages"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    _purge_fake_modules()
    reset_registry()
    yield FakeSite(path)
    reset_registry()
    _purge_fake_modules()


@pytest.fixture
def fakeplug(site: FakeSite) -> FakeSite:
    site.install_fakeplug()
    return site


def _backends() -> Dict[str, varsync.BackendEntry]:
    return {entry.scheme: entry for entry in varsync.available_backends()}


def _url(scheme: str) -> str:
    return f"{scheme}://{uuid.uuid4().hex}"


# -- listing ---------------------------------------------------------------------------


def test_available_backends_names_the_distribution_each_backend_comes_from(fakeplug):
    backends = _backends()

    assert backends["fake"].source == "fakeplug 1.2"
    assert backends["fake"].target == "fakeplug_backend:FakeBackend"
    assert backends["fake"].installed
    assert backends["memory"].source == "built-in"
    assert backends["memory"].target == "varsync._backends.memory:MemoryBackend"
    assert backends["memory"].installed


def test_available_backends_is_sorted_by_scheme(fakeplug):
    schemes = [entry.scheme for entry in varsync.available_backends()]

    assert schemes == sorted(schemes)
    assert {"fake", "memory"} <= set(schemes)


def test_listing_backends_imports_no_backend_module(fakeplug):
    varsync.available_backends()

    assert "fakeplug_backend" not in sys.modules
    assert "fakeplug_driven" not in sys.modules


def test_backend_class_is_imported_on_first_connect(fakeplug):
    varsync.available_backends()
    assert "fakeplug_backend" not in sys.modules

    with varsync.connect(_url("fake")) as store:
        assert "fakeplug_backend" in sys.modules
        assert type(store.backend) is sys.modules["fakeplug_backend"].FakeBackend


def test_a_plugin_backend_serves_push_and_pull(fakeplug):
    url = _url("fake")
    with varsync.connect(url) as writer, varsync.connect(url) as reader:
        writer.create_table("variables", {"w": np.zeros(3, np.float32), "step": np.int64(0)})
        version = writer.push({"w": np.arange(3, dtype=np.float32), "step": np.int64(7)})

        pulled = reader.pull()

    assert version == 1
    np.testing.assert_array_equal(pulled["w"], np.arange(3, dtype=np.float32))
    assert pulled["step"] == 7


def test_plugin_schemes_are_matched_case_insensitively(fakeplug):
    with varsync.connect("FAKE://" + uuid.uuid4().hex) as store:
        assert type(store.backend).__name__ == "FakeBackend"


def test_reset_registry_finds_a_plugin_installed_since_the_last_scan(site):
    assert "fake" not in _backends()

    site.install_fakeplug()
    reset_registry()

    assert _backends()["fake"].source == "fakeplug 1.2"


def test_a_distribution_found_twice_on_sys_path_registers_once_without_warning(
    fakeplug, tmp_path, monkeypatch
):
    second = FakeSite(tmp_path / "second-site-packages")
    second.path.mkdir()
    monkeypatch.syspath_prepend(str(second.path))
    second.install_fakeplug()
    reset_registry()

    # The module-level filter turns any PluginWarning into a failure here.
    assert _backends()["fake"].source == "fakeplug 1.2"


# -- missing dependencies --------------------------------------------------------------


def test_a_backend_whose_dependency_is_absent_is_listed_as_not_installed(fakeplug):
    entry = _backends()["needsdriver"]

    assert not entry.installed
    assert entry.missing == ("fakeplug_no_such_driver",)
    assert entry.install_hint == "pip install fakeplug[driver]"


@pytest.mark.parametrize(
    "scheme, hint",
    [
        ("needsdriver", "pip install fakeplug[driver]"),
        ("nohint", "pip install fakeplug_no_such_driver"),
    ],
)
def test_connecting_to_a_backend_whose_dependency_is_absent_names_the_install_command(
    fakeplug, scheme, hint
):
    with pytest.raises(varsync.MissingDependencyError) as caught:
        varsync.connect(_url(scheme))

    assert isinstance(caught.value, ImportError)
    assert isinstance(caught.value, varsync.VarsyncError)
    assert hint in str(caught.value)
    assert "fakeplug_no_such_driver" in str(caught.value)
    assert isinstance(caught.value.__cause__, ImportError)


def test_the_install_hint_of_a_builtin_extra_names_the_varsync_extra():
    registry = varsync._registry.BackendRegistry()
    registry.add(
        "future", "fakeplug_future:Backend", requires=["fakeplug_no_such_driver"], extra="future"
    )

    assert registry.entries["future"].install_hint == 'pip install "varsync[future]"'


def test_a_backend_naming_a_class_its_module_lacks_fails_on_connect(fakeplug):
    with pytest.raises(varsync.ConfigurationError, match="NoSuchBackend"):
        varsync.connect(_url("noclass"))


# -- broken plugins --------------------------------------------------------------------


def test_a_plugin_that_fails_to_import_warns_and_the_others_still_work(fakeplug):
    fakeplug.install(
        "brokenplug",
        "0.1",
        {"broken": "fakeplug_broken"},
        {"fakeplug_broken": "raise RuntimeError('brokenplug cannot start')\n"},
    )

    with pytest.warns(varsync.PluginWarning, match="brokenplug cannot start") as caught:
        backends = _backends()

    assert "brokenplug 0.1" in str(caught[0].message)
    assert {"fake", "memory"} <= set(backends)
    with varsync.connect(_url("fake")) as fake, varsync.connect(_url("memory")) as memory:
        fake.create_table("t", {"x": np.zeros(2)})
        memory.create_table("t", {"x": np.zeros(2)})
        assert fake.push({"x": np.ones(2)}, "t") == 1
        assert memory.push({"x": np.ones(2)}, "t") == 1


def test_a_plugin_whose_hook_raises_warns_and_the_others_still_work(fakeplug):
    fakeplug.install(
        "raisingplug",
        "0.2",
        {"raising": "fakeplug_raising"},
        {
            "fakeplug_raising": """
                import varsync

                @varsync.hookimpl
                def varsync_register_backends(registry):
                    raise RuntimeError("raisingplug hook failed")
            """
        },
    )

    with pytest.warns(varsync.PluginWarning, match="raisingplug hook failed") as caught:
        backends = _backends()

    assert "raisingplug 0.2" in str(caught[0].message)
    assert {"fake", "memory"} <= set(backends)
    with varsync.connect(_url("fake")) as store:
        assert store.tables() == []


def test_a_plugin_registering_an_invalid_target_warns_and_the_others_still_work(fakeplug):
    fakeplug.install(
        "badtargetplug",
        "0.3",
        {"badtarget": "fakeplug_badtarget"},
        {
            "fakeplug_badtarget": """
                import varsync

                @varsync.hookimpl
                def varsync_register_backends(registry):
                    registry.add("badtarget", "fakeplug_backend.FakeBackend")
            """
        },
    )

    with pytest.warns(varsync.PluginWarning, match="module:Class"):
        backends = _backends()

    assert "badtarget" not in backends
    assert {"fake", "memory"} <= set(backends)


@pytest.mark.parametrize(
    "decorator",
    ["@varsync.hookimpl", "@varsync.hookimpl(trylast=True)", "@varsync.hookimpl(tryfirst=True)"],
)
def test_a_plugin_cannot_take_over_a_builtin_scheme(site, decorator):
    site.install_fakeplug()
    site.install(
        "greedyplug",
        "2.0",
        {"greedy": "fakeplug_greedy"},
        {
            "fakeplug_greedy": f"""
                import varsync

                {decorator}
                def varsync_register_backends(registry):
                    registry.add("memory", "fakeplug_backend:FakeBackend")
            """
        },
    )

    with pytest.warns(varsync.PluginWarning, match="memory://") as caught:
        backends = _backends()

    assert "greedyplug 2.0" in str(caught[0].message)
    assert backends["memory"].source == "built-in"
    assert backends["memory"].target == "varsync._backends.memory:MemoryBackend"
    with varsync.connect(_url("memory")) as store:
        assert type(store.backend) is MemoryBackend
    assert "fakeplug_backend" not in sys.modules


# -- unknown schemes -------------------------------------------------------------------


def test_connecting_to_an_unknown_scheme_lists_the_installed_schemes(fakeplug):
    with pytest.raises(varsync.UnknownBackendError) as caught:
        varsync.connect("nosuch://x")

    error = caught.value
    assert isinstance(error, ValueError)
    assert isinstance(error, varsync.ConfigurationError)
    assert isinstance(error, varsync.VarsyncError)
    message = str(error)
    assert "nosuch://" in message
    assert "memory://" in message
    assert "fake://" in message


def test_the_registry_view_is_read_only(fakeplug):
    entries = varsync._registry.get_registry().entries

    with pytest.raises(TypeError):
        entries["fake"] = entries["memory"]  # type: ignore[index]
    assert _backends()["fake"].source == "fakeplug 1.2"
