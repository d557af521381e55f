"""Deprecated: ``varsync.server_wait`` is now ``varsync._server_wait``,
private since varsync 0.3 (removed in 0.4). Import from :mod:`varsync` (users) or
:mod:`varsync.backend` (plugin authors) instead.
"""

import warnings as _warnings

from varsync._server_wait import *  # noqa: F403
from varsync._server_wait import __all__  # noqa: F401

_warnings.warn(
    "varsync.server_wait is private since varsync 0.3 (now varsync._server_wait) "
    "and is removed in 0.4: "
    "import from varsync or varsync.backend",
    DeprecationWarning,
    stacklevel=2,
)
