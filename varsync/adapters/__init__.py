"""Deprecated: ``varsync.adapters`` is now ``varsync._adapters``, private since varsync 0.3
(removed in 0.4). Import from :mod:`varsync` (users) or :mod:`varsync.backend` (plugin
authors) instead.
"""

import warnings as _warnings

from varsync._adapters import *  # noqa: F403
from varsync._adapters import __all__  # noqa: F401

_warnings.warn(
    "varsync.adapters is private since varsync 0.3 (now varsync._adapters) and is removed in 0.4: "
    "import from varsync or varsync.backend",
    DeprecationWarning,
    stacklevel=2,
)
