"""The public surface, pinned: what each public module exports is listed here, so that a
name is added, deprecated or removed on purpose (CHANGELOG.md), never by accident. The
lists are the modules' ``__all__``; each name must exist. Modules that need a framework
(``varsync.integrations.torchrl``) are read without being imported."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[1]

PUBLIC = {
    "varsync": [
        "AuthenticationError", "BackendConnectionError", "BackendEntry", "ConcurrentPushError",
        "ConfigurationError", "CorruptDataError", "DEFAULT_TABLE", "ItemTooLargeError",
        "LeafPathError", "MissingDependencyError", "MissingSignatureError", "PluginWarning",
        "PullTimeoutError", "SignatureError", "SignatureMismatchError", "Spec",
        "TableConfigurationError", "TableExistsError", "TableInfo", "TableNotFoundError",
        "TableResetError", "UnknownBackendError", "UnsupportedError", "VariableContainer",
        "VarsyncError", "__version__", "available_backends", "connect", "flatten",
        "hookimpl", "signature_of", "unflatten",
    ],
    "varsync.backend": [
        "AuthenticationError", "BLOCK_SLICE", "Backend", "BackendConnectionError",
        "BackendRegistry", "ConcurrentPushError", "ConfigurationError", "CorruptDataError",
        "ErrorMap", "Head", "HostPort", "ItemTooLargeError", "LeafRead",
        "MAX_TIMEOUT", "MissingDependencyError", "POLL_MAX", "POLL_START", "PullTimeoutError",
        "Read", "Spec", "SupportsBlockingWait", "SupportsLeafVersions",
        "SupportsReaderRegistry", "TableConfigurationError", "TableExistsError",
        "TableNotFoundError", "TableResetError", "UnsupportedError", "VarsyncError",
        "assert_bit_equal", "check_consistent", "check_text",
        "deadline_after", "filled", "hookimpl", "parse_bool",
        "parse_host_port", "parse_int", "parse_timeout", "parse_wait_for_server",
        "redact", "refuse_unknown", "remaining", "request_timeout", "reset_error",
        "reset_registry", "retry_until_up", "translate_errors", "translated_error",
    ],
    "varsync.testing": [
        "CapabilityTests", "ConcurrencyTests", "ConformanceTests", "ContractTests",
        "FaultTests", "LeafVersionTests", "ReaderRegistryTests", "RoundTripTests",
        "TableTests", "ValidationTests", "VersionTests",
    ],
    "varsync.compat.tf_agents": [
        "DEFAULT_TABLE", "POLICY_KEY", "ReverbVariableContainer", "TRAIN_STEP_KEY",
    ],
    "varsync.integrations.torchrl": ["VarsyncTransport", "VarsyncWeightSyncScheme"],
    "varsync.cli": ["load_spec_file", "main", "parse_size", "signature_tree"],
}

#: Modules whose import needs a framework: their ``__all__`` is read from the source.
READ_ONLY = {"varsync.compat.tf_agents", "varsync.integrations.torchrl"}


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
