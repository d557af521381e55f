"""The public surface, pinned: what each public module exports is listed here, so that a
name is added, deprecated or removed on purpose (CHANGELOG.md), never by accident. The
lists are the modules' ``__all__``; each name must exist. Modules that need a framework
(``varsync.integrations.torchrl``, ``varsync.integrations.vllm``) are read without being
imported."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = {
    "varsync": [
        "AuthenticationError",
        "BackendConnectionError",
        "BackendEntry",
        "ConcurrentPushError",
        "ConfigurationError",
        "CorruptDataError",
        "DEFAULT_TABLE",
        "ItemTooLargeError",
        "LeafPathError",
        "MissingDependencyError",
        "MissingSignatureError",
        "PluginWarning",
        "PullTimeoutError",
        "ShardTimeoutError",
        "SignatureError",
        "SignatureMismatchError",
        "Spec",
        "TableConfigurationError",
        "TableExistsError",
        "TableInfo",
        "TableNotFoundError",
        "TableResetError",
        "UnknownBackendError",
        "UnsupportedError",
        "VariableContainer",
        "VarsyncError",
        "__version__",
        "available_backends",
        "connect",
        "flatten",
        "hookimpl",
        "parts_from_dtensors",
        "signature_of",
        "unflatten",
    ],
    "varsync.backend": [
        "Adapter",
        "AdapterRegistry",
        "EMPTY",
        "Ordered",
        "adapter_for",
        "AuthenticationError",
        "BLOCK_SLICE",
        "Backend",
        "BackendConnectionError",
        "BackendRegistry",
        "ConcurrentPushError",
        "ConfigurationError",
        "CorruptDataError",
        "ErrorMap",
        "Head",
        "HostPort",
        "ItemTooLargeError",
        "LeafRead",
        "MAX_TIMEOUT",
        "MissingDependencyError",
        "POLL_MAX",
        "POLL_START",
        "PullTimeoutError",
        "Read",
        "Spec",
        "SupportsBlockingWait",
        "SupportsLeafVersions",
        "SupportsReaderRegistry",
        "TableConfigurationError",
        "TableExistsError",
        "SupportsElementDeltas",
        "SupportsLeafSubsets",
        "leaf_subset",
        "PatchLink",
        "LeafChain",
        "PatchRead",
        "rebuilt_leaf",
        "element_patch",
        "TableNotFoundError",
        "TableResetError",
        "UnsupportedError",
        "VarsyncError",
        "assert_bit_equal",
        "check_consistent",
        "check_text",
        "deadline_after",
        "filled",
        "hookimpl",
        "parse_bool",
        "parse_host_port",
        "parse_int",
        "parse_timeout",
        "parse_wait_for_server",
        "redact",
        "refuse_unknown",
        "remaining",
        "request_timeout",
        "reset_error",
        "reset_registry",
        "retry_until_up",
        "translate_errors",
        "translated_error",
    ],
    "varsync.testing": [
        "CapabilityTests",
        "ConcurrencyTests",
        "ConformanceTests",
        "ContractTests",
        "FaultTests",
        "LeafVersionTests",
        "ElementDeltaTests",
        "LeafSubsetTests",
        "ReaderRegistryTests",
        "RoundTripTests",
        "ShardedTests",
        "TableTests",
        "ValidationTests",
        "VersionTests",
    ],
    "varsync.compat.tf_agents": [
        "DEFAULT_TABLE",
        "POLICY_KEY",
        "ReverbVariableContainer",
        "TRAIN_STEP_KEY",
    ],
    "varsync.integrations.torchrl": ["VarsyncTransport", "VarsyncWeightSyncScheme"],
    "varsync.integrations.vllm": [
        "BACKEND",
        "VarsyncInitInfo",
        "VarsyncUpdateInfo",
        "VarsyncWeightTransferEngine",
        "WeightPublisher",
        "WeightUpdateError",
        "last_update",
        "register",
        "served_version",
        "update_llm",
    ],
    "varsync.cli": ["load_spec_file", "main", "parse_size", "signature_tree"],
}

#: Modules whose import needs a framework: their ``__all__`` is read from the source.
READ_ONLY = {
    "varsync.compat.tf_agents",
    "varsync.integrations.torchrl",
    "varsync.integrations.vllm",
}


def declared_all(module: str) -> List[str]:
    """A module's ``__all__`` from its source, without importing it."""
    path = ROOT / (module.replace(".", "/") + ".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError(f"{module} declares no __all__")


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_each_public_module_exports_exactly_its_pinned_names(module: str) -> None:
    if module in READ_ONLY:
        exported = declared_all(module)
    else:
        loaded = importlib.import_module(module)
        exported = list(loaded.__all__)
        missing = [name for name in exported if not hasattr(loaded, name)]
        assert not missing, f"{module}.__all__ names {missing}, which it does not define"
    assert len(exported) == len(set(exported)), f"{module}.__all__ repeats a name"
    assert sorted(exported) == sorted(PUBLIC[module]), (
        f"{module}'s public names changed: added {sorted(set(exported) - set(PUBLIC[module]))}, "
        f"removed {sorted(set(PUBLIC[module]) - set(exported))}. Change them on purpose: "
        "update this list and CHANGELOG.md (removals after a release of deprecation)."
    )


#: Every module of the package whose dotted name has no ``_``-prefixed part: the public
#: ones above, the CLI's and the suite's parts, the pytest plugin, and the old paths of
#: the modules made private in 0.3 (each warns when imported; removed in 0.4).
PUBLIC_PACKAGES = ("varsync.cli", "varsync.testing", "varsync.compat", "varsync.integrations")
DEPRECATED_PATHS = {
    "varsync.adapters",
    "varsync.backends",
    "varsync.backends.base",
    "varsync.checks",
    "varsync.config",
    "varsync.container",
    "varsync.delta",
    "varsync.errors",
    "varsync.history",
    "varsync.hookspecs",
    "varsync.metrics",
    "varsync.nest",
    "varsync.options",
    "varsync.readers",
    "varsync.registry",
    "varsync.reverb",
    "varsync.server_wait",
    "varsync.signature",
    "varsync.signature_json",
    "varsync.spec",
}


def _modules() -> List[str]:
    names = []
    for path in sorted((ROOT / "varsync").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def test_every_module_without_an_underscore_is_public_or_a_deprecated_path() -> None:
    public_named = [m for m in _modules() if not any(part.startswith("_") for part in m.split("."))]
    unexpected = [
        m
        for m in public_named
        if m not in PUBLIC
        and m not in DEPRECATED_PATHS
        and not m.startswith(PUBLIC_PACKAGES)
        and m not in ("varsync.pytest_plugin", "varsync.reverb_server")
    ]
    assert not unexpected, f"modules public by name but not on purpose: {unexpected}"
    assert DEPRECATED_PATHS <= set(public_named)


@pytest.mark.parametrize("module", sorted(DEPRECATED_PATHS))
def test_each_deprecated_path_warns_and_gives_its_private_modules_names(module: str) -> None:
    import subprocess
    import sys

    if module == "varsync.reverb":  # the Reverb server's module needs Reverb
        pytest.importorskip("reverb")
    code = (
        "import warnings, importlib\n"
        "import varsync\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        f"    m = importlib.import_module({module!r})\n"
        "for w in seen:\n"
        "    if issubclass(w.category, DeprecationWarning):\n"
        "        print('WARNED', w.message)\n"
        "assert m.__all__ and all(hasattr(m, n) for n in m.__all__), m\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "WARNED" in out.stdout and "removed in 0.4" in out.stdout, out.stdout
