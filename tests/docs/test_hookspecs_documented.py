"""Every hook a plugin can implement is named in the plugin author's guide."""

import inspect
import pathlib
import re

import pytest

from varsync import _hookspecs as hookspecs

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def hook_specs():
    """The functions of varsync._hookspecs that carry pluggy's hookspec marker."""
    marker = f"{hookspecs.PROJECT}_spec"  # the attribute HookspecMarker sets
    return sorted(
        name
        for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(function, marker)
    )


def test_the_hook_specs_are_found():
    assert "varsync_register_backends" in hook_specs()


@pytest.mark.parametrize("name", hook_specs())
def test_every_hook_spec_is_named_in_the_plugin_guide(name):
    assert GUIDE.is_file(), f"{GUIDE} (the plugin author's guide) is missing"
    text = GUIDE.read_text(encoding="utf-8")
    assert re.search(rf"\b{re.escape(name)}\b", text), (
        f"hook spec {name!r} of varsync/_hookspecs.py is not mentioned in docs/plugins.md; "
        "document it there"
    )
