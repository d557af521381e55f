"""Deprecated: ``varsync.metrics`` is now ``varsync._metrics``, private since varsync 0.3
(removed in 0.4). Import from :mod:`varsync` (users) or :mod:`varsync.backend` (plugin
authors) instead.
"""

import warnings as _warnings

from varsync._metrics import *  # noqa: F403
from varsync._metrics import __all__  # noqa: F401

_warnings.warn(
    "varsync.metrics is private since varsync 0.3 (now varsync._metrics) and is removed in 0.4: "
    "import from varsync or varsync.backend",
    DeprecationWarning,
    stacklevel=2,
)
