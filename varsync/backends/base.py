"""Deprecated: ``varsync.backends.base`` is now ``varsync._backends.base``, private since
varsync 0.3 (removed in 0.4). Import from :mod:`varsync.backend` instead.

0.1 and 0.2 plugins imported the protocol from here; the 0.2 names that protocol 1 dropped
(``Snapshot``, ``LeafSnapshot``, ``read_snapshot``, ``wait_for_change``) are served from
``varsync._backends.legacy`` with a warning of their own.
"""

import warnings as _warnings
from typing import Any as _Any

from varsync._backends.base import *  # noqa: F403
from varsync._backends.base import __all__  # noqa: F401

_warnings.warn(
    "varsync.backends.base is private since varsync 0.3 (now varsync._backends.base) and is "
    "removed in 0.4: import from varsync.backend",
    DeprecationWarning,
    stacklevel=2,
)

_LEGACY_NAMES = ("Snapshot", "LeafSnapshot", "read_snapshot", "wait_for_change")


def __getattr__(name: str) -> _Any:
    if name in _LEGACY_NAMES:
        from varsync._backends import legacy

        _warnings.warn(
            f"varsync.backends.base.{name} is the 0.2 protocol's, deprecated in 0.3 and "
            "removed in 0.4 (docs/plugins.md, 'Porting a 0.2 backend')",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(legacy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
