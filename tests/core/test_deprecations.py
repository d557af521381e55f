"""What was renamed keeps its old name for a minor release, with a DeprecationWarning that
says where the name lives now (docs/plugins.md, "What is stable")."""

from __future__ import annotations

import importlib

import pytest

from varsync.testing import suite


@pytest.mark.parametrize("name", sorted(suite._MOVED))
def test_the_old_suite_names_still_import_with_a_warning_naming_their_home(name: str) -> None:
    home, instead = suite._MOVED[name]
    with pytest.warns(DeprecationWarning, match=f"import it from {instead}"):
        old = getattr(suite, name)
    assert old is getattr(importlib.import_module(home), name)
    assert getattr(importlib.import_module(instead), name) is old


def test_a_name_the_suite_never_had_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        suite.nothing  # noqa: B018


def test_the_modules_a_first_protocol_plugin_imported_from_still_hold_its_names() -> None:
    # A 0.1 plugin imported these (the old plugin guide did); they are not renamed.
    from varsync.backends.base import Backend, Snapshot, deadline_after, remaining  # noqa: F401
    from varsync.config import parse_timeout, redact  # noqa: F401
    from varsync.errors import translate_errors  # noqa: F401
    from varsync.registry import BackendRegistry  # noqa: F401
    from varsync.signature import Spec  # noqa: F401
