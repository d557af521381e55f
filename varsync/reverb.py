"""Deprecated: ``varsync.reverb`` is now ``varsync.reverb_server``,
private since varsync 0.3 (removed in 0.4). Import from :mod:`varsync` (users) or
:mod:`varsync.backend` (plugin authors) instead.
"""

import warnings as _warnings

from varsync.reverb_server import *  # noqa: F403
from varsync.reverb_server import __all__  # noqa: F401

_warnings.warn(
    "varsync.reverb is private since varsync 0.3 (now varsync.reverb_server) "
    "and is removed in 0.4: "
    "import from varsync or varsync.backend",
    DeprecationWarning,
    stacklevel=2,
)
