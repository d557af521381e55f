"""The error tree: one root, the built-ins callers already catch, and driver translation."""

from __future__ import annotations

import builtins
import re
import uuid
from typing import Dict, Optional, Tuple

import numpy as np
import pytest

import varsync
from varsync import _errors as errors
from varsync._errors import translate_errors

EXPORTED_ERRORS = {
    name: obj
    for name, obj in vars(errors).items()
    if name in errors.__all__ and isinstance(obj, type) and issubclass(obj, BaseException)
    and not issubclass(obj, Warning)  # PluginWarning: a warning beside the tree, not an error
}


def _drawn_tree() -> Dict[str, Tuple[Optional[str], Optional[str]]]:
    """The tree in the module docstring: class name -> (parent name, built-in name)."""
    lines = errors.__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "VarsyncError")
    indent = lines[start].index("VarsyncError")
    tree: Dict[str, Tuple[Optional[str], Optional[str]]] = {"VarsyncError": (None, None)}
    parents = ["VarsyncError"]
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        match = re.match(r"([ │]*)[├└]── (\w+)(?: \((\w+)\))?", line[indent:])
        assert match, f"cannot read the tree line {line!r}"
        depth = len(match.group(1)) // 4 + 1
        del parents[depth:]
        tree[match.group(2)] = (parents[-1], match.group(3))
        parents.append(match.group(2))
    return tree


DRAWN_TREE = _drawn_tree()


def test_every_exported_exception_is_a_varsync_error():
    assert len(EXPORTED_ERRORS) >= 15
    for name, cls in EXPORTED_ERRORS.items():
        assert issubclass(cls, varsync.VarsyncError), name


def test_the_plugin_warning_is_a_user_warning_outside_the_error_tree():
    assert issubclass(errors.PluginWarning, UserWarning)
    assert not issubclass(errors.PluginWarning, varsync.VarsyncError)
    assert varsync.PluginWarning is errors.PluginWarning


def test_every_exported_exception_is_public_at_the_top_level():
    for name, cls in EXPORTED_ERRORS.items():
        assert name in varsync.__all__
        assert getattr(varsync, name) is cls


@pytest.mark.parametrize(
    "cls, builtin",
    [
        (errors.ConfigurationError, ValueError),
        (errors.UnknownBackendError, ValueError),
        (errors.MissingDependencyError, ImportError),
        (errors.TableNotFoundError, KeyError),
        (errors.TableExistsError, ValueError),
        (errors.TableConfigurationError, ValueError),
        (errors.MissingSignatureError, TypeError),
        (errors.SignatureError, ValueError),
        (errors.SignatureMismatchError, ValueError),
        (errors.ItemTooLargeError, ValueError),
        (errors.CorruptDataError, ValueError),
        (errors.PullTimeoutError, TimeoutError),
        (errors.BackendConnectionError, ConnectionError),
        (errors.AuthenticationError, ConnectionError),
    ],
    ids=lambda value: value.__name__,
)
def test_each_specific_error_is_also_the_builtin_a_caller_catches(cls, builtin):
    assert issubclass(cls, builtin)
    assert issubclass(cls, varsync.VarsyncError)
    with pytest.raises(builtin):
        raise cls("message")


def test_the_tree_in_the_docstring_names_every_exported_error():
    assert set(DRAWN_TREE) == set(EXPORTED_ERRORS)


@pytest.mark.parametrize("name", sorted(set(DRAWN_TREE) - {"VarsyncError"}))
def test_each_error_subclasses_what_the_docstring_tree_draws(name):
    parent, builtin = DRAWN_TREE[name]
    cls = getattr(errors, name)

    assert issubclass(cls, getattr(errors, parent))
    if builtin is not None:
        assert issubclass(cls, getattr(builtins, builtin))


def test_subclass_errors_sit_under_their_parents():
    assert issubclass(errors.UnknownBackendError, errors.ConfigurationError)
    assert issubclass(errors.AuthenticationError, errors.BackendConnectionError)


def test_table_not_found_shows_its_message_without_quotes():
    assert str(errors.TableNotFoundError("no table 'x'")) == "no table 'x'"
    assert str(errors.TableNotFoundError()) == ""


def test_a_missing_table_can_be_caught_as_key_error_with_a_readable_message():
    with varsync.connect(f"memory://{uuid.uuid4().hex}") as store:
        store.create_table("present", {"x": np.zeros(1)})
        with pytest.raises(KeyError) as caught:
            store.pull("absent")

    message = str(caught.value)
    assert message.startswith("no table 'absent'")
    assert "present" in message
    assert "create_table" in message


# -- translate_errors ------------------------------------------------------------------

ADDRESS = "redis://127.0.0.1:6390/0"


def test_translate_errors_maps_a_driver_error_naming_the_address_and_chaining_it():
    original = ConnectionRefusedError("connection refused")

    with pytest.raises(varsync.BackendConnectionError) as caught:
        with translate_errors({OSError: varsync.BackendConnectionError}, ADDRESS):
            raise original

    message = str(caught.value)
    assert ADDRESS in message
    assert "ConnectionRefusedError" in message
    assert "connection refused" in message
    assert caught.value.__cause__ is original


@pytest.mark.parametrize(
    "mapping, expected",
    [
        (
            {TimeoutError: varsync.PullTimeoutError, OSError: varsync.BackendConnectionError},
            varsync.PullTimeoutError,
        ),
        (
            {OSError: varsync.BackendConnectionError, TimeoutError: varsync.PullTimeoutError},
            varsync.BackendConnectionError,
        ),
    ],
    ids=["subclass-listed-first", "base-listed-first"],
)
def test_translate_errors_uses_the_first_matching_entry(mapping, expected):
    with pytest.raises(varsync.VarsyncError) as caught:
        with translate_errors(mapping, ADDRESS):
            raise TimeoutError("timed out")  # an OSError too: both entries match

    assert type(caught.value) is expected


def test_translate_errors_passes_varsync_errors_through_unchanged():
    original = varsync.SignatureMismatchError("leaf 'w' has shape (3,), expected (2,)")

    with pytest.raises(varsync.SignatureMismatchError) as caught:
        # SignatureMismatchError is a ValueError, yet it is not re-wrapped.
        with translate_errors({ValueError: varsync.CorruptDataError}, ADDRESS):
            raise original

    assert caught.value is original
    assert str(caught.value) == "leaf 'w' has shape (3,), expected (2,)"


@pytest.mark.parametrize("original", [KeyError("k"), KeyboardInterrupt()], ids=type)
def test_translate_errors_passes_unmapped_exceptions_through_unchanged(original):
    with pytest.raises(type(original)) as caught:
        with translate_errors({OSError: varsync.BackendConnectionError}, ADDRESS):
            raise original

    assert caught.value is original
    assert caught.value.__cause__ is None


def test_translate_errors_does_not_catch_base_exceptions_for_an_exception_entry():
    with pytest.raises(KeyboardInterrupt):
        with translate_errors({Exception: varsync.BackendConnectionError}, ADDRESS):
            raise KeyboardInterrupt


def test_translate_errors_lets_a_block_without_errors_finish():
    done = []
    with translate_errors({OSError: varsync.BackendConnectionError}, ADDRESS):
        done.append(True)

    assert done == [True]
