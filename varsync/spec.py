"""Deprecated: ``varsync.spec`` is now ``varsync._spec``, private since varsync 0.3
(removed in 0.4). Import from :mod:`varsync` (users) or :mod:`varsync.backend` (plugin
authors) instead.
"""

import warnings as _warnings

from varsync._spec import *  # noqa: F403
from varsync._spec import __all__  # noqa: F401

_warnings.warn(
    "varsync.spec is private since varsync 0.3 (now varsync._spec) and is removed in 0.4: "
    "import from varsync or varsync.backend",
    DeprecationWarning,
    stacklevel=2,
)
